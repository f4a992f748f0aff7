// TxDsParticipant (farmem/tx_ds.h): a user data structure's owner as a prepared participant of
// multi-participant commits — TwoPhaseParticipant (tx_two_phase.h) over the owner's
// TxDsPreparedWrites. prepare / decide run on the owner's RPC threads, recover on the recovery
// thread (or the caller's), stats from any thread.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "farmem/node.h"
#include "farmem/tx_ds.h"
#include "tx/format/tx_layout.h"
#include "tx/format/tx_wire.h"
#include "tx/service/tx_two_phase.h"

namespace farmem {
namespace wire = tx_wire;

struct TxDsParticipant::Impl final : tx::TwoPhaseWrites {
  explicit Impl(TxDsPreparedWrites& w) : user(w) {}
  ~Impl() override {
    {
      std::lock_guard lock(mu);
      stopping = true;
    }
    cv.notify_all();
    if (recovery.joinable()) recovery.join();
  }

  static std::vector<TxDsBatchItem> Items(std::span<const wire::TwoPhaseEntry> items) {
    std::vector<TxDsBatchItem> out;
    out.reserve(items.size());
    for (const wire::TwoPhaseEntry& e : items) {
      out.push_back({static_cast<TxDsOp>(e.op), e.key,
                     e.op == wire::kWrite ? e.value : std::span<const std::byte>()});
    }
    return out;
  }

  // The decoder checked each item's op, key and value lengths; the key rule of every user data
  // structure (8..64 bytes, a multiple of 8: TxClient refuses others) is checked here.
  Status Check(std::span<const wire::TwoPhaseEntry> items) override {
    for (const wire::TwoPhaseEntry& e : items) {
      if (e.key.size() < tx::kMinKeySize || e.key.size() > tx::kMaxKeySize ||
          e.key.size() % 8 != 0) {
        return Status::Protocol("TX_DS_PREPARE: a key of " + std::to_string(e.key.size()) +
                                " bytes (8..64, a multiple of 8)");
      }
      if (e.op != wire::kWrite && e.op != wire::kRemove) {
        return Status::Protocol("TX_DS_PREPARE: an item neither a write nor a remove");
      }
    }
    return Status::OK();
  }
  Status Pin(uint64_t txid, std::span<const wire::TwoPhaseEntry> items) override {
    const std::vector<TxDsBatchItem> converted = Items(items);
    return user.pin(txid, converted);
  }
  void Apply(uint64_t txid, std::span<const wire::TwoPhaseEntry> items, bool commit) override {
    const std::vector<TxDsBatchItem> converted = Items(items);
    user.apply(txid, converted, commit);
  }

  void RecoveryLoop(std::chrono::nanoseconds period) {
    std::unique_lock lock(mu);
    while (!stopping) {
      cv.wait_for(lock, period, [this] { return stopping; });
      if (stopping) break;
      lock.unlock();
      {
        std::lock_guard one(recover_mu);
        core->Recover();
      }
      lock.lock();
    }
  }

  TxDsPreparedWrites& user;
  std::unique_ptr<tx::TwoPhaseParticipant> core;
  std::mutex recover_mu;  // Recover: one caller at a time (the thread, or recover())
  std::mutex mu;          // guards stopping
  std::condition_variable cv;
  bool stopping = false;
  std::thread recovery;
};

Result<std::unique_ptr<TxDsParticipant>> TxDsParticipant::Create(Node& node,
                                                                 TxDsPreparedWrites& writes,
                                                                 TxDsParticipantOptions options) {
  if (options.max_lease_ns == 0) {
    return Status::InvalidArgument("TxDsParticipant: max_lease_ns must be > 0");
  }
  std::unique_ptr<TxDsParticipant> p(new TxDsParticipant());
  p->impl_ = std::make_unique<Impl>(writes);
  tx::TwoPhaseOptions two_phase;
  two_phase.now_ns = std::move(options.now_ns);
  two_phase.max_lease_ns = options.max_lease_ns;
  two_phase.self = std::string(wire::kDsParticipantPrefix) + node.bootstrap_address();
  p->impl_->core = std::make_unique<tx::TwoPhaseParticipant>(
      node, static_cast<tx::TwoPhaseWrites&>(*p->impl_), std::move(two_phase));
  if (options.recovery_thread) {
    const auto period = std::chrono::nanoseconds(std::max<uint64_t>(1, options.max_lease_ns / 2));
    Impl* impl = p->impl_.get();
    p->impl_->recovery = std::thread([impl, period] { impl->RecoveryLoop(period); });
  }
  return p;
}

TxDsParticipant::~TxDsParticipant() = default;

Status TxDsParticipant::prepare(std::span<const std::byte> request) {
  return impl_->core->Prepare(request);
}

Status TxDsParticipant::decide(std::span<const std::byte> request) {
  FARMEM_ASSIGN_OR_RETURN(wire::TwoPhaseRequest req, wire::DecodeTwoPhaseRequest(request, false));
  if (req.num_participants != 0 || !req.items.empty()) {
    // The keeper of the decision is always a farmemd tx server (TX_PREPARE refuses a list whose
    // entry 0 is a data structure's owner): a first participant's decide never comes here.
    return Status::Protocol(
        "TX_DS_DECIDE: a first participant's decide (items or num_participants); a data "
        "structure's owner is only ever a prepared participant");
  }
  return impl_->core->DecidePrepared(req.txid, req.decision == wire::kDecideCommit);
}

void TxDsParticipant::recover() {
  std::lock_guard one(impl_->recover_mu);
  impl_->core->Recover();
}

TxDsParticipantStats TxDsParticipant::stats() const {
  const tx::TwoPhaseCounters& c = impl_->core->counters();
  const auto ld = [](const std::atomic<uint64_t>& a) { return a.load(std::memory_order_relaxed); };
  TxDsParticipantStats s;
  s.prepares = ld(c.prepares);
  s.decides = ld(c.decides);
  s.prepared = impl_->core->prepared();
  s.recovered_commits = ld(c.recovered_commits);
  s.recovered_aborts = ld(c.recovered_aborts);
  s.recovery_unreachable = ld(c.recovery_unreachable);
  return s;
}

}  // namespace farmem
