// How the native TCP NIC thread copies registered memory into a READ response, and a WRITE's data
// into registered memory: aligned 8-byte atomic loads (stores) in ascending address order, so a
// reader's consistency check (CoRM slot versions, docs/objects.md "Writer and reader protocols")
// sees words in the order writers published them, and a thread of the memory's owner that polls
// a word with acquire loads sees a remote write's words whole and in order (docs/transport.md,
// "Placement of one-sided writes").
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace farmem::tcpwire {

// Copies `len` bytes from `src` to `dst` (which may be unaligned; the ranges must not overlap).
// When `src` and `len` are multiples of 8, every source word is read once, in ascending address
// order, with a seq_cst load (std::atomic_ref; on x86 and ARMv8 the same instruction as an
// acquire load), so:
//   - a word is never torn by a concurrent aligned 64-bit store;
//   - if the copy saw a word stored by a writer before that writer's release store of a
//     higher-addressed word, it also sees everything the writer stored before (acquire/release),
//     which is what makes the CoRM tail-version check sound;
//   - the loads are not a data race in the C++ model (TSan stays quiet against atomic writers).
//   - a memory owner's grace period (common/copy_epoch.h) orders them against its seq_cst marker
//     store: a copy that loaded a CoRM header before the compaction bits were set ends before the
//     block is remapped (seq_cst, not acquire, is what that argument needs).
// glibc memcpy gives none of this: it copies with vector loads, from both ends inward for some
// sizes. Other shapes (unaligned source or length) are copied with memcpy: no object slot is
// read that way.
// Returns true when the ordered word path was used (for tests).
inline bool CopyForRead(void* dst, const void* src, size_t len) {
  if (((reinterpret_cast<uintptr_t>(src) | len) & 7u) != 0) {
    if (len != 0) std::memcpy(dst, src, len);
    return false;
  }
  // atomic_ref needs a non-const object; the memory is only loaded from.
  auto* s = const_cast<uint64_t*>(static_cast<const uint64_t*>(src));
  auto* d = static_cast<unsigned char*>(dst);
  size_t left = len / 8;
  // Four loads per iteration keep the loop overhead off the hot path (4 KiB reads); the loads
  // themselves stay in program order (seq_cst loads are not reordered with later loads).
  while (left >= 4) {
    const uint64_t w0 = std::atomic_ref<uint64_t>(s[0]).load(std::memory_order_seq_cst);
    const uint64_t w1 = std::atomic_ref<uint64_t>(s[1]).load(std::memory_order_seq_cst);
    const uint64_t w2 = std::atomic_ref<uint64_t>(s[2]).load(std::memory_order_seq_cst);
    const uint64_t w3 = std::atomic_ref<uint64_t>(s[3]).load(std::memory_order_seq_cst);
    std::memcpy(d, &w0, 8);
    std::memcpy(d + 8, &w1, 8);
    std::memcpy(d + 16, &w2, 8);
    std::memcpy(d + 24, &w3, 8);
    s += 4;
    d += 32;
    left -= 4;
  }
  while (left != 0) {
    const uint64_t w = std::atomic_ref<uint64_t>(*s).load(std::memory_order_seq_cst);
    std::memcpy(d, &w, 8);
    ++s;
    d += 8;
    --left;
  }
  return true;
}

// TEST ONLY (FARMEM_TRANSPORT_FAULT=write_descending in the tests that read it): CopyForWrite
// stores the words from the last to the first, which removes the ascending order the placement
// guarantee promises (a legal memcpy may do that).
inline std::atomic<bool> g_write_descending{false};

// Copies `len` bytes from `src` (any alignment) into registered memory at `dst` (the ranges must
// not overlap). When `dst` and `len` are multiples of 8, every destination word is written once,
// in ascending address order, with a release store (std::atomic_ref), so:
//   - a word is never torn for a concurrent aligned 64-bit load;
//   - a thread that acquire-loads a word and sees this copy's value also sees every lower word of
//     it and everything the copying thread (the NIC thread) stored before, e.g. earlier writes of
//     the same connection (on x86 and ARMv8 a release store is a plain store, resp. stlr);
//   - the stores are not a data race with atomic readers (TSan stays quiet).
// Other shapes are copied with memcpy. Returns true when the ordered word path was used.
inline bool CopyForWrite(void* dst, const void* src, size_t len) {
  if (((reinterpret_cast<uintptr_t>(dst) | len) & 7u) != 0) {
    if (len != 0) std::memcpy(dst, src, len);
    return false;
  }
  auto* d = static_cast<uint64_t*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  const size_t words = len / 8;
  if (g_write_descending.load(std::memory_order_relaxed)) {
    for (size_t i = words; i-- > 0;) {
      uint64_t w;
      std::memcpy(&w, s + 8 * i, 8);
      std::atomic_ref<uint64_t>(d[i]).store(w, std::memory_order_release);
    }
    return true;
  }
  for (size_t i = 0; i < words; ++i) {
    uint64_t w;
    std::memcpy(&w, s + 8 * i, 8);
    std::atomic_ref<uint64_t>(d[i]).store(w, std::memory_order_release);
  }
  return true;
}

}  // namespace farmem::tcpwire
