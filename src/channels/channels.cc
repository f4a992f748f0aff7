// The channels built on Channel endpoints: OwnedBytes, AtomicVar, Barrier, TicketLock. A handle is
// used by one thread at a time; the owner's copy of an OwnedBytes is also read by the transport's
// progress thread (pulls) and by other local threads (loads), with 8-byte atomic accesses.
//
// AtomicVar: one word in its home's slice. Barrier: sub-channel "<name>/sst", one u64 row per
// member on every member. TicketLock: {next_ticket, now_serving} in its home's 16-byte slice.
// OwnedBytes copy layout (every member's slice): word 0 = seq (0 = never stored), words 1..n =
// the value padded to words, word n+1 = checksum of (seq, value words). Pushes overwrite a reader's
// copy with one transport write; a reader that sees a copy half old, half new finds the checksum
// wrong and reads again.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <thread>

#include "channels/channel_wire.h"
#include "channels/channels_faults.h"
#include "channels/manager_impl.h"

namespace farmem::channels {

using Clock = std::chrono::steady_clock;

using detail::Checksum;
using detail::LoadWord;
using detail::StoreWord;

namespace {
// A spin-wait hint to the CPU (x86 PAUSE, ARM YIELD): cheaper polling, kinder to a sibling thread.
inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}
}  // namespace

// ---- OwnedBytes --------------------------------------------------------------------------------

Result<OwnedBytes> OwnedBytes::Open(ChannelThread& thread, std::string name, NodeId owner,
                                    std::vector<NodeId> members, size_t size) {
  if (size == 0) return Status::InvalidArgument("owned var: size 0");
  bool owner_member = false;
  for (NodeId m : members) owner_member |= m == owner;
  if (!owner_member) return Status::InvalidArgument("owned var: owner is not a member");
  OwnedBytes v;
  v.owner_ = owner;
  v.size_ = size;
  v.words_ = (size + 7) / 8;
  auto ch = Channel::Open(thread, std::move(name), std::move(members), 8 * (v.words_ + 2));
  if (!ch.ok()) return ch.status();
  v.ch_ = std::move(*ch);
  return v;
}

Status OwnedBytes::store(const void* value) {
  if (ch_.members().empty()) return Status::FailedPrecondition("owned var: not open");
  // Only the owner node writes its copy (one thread at a time: single writer).
  std::vector<uint64_t> words(words_, 0);
  std::memcpy(words.data(), value, size_);
  seq_++;
  std::byte* slot = ch_.local_slice();
  StoreWord(slot, seq_);
  for (size_t i = 0; i < words_; i++) StoreWord(slot + 8 * (i + 1), words[i]);
  StoreWord(slot + 8 * (words_ + 1), Checksum(seq_, words.data(), words_));
  return Status::OK();
}

Result<AckKey> OwnedBytes::push(ChannelThread& thread) {
  if (thread.manager().self() != owner_) {
    return Status::FailedPrecondition("owned var '" + ch_.name() + "': only the owner pushes");
  }
  std::vector<uint64_t> copy(words_ + 2);
  for (size_t i = 0; i < copy.size(); i++) copy[i] = LoadWord(ch_.local_slice() + 8 * i);
  AckKey all;
  for (NodeId m : ch_.members()) {
    if (m == owner_) continue;
    auto off = ch_.slice_offset(m);
    if (!off.ok()) return off.status();
    auto key = thread.write(m, *off, copy.data(), copy.size() * 8);
    if (!key.ok()) return key.status();
    all |= *key;
  }
  return all;
}

Status OwnedBytes::decode(const uint64_t* copy, void* out, bool* ok) const {
  *ok = true;
  if (copy[0] == 0) {
    std::memset(out, 0, size_);
    return Status::OK();
  }
  if (!g_owned_checksum_disabled.load(std::memory_order_relaxed) &&
      copy[words_ + 1] != Checksum(copy[0], copy + 1, words_)) {
    *ok = false;
    return Status::OK();
  }
  std::memcpy(out, copy + 1, size_);
  return Status::OK();
}

Status OwnedBytes::load(ChannelThread& thread, void* out) {
  std::vector<uint64_t> copy(words_ + 2);
  const auto deadline = Clock::now() + thread.manager().impl().op_timeout();
  const NodeId self = thread.manager().self();
  for (;;) {
    if (self == owner_) {
      for (size_t i = 0; i < copy.size(); i++) copy[i] = LoadWord(ch_.local_slice() + 8 * i);
    } else {
      // The cache is written by the transport on behalf of the owner's pushes: read it through
      // the transport too, so the copy never races with the transport's own (non-atomic) writes.
      Status st = thread.read_sync(self, *ch_.slice_offset(self), copy.data(), copy.size() * 8);
      if (!st.ok()) return st;
    }
    bool ok = false;
    Status st = decode(copy.data(), out, &ok);
    if (!st.ok() || ok) return st;
    if (Clock::now() >= deadline) {
      return Status::TimedOut("owned var '" + ch_.name() + "': copy kept failing its checksum");
    }
  }
}

Status OwnedBytes::pull(ChannelThread& thread, void* out) {
  auto off = ch_.slice_offset(owner_);
  if (!off.ok()) return off.status();
  std::vector<uint64_t> copy(words_ + 2);
  const auto deadline = Clock::now() + thread.manager().impl().op_timeout();
  for (;;) {
    Status st = thread.read_sync(owner_, *off, copy.data(), copy.size() * 8);
    if (!st.ok()) return st;
    bool ok = false;
    st = decode(copy.data(), out, &ok);
    if (!st.ok() || ok) return st;
    if (Clock::now() >= deadline) {
      return Status::TimedOut("owned var '" + ch_.name() + "': copy kept failing its checksum");
    }
  }
}

// ---- AtomicVar ---------------------------------------------------------------------------------

Result<AtomicVar> AtomicVar::Open(ChannelThread& thread, std::string name, NodeId home,
                                  std::vector<NodeId> members) {
  bool home_member = false;
  for (NodeId m : members) home_member |= m == home;
  if (!home_member) return Status::InvalidArgument("atomic var: home is not a member");
  AtomicVar v;
  v.home_ = home;
  auto ch = Channel::Open(thread, std::move(name), std::move(members), 8);
  if (!ch.ok()) return ch.status();
  v.ch_ = std::move(*ch);
  return v;
}

Result<AckKey> AtomicVar::fetch_add_async(ChannelThread& thread, uint64_t add,
                                          uint64_t* old_value) {
  auto off = ch_.slice_offset(home_);
  if (!off.ok()) return off.status();
  return thread.fetch_add(home_, *off, add, old_value);
}

Result<uint64_t> AtomicVar::fetch_add(ChannelThread& thread, uint64_t add) {
  uint64_t old = 0;
  auto key = fetch_add_async(thread, add, &old);
  if (!key.ok()) return key.status();
  Status st = thread.wait(*key, thread.manager().impl().op_timeout() + std::chrono::seconds(1));
  if (!st.ok()) return st;
  return old;
}

Result<uint64_t> AtomicVar::compare_swap(ChannelThread& thread, uint64_t expected,
                                         uint64_t desired) {
  auto off = ch_.slice_offset(home_);
  if (!off.ok()) return off.status();
  uint64_t old = 0;
  auto key = thread.compare_swap(home_, *off, expected, desired, &old);
  if (!key.ok()) return key.status();
  Status st = thread.wait(*key, thread.manager().impl().op_timeout() + std::chrono::seconds(1));
  if (!st.ok()) return st;
  return old;
}

Result<uint64_t> AtomicVar::load(ChannelThread& thread) {
  auto off = ch_.slice_offset(home_);
  if (!off.ok()) return off.status();
  uint64_t v = 0;
  Status st = thread.read_sync(home_, *off, &v, 8);
  if (!st.ok()) return st;
  return v;
}

// ---- Barrier -----------------------------------------------------------------------------------

Result<Barrier> Barrier::Open(ChannelThread& thread, std::string name,
                              std::vector<NodeId> members) {
  Barrier b;
  b.ordered_ = thread.manager().node().transport().name() == "tcp";
  // Native TCP places aligned writes with ascending release word stores and one thread's writes to
  // a peer in order (docs/transport.md): the own table can be polled with local loads.
  b.local_rows_ = b.ordered_;
  auto ch = Channel::Open(thread, std::move(name), std::move(members), 8);
  if (!ch.ok()) return ch.status();
  b.ch_ = std::move(*ch);
  auto sst = b.ch_.Sub(thread, "sst", 8 * b.ch_.members().size());
  if (!sst.ok()) return sst.status();
  b.sst_ = std::move(*sst);
  return b;
}

Status Barrier::arrive_and_wait(ChannelThread& thread, std::chrono::milliseconds timeout) {
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  const auto left = [&] {
    return std::max(std::chrono::milliseconds(1),
                    std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
  };
  const auto& members = sst_.members();
  const NodeId self = thread.manager().self();
  size_t me = 0;
  while (members[me] != self) me++;
  auto context = [&](const Status& st) {
    return st.WithContext("barrier '" + ch_.name() + "' episode " + std::to_string(episode_));
  };
  // The previous episode's arrivals: their errors are this call's. Where the transport places
  // one thread's writes to a peer in order (native TCP), the new arrival may follow them before
  // they completed; elsewhere they must be placed first (a late one would lower the row again).
  if (!arrivals_.empty()) {
    if (!ordered_ || thread.query(arrivals_)) {
      Status st = thread.wait(arrivals_, left());
      arrivals_ = AckKey();
      if (!st.ok()) return context(st);
    }
  }
  // Release: whatever this thread wrote through channels before is placed before we arrive.
  Status st = thread.fence_thread_except(arrivals_, timeout);
  if (!st.ok()) return st;
  episode_++;
  // Arrive: the episode into this node's row of every other member's table, not waited for (a
  // member leaves once it sees the row in its own memory).
  for (NodeId m : members) {
    if (m == self) continue;
    auto off = sst_.slice_offset(m);
    if (!off.ok()) return off.status();
    auto key = thread.write(m, *off + 8 * me, &episode_, 8);
    if (!key.ok()) return context(key.status());
    arrivals_ |= *key;
  }
  thread.poll();  // sends them
  if (g_barrier_wait_disabled.load(std::memory_order_relaxed)) return Status::OK();
  const std::byte* rows = sst_.local_slice();
  std::vector<uint64_t> copy(members.size());
  const uint64_t own = *sst_.slice_offset(self);
  // Every row but ours at the episode, or one more (a fast member may be in the next episode
  // already; it cannot leave that one before we arrive, so never two more). Exact values, not >=:
  // where a row is read through a transport that may copy a word in pieces (fabric), a word half
  // old (episode - 1) and half new (episode) equals the episode only if every byte that differs
  // is new, and never equals episode + 1 (its low byte differs from both): a torn read only
  // delays the exit, it never makes it early.
  auto arrived = [&](std::string* missing) -> Result<bool> {
    if (local_rows_) {
      for (size_t i = 0; i < members.size(); i++) copy[i] = detail::LoadWord(rows + 8 * i);
    } else {
      // The transport gives no word-atomic placement here: read the table through it.
      Status rs = thread.read_sync(self, own, copy.data(), copy.size() * 8);
      if (!rs.ok()) return rs;
    }
    bool all = true;
    for (size_t i = 0; i < members.size(); i++) {
      if (i == me || copy[i] == episode_ || copy[i] == episode_ + 1) continue;
      all = false;
      if (missing != nullptr) {
        *missing += (missing->empty() ? "" : ",") + std::to_string(members[i]);
      }
    }
    return all;
  };
  // Waiting without taking the CPU from the threads that must run for the episode to end (this
  // machine's NIC threads placing the arrivals, the other members' barrier threads): a few checks
  // back to back, then sched_yield between checks (this thread runs only when nothing else is
  // runnable), and after kYieldFor sleeps (a member far behind costs no CPU).
  constexpr int kSpinChecks = 16;
  constexpr auto kYieldFor = std::chrono::milliseconds(2);
  constexpr auto kSleep = std::chrono::microseconds(50);
  for (uint64_t round = 0;; round++) {
    auto done = arrived(nullptr);
    if (!done.ok()) return context(done.status());
    if (*done) {
      // Our arrivals are not waited for, but they must leave: a transport may hold a post until
      // this thread polls again (a connection still being made, a post libfabric refused for
      // now), and the caller may not touch channels for a while once it has left; the members
      // waiting for its arrival would time out meanwhile.
      Status fs = thread.flush(left());
      if (!fs.ok()) return context(fs);
      return Status::OK();
    }
    // A member that is gone: our arrival write to it fails (reported now, not at the deadline).
    if (round % 8 == 0 && !arrivals_.empty() && thread.query(arrivals_)) {
      Status ws = thread.wait(arrivals_, std::chrono::milliseconds(0));
      arrivals_ = AckKey();
      if (!ws.ok()) return context(ws);
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      std::string missing;
      (void)arrived(&missing);
      return Status::TimedOut("barrier '" + ch_.name() + "' episode " + std::to_string(episode_) +
                              ": nodes " + missing + " did not arrive within " +
                              std::to_string(timeout.count()) + " ms");
    }
    if (round < kSpinChecks) {
      for (int i = 0; i < 16; i++) CpuRelax();
    } else if (now - start < kYieldFor) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(kSleep);
    }
  }
}

// ---- TicketLock --------------------------------------------------------------------------------

Result<TicketLock> TicketLock::Open(ChannelThread& thread, std::string name, NodeId home,
                                    std::vector<NodeId> members) {
  bool home_member = false;
  for (NodeId m : members) home_member |= m == home;
  if (!home_member) return Status::InvalidArgument("ticket lock: home is not a member");
  TicketLock l;
  l.home_ = home;
  auto ch = Channel::Open(thread, std::move(name), std::move(members), 16);
  if (!ch.ok()) return ch.status();
  l.ch_ = std::move(*ch);
  return l;
}

Status TicketLock::lock(ChannelThread& thread, std::chrono::milliseconds timeout,
                        uint64_t* ticket) {
  auto off = ch_.slice_offset(home_);
  if (!off.ok()) return off.status();
  return detail::TicketAcquire(thread, home_, *off, timeout, "ticket lock '" + ch_.name() + "'",
                               ticket);
}

Status TicketLock::unlock(ChannelThread& thread, std::chrono::milliseconds timeout) {
  auto off = ch_.slice_offset(home_);
  if (!off.ok()) return off.status();
  return detail::TicketRelease(thread, home_, *off, timeout, "ticket lock '" + ch_.name() + "'",
                               /*fence=*/true);
}

namespace detail {

Status TicketAcquire(ChannelThread& thread, NodeId home, uint64_t offset,
                     std::chrono::milliseconds timeout, const std::string& what, uint64_t* ticket,
                     uint64_t* serving_word) {
  const auto deadline = Clock::now() + timeout;
  const auto op_wait = thread.manager().impl().op_timeout() + std::chrono::seconds(1);
  uint64_t t = 0;
  auto key = thread.fetch_add(home, offset, 1, &t);
  if (!key.ok()) return key.status();
  Status st = thread.wait(*key, op_wait);
  if (!st.ok()) return st.WithContext(what);
  if (ticket != nullptr) *ticket = t;
  if (g_lock_wait_disabled.load(std::memory_order_relaxed)) return Status::OK();
  for (;;) {
    uint64_t word = 0;
    st = thread.read_sync(home, offset + 8, &word, 8);
    if (!st.ok()) return st.WithContext(what);
    const uint64_t serving = word & wire::kServingTicketMask;
    if (serving == t) {
      if (serving_word != nullptr) *serving_word = word;
      return Status::OK();
    }
    if (Clock::now() >= deadline) {
      return Status::TimedOut(what + ": ticket " + std::to_string(t) + " not served within " +
                              std::to_string(timeout.count()) + " ms (now serving " +
                              std::to_string(serving) + ")");
    }
    // Proportional backoff: each holder ahead costs at least a round trip.
    const uint64_t ahead = t > serving ? t - serving : 1;
    std::this_thread::sleep_for(std::chrono::microseconds(std::min<uint64_t>(ahead * 5, 200)));
  }
}

Status TicketRelease(ChannelThread& thread, NodeId home, uint64_t offset,
                     std::chrono::milliseconds timeout, const std::string& what, bool fence,
                     uint64_t add) {
  if (fence) {
    // Release: the critical section's channel writes are placed before the next holder is served.
    Status st = thread.fence_thread(timeout);
    if (!st.ok()) return st.WithContext(what + " release fence");
  }
  uint64_t old = 0;
  auto key = thread.fetch_add(home, offset + 8, add, &old);
  if (!key.ok()) return key.status();
  Status st = thread.wait(*key, thread.manager().impl().op_timeout() + std::chrono::seconds(1));
  if (!st.ok()) return st.WithContext(what);
  return Status::OK();
}

}  // namespace detail

}  // namespace farmem::channels
