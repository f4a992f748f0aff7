// TwoPhaseParticipant (tx_two_phase.h): prepare records, decisions, TX_STATUS and the recovery
// of prepared transactions, for TxService and TxDsParticipant. Handlers on RPC threads, Recover
// on the owner's reaper thread.
#include "tx/service/tx_two_phase.h"

#include <algorithm>
#include <chrono>
#include <string_view>

namespace farmem::tx {
namespace wire = tx_wire;

TwoPhaseParticipant::TwoPhaseParticipant(Node& node, TwoPhaseWrites& writes,
                                         TwoPhaseOptions options)
    : node_(node),
      writes_(writes),
      options_(std::move(options)),
      retention_ns_(std::max<uint64_t>(60'000'000'000ull, 1000 * options_.max_lease_ns)),
      runner_(node, "tx recovery") {}

uint64_t TwoPhaseParticipant::Now() const {
  if (options_.now_ns) return options_.now_ns();
  return static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                   std::chrono::steady_clock::now().time_since_epoch())
                                   .count());
}

Status TwoPhaseParticipant::Prepare(std::span<const std::byte> body) {
  FARMEM_ASSIGN_OR_RETURN(wire::TwoPhaseRequest req, wire::DecodeTwoPhaseRequest(body, true));
  FARMEM_RETURN_IF_ERROR(writes_.Check(req.items));
  counters_.prepares.fetch_add(1, std::memory_order_relaxed);
  // prepared_mu_ throughout: a TX_STATUS (prepared_mu_, then decisions_mu_) finds txid either
  // prepared here (and answers "undecided") or not (and fences it, which refuses this prepare).
  std::lock_guard lock(prepared_mu_);
  if (prepared_.count(req.txid) != 0) return Status::OK();  // a repeated prepare
  if (!options_.no_prepare_fence) {
    std::lock_guard dlock(decisions_mu_);
    if (auto it = decisions_.find(req.txid); it != decisions_.end()) {
      if (it->second) return Status::OK();  // a repeated prepare after the commit reached here
      // A peer asked for txid's outcome and was told "aborted": this vote would come too late.
      writes_.Apply(req.txid, req.items, false);
      return Status::Aborted("stale commit: transaction " + std::to_string(req.txid) +
                             " was decided abort (a participant asked for its outcome)");
    }
  }
  FARMEM_RETURN_IF_ERROR(writes_.Pin(req.txid, req.items));
  Prepared p;
  p.body.assign(body.begin(), body.end());
  p.deadline_ns = Now() + std::min(req.lease_ns, options_.max_lease_ns);
  prepared_[req.txid] = std::move(p);
  return Status::OK();
}

void TwoPhaseParticipant::RecordOutcome(uint64_t txid, bool committed) {
  if (options_.no_learned_outcome) return;
  std::lock_guard lock(decisions_mu_);
  if (decisions_.emplace(txid, committed).second) decision_order_.emplace_back(Now(), txid);
}

void TwoPhaseParticipant::Apply(uint64_t txid, const Prepared& p, bool commit) {
  // The body was decoded and checked when it was prepared; it cannot fail now.
  Result<wire::TwoPhaseRequest> req = wire::DecodeTwoPhaseRequest(p.body, true);
  if (!req.ok()) return;
  writes_.Apply(txid, req->items, commit);
}

Status TwoPhaseParticipant::DecidePrepared(uint64_t txid, bool commit) {
  counters_.decides.fetch_add(1, std::memory_order_relaxed);
  Prepared p;
  {
    std::lock_guard lock(prepared_mu_);
    auto it = prepared_.find(txid);
    if (it == prepared_.end()) {
      if (!commit) return Status::OK();  // never prepared here, or resolved already
      return Status::FailedPrecondition("TX_DECIDE: transaction " + std::to_string(txid) +
                                        " is not prepared here (resolved already?)");
    }
    p = std::move(it->second);
    prepared_.erase(it);
    // Learned before prepared_mu_ is let go: a TX_STATUS from a peer never sees this
    // transaction neither prepared nor decided (it would fence it and answer "aborted").
    RecordOutcome(txid, commit);
  }
  Apply(txid, p, commit);
  return Status::OK();
}

Status TwoPhaseParticipant::DecideFirst(uint64_t txid, const std::function<Status()>& install,
                                        const std::function<void()>& release) {
  counters_.decides.fetch_add(1, std::memory_order_relaxed);
  // The commit point: the writes and the decision under decisions_mu_, so a TX_STATUS sees
  // either the commit recorded, or no record (and then fences txid, and this commit is refused).
  std::lock_guard lock(decisions_mu_);
  if (auto it = decisions_.find(txid); it != decisions_.end()) {
    if (it->second) return Status::OK();  // a repeated commit
    release();
    return Status::Aborted("stale commit: transaction " + std::to_string(txid) +
                           " was decided abort (a participant asked for its outcome)");
  }
  Status st = install();
  decisions_[txid] = st.ok();
  decision_order_.emplace_back(Now(), txid);
  return st;
}

wire::StatusReply TwoPhaseParticipant::StatusOf(uint64_t txid) {
  counters_.statuses.fetch_add(1, std::memory_order_relaxed);
  wire::StatusReply r{};
  std::lock_guard plock(prepared_mu_);
  std::lock_guard lock(decisions_mu_);
  if (auto it = decisions_.find(txid); it != decisions_.end()) {
    r.outcome = it->second ? wire::kDecideCommit : wire::kDecideAbort;
  } else if (prepared_.count(txid) != 0) {
    r.outcome = wire::kOutcomeUndecided;  // voted yes here: only the outcome may decide
  } else {
    decisions_.emplace(txid, false);  // no record: fenced as aborted
    decision_order_.emplace_back(Now(), txid);
    r.outcome = wire::kDecideAbort;
  }
  return r;
}

Result<uint8_t> TwoPhaseParticipant::AskStatus(const std::string& address, uint64_t txid) {
  PeerId peer = kInvalidPeer;
  if (auto it = peers_.find(address); it != peers_.end()) {
    peer = it->second;
  } else {
    Result<PeerInfo> info = node_.connect(address);
    if (!info.ok()) return info.status().WithContext("tx recovery: connecting to " + address);
    peer = info->id;
    peers_[address] = peer;
  }
  Result<wire::StatusReply> r = runner_.run([&](Scheduler& s) {
    return CallStruct<wire::StatusReply>(s, peer, wire::kOpStatus, wire::StatusRequest{txid},
                                         "TX_STATUS to " + address);
  });
  if (!r.ok()) {
    peers_.erase(address);  // connect afresh next time (the peer may have restarted)
    return r.status();
  }
  const auto bytes = EncodeStruct(*r);
  FARMEM_ASSIGN_OR_RETURN(wire::StatusReply checked, wire::DecodeStatusReply(bytes));
  return checked.outcome;
}

void TwoPhaseParticipant::Recover() {
  std::vector<std::pair<uint64_t, std::vector<std::string>>> due;  // txid, participants
  {
    const uint64_t now = Now();
    std::lock_guard lock(prepared_mu_);
    for (auto& [txid, p] : prepared_) {
      if (p.resolving || p.deadline_ns > now) continue;
      Result<wire::TwoPhaseRequest> req = wire::DecodeTwoPhaseRequest(p.body, true);
      if (!req.ok()) continue;
      p.resolving = true;
      due.emplace_back(
          txid, std::vector<std::string>(req->participants.begin(), req->participants.end()));
    }
  }
  for (const auto& [txid, participants] : due) {
    // The first participant decides; only when it does not answer, a peer that learned the
    // outcome (or fences txid, never having voted) settles it. A user data structure's owner
    // serves no TX_STATUS (its entry is marked): it is not asked.
    Result<uint8_t> outcome = AskStatus(participants[0], txid);
    bool from_peer = false;
    if (!outcome.ok() || *outcome == wire::kOutcomeUndecided) {
      for (size_t i = 1; i < participants.size(); ++i) {
        if (participants[i] == options_.self || wire::IsDsParticipant(participants[i])) continue;
        Result<uint8_t> o = AskStatus(participants[i], txid);
        if (o.ok() && *o != wire::kOutcomeUndecided) {
          outcome = o;
          from_peer = true;
          break;
        }
      }
    }
    const bool decided = outcome.ok() && *outcome != wire::kOutcomeUndecided;
    const bool committed = decided && *outcome == wire::kDecideCommit;
    Prepared p;
    {
      std::lock_guard lock(prepared_mu_);
      auto it = prepared_.find(txid);
      if (it == prepared_.end()) continue;  // a TX_DECIDE arrived meanwhile and applied it
      if (!decided) {
        // 2PC blocks here: without the first participant's answer, and with no peer knowing the
        // outcome, it is unknown, so the locks stay; ask again after half a lease.
        it->second.resolving = false;
        it->second.deadline_ns = Now() + options_.max_lease_ns / 2;
        counters_.recovery_unreachable.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      p = std::move(it->second);
      prepared_.erase(it);
      RecordOutcome(txid, committed);  // before prepared_mu_ is let go, as in DecidePrepared
    }
    Apply(txid, p, committed);
    (committed ? counters_.recovered_commits : counters_.recovered_aborts)
        .fetch_add(1, std::memory_order_relaxed);
    if (from_peer) counters_.recovered_from_peers.fetch_add(1, std::memory_order_relaxed);
  }
  std::lock_guard lock(decisions_mu_);
  const uint64_t now = Now();
  while (!decision_order_.empty() && decision_order_.front().first + retention_ns_ < now) {
    decisions_.erase(decision_order_.front().second);
    decision_order_.pop_front();
  }
}

size_t TwoPhaseParticipant::prepared() const {
  std::lock_guard lock(prepared_mu_);
  return prepared_.size();
}

size_t TwoPhaseParticipant::decisions() const {
  std::lock_guard lock(decisions_mu_);
  return decisions_.size();
}

}  // namespace farmem::tx
