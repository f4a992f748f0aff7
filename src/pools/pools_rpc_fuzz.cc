// libFuzzer target for the raw allocator RPCs (pools_wire.h): a sequence of ALLOC_RAW / FREE_RAW
// request bodies, of any size and content, goes through the pools service's own handlers
// (ServeAllocRaw / ServeFreeRaw) against a real PoolSet of small memfd pools, exactly as RPC
// workers run them, minus the network.
// Beyond "no crash", a shadow model of the live allocations checks every answer: a request of the
// wrong size is a Protocol error; a granted range decodes from a reply of exactly
// sizeof(AllocRawReply), is 64-byte aligned, at least as long as asked, inside a pool that exists
// and disjoint from every live range (and its first and last bytes are writable); FREE_RAW frees
// exactly the live ranges, returns their length, and refuses everything else without changing
// anything; error replies are empty; the pools' statistics agree with the model.
// Sessions (docs/sessions.md): an ALLOC_RAW naming session 0 is persistent; session id 1 in the
// input stands for the harness's open session (the fuzzer cannot guess a random id), any other is
// refused with NotFound; ending the session frees exactly the live ranges it owns (the model
// drops them), never one freed before — no double free, no leak (owned counts checked).
// Built with -DFARMEM_FUZZ=ON (scripts/test --fuzz).
//
// Input: a list of operations, each an opcode byte and (for the first two kinds) a length byte
// and that many request bytes:
//   op % 4 == 0  ALLOC_RAW with the raw request bytes that follow
//   op % 4 == 1  FREE_RAW with the raw request bytes that follow
//   op % 4 == 2  FREE_RAW of live allocation number (next byte), offset moved by op / 4 - 16 bytes
//   op % 4 == 3  compare the pools' statistics with the model; op / 4 odd: first end the session
//                (SESSION_CLOSE path: the pools' end listener) and open a new one
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <iterator>
#include <map>
#include <set>
#include <span>
#include <utility>
#include <vector>

#include "common/fuzz_support.h"
#include "pools/pool_set.h"
#include "pools/pools_service.h"
#include "pools/pools_wire.h"
#include "pools/raw_owners.h"
#include "service/session_registry.h"

namespace {

using namespace farmem;
namespace proto = farmem::server_proto;

constexpr uint64_t kPoolBytes = 64 << 10;
constexpr uint64_t kPools = 4;

struct Reader {
  std::span<const uint8_t> in;
  bool empty() const { return in.empty(); }
  uint8_t byte() {
    if (in.empty()) return 0;
    const uint8_t b = in[0];
    in = in.subspan(1);
    return b;
  }
  std::span<const std::byte> bytes(size_t n) {
    n = std::min(n, in.size());
    auto out = std::as_bytes(in.first(n));
    in = in.subspan(n);
    return out;
  }
};

class Harness {
 public:
  Harness() {
    auto made = PoolSet::Create(kPools * kPoolBytes, kPoolBytes,
                                [this](const std::string&, void*, size_t) -> Result<RegionKey> {
                                  // Keys as a transport hands them out: unrelated to the index.
                                  return RegionKey{0x5eed0000ull + 7 * next_key_++};
                                });
    FUZZ_CHECK(made.ok());
    pools_ = std::move(*made);
    owners_ = std::make_unique<RawOwners>(*pools_);
    sessions_.add_end_listener([this](SessionIndex i) { return owners_->free_owned(i); });
    OpenSession();
  }

  void OpenSession() {
    auto g = sessions_.open(std::chrono::seconds(60), "fuzz");
    FUZZ_CHECK(g.ok() && g->id != 0);
    session_ = g->id;
  }

  // Ends the session: its live ranges must be freed, and only those.
  void EndSession() {
    auto freed = sessions_.close(session_);
    FUZZ_CHECK(freed.ok());
    uint64_t bytes = 0;
    for (auto& pool : live_) {
      const uint64_t key = pool.first;
      std::erase_if(pool.second, [&](const auto& r) {
        if (!owned_.contains({key, r.first})) return false;
        bytes += r.second;
        return true;
      });
    }
    owned_.clear();
    FUZZ_CHECK(freed->raw_bytes == bytes);
    OpenSession();
  }

  void Alloc(std::span<const std::byte> input) {
    std::vector<std::byte> request(input.begin(), input.end());
    uint64_t session = 0;
    if (request.size() == sizeof(proto::AllocRawRequest)) {
      std::memcpy(&session, request.data() + 8, sizeof(session));
      if (session == 1) {
        session = session_;
        std::memcpy(request.data() + 8, &session, sizeof(session));
      }
    }
    std::vector<std::byte> reply;
    const Status st =
        ServeAllocRaw(*owners_, sessions_, RpcCall{proto::kOpAllocRaw, request, "fuzz"}, reply);
    if (request.size() != sizeof(proto::AllocRawRequest)) {
      FUZZ_CHECK(st.code() == Code::kProtocol && reply.empty());
      return;
    }
    if (session != 0 && session != session_) {
      FUZZ_CHECK(st.code() == Code::kNotFound && reply.empty());
      return;
    }
    uint64_t want;
    std::memcpy(&want, request.data(), sizeof(want));
    if (want == 0 || want > kPoolBytes) {
      FUZZ_CHECK(st.code() == Code::kInvalidArgument && reply.empty());
      return;
    }
    if (!st.ok()) {
      FUZZ_CHECK(st.code() == Code::kResourceExhausted && reply.empty());
      // First fit over every pool the budget allows: nothing fits only if no pool can be added
      // and no pool has a free gap of the rounded size between its live ranges.
      FUZZ_CHECK(pools_->pool_count() == kPools);
      const uint64_t size = (want + kRawAlignment - 1) / kRawAlignment * kRawAlignment;
      for (size_t i = 0; i < pools_->pool_count(); ++i) {
        uint64_t at = 0;
        if (auto it = live_.find(pools_->pool(i)->key); it != live_.end()) {
          for (const auto& [off, len] : it->second) {
            FUZZ_CHECK(off - at < size);
            at = off + len;
          }
        }
        FUZZ_CHECK(kPoolBytes - at < size);
      }
      return;
    }
    auto r = proto::Decode<proto::AllocRawReply>(reply);
    FUZZ_CHECK(r.has_value());
    FUZZ_CHECK(r->length >= want && r->length % kRawAlignment == 0 &&
               r->length - want < kRawAlignment);
    FUZZ_CHECK(r->offset % kRawAlignment == 0 && r->offset < kPoolBytes &&
               r->length <= kPoolBytes - r->offset);
    const Pool* pool = PoolByKey(r->key);
    FUZZ_CHECK(pool != nullptr);
    auto& live = live_[r->key];
    auto next = live.lower_bound(r->offset);
    FUZZ_CHECK(next == live.end() || next->first >= r->offset + r->length);
    if (next != live.begin()) {
      auto prev = std::prev(next);
      FUZZ_CHECK(prev->first + prev->second <= r->offset);
    }
    live[r->offset] = r->length;
    if (session != 0) owned_.insert({r->key, r->offset});
    // The range is mapped, writable memory of that pool.
    pool->addr[r->offset] = std::byte{0xa5};
    pool->addr[r->offset + r->length - 1] = std::byte{0x5a};
  }

  void Free(std::span<const std::byte> request) {
    std::vector<std::byte> reply;
    const Status st = ServeFreeRaw(*owners_, RpcCall{proto::kOpFreeRaw, request, "fuzz"}, reply);
    if (request.size() != sizeof(proto::FreeRawRequest)) {
      FUZZ_CHECK(st.code() == Code::kProtocol && reply.empty());
      return;
    }
    proto::FreeRawRequest req;
    std::memcpy(&req, request.data(), sizeof(req));
    auto pool_it = live_.find(req.key);
    const bool known_key = PoolByKey(req.key) != nullptr;
    if (!known_key) {
      FUZZ_CHECK(st.code() == Code::kNotFound && reply.empty());
      return;
    }
    const bool is_live = pool_it != live_.end() && pool_it->second.count(req.offset) != 0;
    if (!is_live) {
      FUZZ_CHECK(st.code() == Code::kInvalidArgument && reply.empty());
      return;
    }
    FUZZ_CHECK(st.ok());
    auto r = proto::Decode<proto::FreeRawReply>(reply);
    FUZZ_CHECK(r.has_value() && r->length == pool_it->second[req.offset]);
    pool_it->second.erase(req.offset);
    owned_.erase({req.key, req.offset});
  }

  // FREE_RAW of a live range (or near it), so frees that succeed are common.
  void FreeLive(uint8_t index, int64_t shift) {
    std::vector<std::pair<uint64_t, uint64_t>> all;
    for (const auto& [key, ranges] : live_) {
      for (const auto& [off, len] : ranges) all.emplace_back(key, off);
    }
    if (all.empty()) return;
    const auto [key, off] = all[index % all.size()];
    const proto::FreeRawRequest req{key, off + static_cast<uint64_t>(shift)};
    Free(proto::Encode(req));
  }

  void CheckStats() const {
    const std::vector<PoolSnapshot> snap = pools_->snapshot();
    FUZZ_CHECK(snap.size() == pools_->pool_count() && snap.size() <= kPools);
    for (size_t i = 0; i < snap.size(); ++i) {
      const Pool* p = pools_->pool(i);
      uint64_t bytes = 0, count = 0;
      if (auto it = live_.find(p->key); it != live_.end()) {
        for (const auto& [off, len] : it->second) {
          bytes += len;
          ++count;
        }
      }
      const RawAllocatorStats& s = snap[i].stats;
      FUZZ_CHECK(snap[i].length == kPoolBytes && s.capacity == kPoolBytes);
      FUZZ_CHECK(s.allocated_bytes == bytes && s.allocations == count);
      FUZZ_CHECK(s.free_bytes == kPoolBytes - bytes && s.largest_free <= s.free_bytes);
      FUZZ_CHECK((s.free_bytes == 0) == (s.free_ranges == 0));
    }
    uint64_t owned_bytes = 0;
    for (const auto& [key, off] : owned_) owned_bytes += live_.at(key).at(off);
    const RawOwners::Owned o = owners_->owned();
    FUZZ_CHECK(o.allocations == owned_.size() && o.bytes == owned_bytes);
  }

 private:
  const Pool* PoolByKey(uint64_t key) const {
    for (size_t i = 0; i < pools_->pool_count(); ++i) {
      if (pools_->pool(i)->key == key) return pools_->pool(i);
    }
    return nullptr;
  }

  uint64_t next_key_ = 0;
  std::unique_ptr<PoolSet> pools_;
  std::unique_ptr<RawOwners> owners_;
  SessionRegistry sessions_;  // no reaper: sessions end only by EndSession
  uint64_t session_ = 0;
  std::set<std::pair<uint64_t, uint64_t>> owned_;  // (key, offset) of live ranges the session owns
  std::map<uint64_t, std::map<uint64_t, uint64_t>> live_;  // key -> offset -> length
};

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  farmem::fuzz::RestoreCrashSignals();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Harness h;
  Reader in{std::span(data, size)};
  for (int ops = 0; !in.empty() && ops < 512; ++ops) {
    const uint8_t op = in.byte();
    switch (op % 4) {
      case 0:
        h.Alloc(in.bytes(in.byte() % 32));
        break;
      case 1:
        h.Free(in.bytes(in.byte() % 32));
        break;
      case 2:
        h.FreeLive(in.byte(), static_cast<int64_t>(op / 4) - 16);
        break;
      case 3:
        if ((op / 4) % 2 == 1) h.EndSession();
        h.CheckStats();
        break;
    }
  }
  h.CheckStats();
  return 0;
}
