// CheckHistory (tx_history.h): version chains per key, then the dependency graph and a
// topological sort (Kahn) to find a cycle. Pure function, any thread.
#include "tx/client/tx_history.h"

#include <algorithm>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>

namespace farmem::tx {
namespace {

std::string Id(uint64_t id) {
  return id == 0 ? std::string("initial") : "T" + std::to_string(id);
}

}  // namespace

Status CheckHistory(std::span<const HistoryTx> committed, HistoryStats* stats) {
  const size_t n = committed.size();
  std::unordered_map<uint64_t, size_t> index;  // id -> position in `committed`
  for (size_t i = 0; i < n; ++i) {
    const HistoryTx& t = committed[i];
    if (t.id == 0) return Status::InvalidArgument("history: transaction id 0");
    if (!index.emplace(t.id, i).second) {
      return Status::InvalidArgument("history: duplicate transaction id " + Id(t.id));
    }
    for (size_t a = 0; a < t.writes.size(); ++a) {
      for (size_t b = 0; b < a; ++b) {
        if (t.writes[a].key == t.writes[b].key) {
          return Status::InvalidArgument("history: " + Id(t.id) + " writes key " +
                                         std::to_string(t.writes[a].key) + " twice");
        }
      }
    }
  }
  // Per key: which transaction overwrote each version (prev stamp -> writer id).
  std::unordered_map<uint64_t, std::unordered_map<uint64_t, uint64_t>> next;
  std::unordered_map<uint64_t, size_t> writes_of_key;
  size_t versions = 0;
  for (const HistoryTx& t : committed) {
    for (const HistoryTx::Write& w : t.writes) {
      ++versions;
      ++writes_of_key[w.key];
      auto [it, fresh] = next[w.key].emplace(w.prev_stamp, t.id);
      if (!fresh) {
        return Status::FailedPrecondition(
            "history: lost update: key " + std::to_string(w.key) + ": version " + Id(w.prev_stamp) +
            " overwritten by both " + Id(it->second) + " and " + Id(t.id));
      }
    }
  }
  // Walk each chain from the initial version: every write must be on it (no gap).
  std::unordered_map<uint64_t, std::unordered_set<uint64_t>> on_chain;  // key -> stamps
  for (const auto& [key, succ] : next) {
    auto& seen = on_chain[key];
    uint64_t at = 0;
    seen.insert(0);
    for (auto it = succ.find(at); it != succ.end(); it = succ.find(at)) {
      at = it->second;
      if (!seen.insert(at).second) break;
    }
    if (seen.size() - 1 != writes_of_key[key]) {
      for (const auto& [prev, writer] : succ) {
        if (seen.count(writer) == 0) {
          return Status::FailedPrecondition("history: gap: key " + std::to_string(key) + ": " +
                                            Id(writer) + " overwrote version " + Id(prev) +
                                            ", which no committed transaction installed");
        }
      }
    }
  }
  // Dependency edges between committed transactions (positions in `committed`).
  std::vector<std::vector<std::pair<size_t, const char*>>> out(n);
  size_t edges = 0;
  const auto edge = [&](uint64_t from, uint64_t to, const char* kind) {
    if (from == 0 || to == 0 || from == to) return;
    out[index.at(from)].emplace_back(index.at(to), kind);
    ++edges;
  };
  const auto writer_after = [&](uint64_t key, uint64_t stamp) -> uint64_t {
    auto k = next.find(key);
    if (k == next.end()) return 0;
    auto it = k->second.find(stamp);
    return it == k->second.end() ? 0 : it->second;
  };
  for (const HistoryTx& t : committed) {
    for (const HistoryTx::Read& r : t.reads) {
      auto chain = on_chain.find(r.key);
      const bool known = r.stamp == 0 || (chain != on_chain.end() && chain->second.count(r.stamp));
      if (!known) {
        return Status::FailedPrecondition("history: unknown version: " + Id(t.id) + " read key " +
                                          std::to_string(r.key) + " at version " + Id(r.stamp) +
                                          ", which no committed transaction installed");
      }
      edge(r.stamp, t.id, "wr");
      edge(t.id, writer_after(r.key, r.stamp), "rw");
    }
    for (const HistoryTx::Write& w : t.writes) edge(w.prev_stamp, t.id, "ww");
  }
  if (stats) *stats = HistoryStats{n, versions, edges};
  // Kahn: whatever cannot be ordered lies on or behind a cycle.
  std::vector<size_t> indegree(n, 0);
  for (const auto& list : out) {
    for (const auto& [to, kind] : list) ++indegree[to];
  }
  std::vector<size_t> ready;
  for (size_t i = 0; i < n; ++i) {
    if (indegree[i] == 0) ready.push_back(i);
  }
  size_t ordered = 0;
  while (!ready.empty()) {
    const size_t i = ready.back();
    ready.pop_back();
    ++ordered;
    for (const auto& [to, kind] : out[i]) {
      if (--indegree[to] == 0) ready.push_back(to);
    }
  }
  if (ordered == n) return Status::OK();
  // Name one cycle: every node left over has a predecessor left over (its in-degree counts only
  // those), so walking predecessors from one must come back to a node already on the walk.
  std::vector<std::vector<std::pair<size_t, const char*>>> in(n);
  for (size_t i = 0; i < n; ++i) {
    for (const auto& [to, kind] : out[i]) in[to].emplace_back(i, kind);
  }
  size_t at = 0;
  while (indegree[at] == 0) ++at;
  std::vector<size_t> walk;                // walk[i + 1] -> walk[i] is an edge
  std::vector<const char*> kinds;          // kinds[i]: kind of that edge
  std::unordered_map<size_t, size_t> pos;  // node -> index in walk
  while (pos.emplace(at, walk.size()).second) {
    walk.push_back(at);
    for (const auto& [from, kind] : in[at]) {
      if (indegree[from] != 0) {
        kinds.push_back(kind);
        at = from;
        break;
      }
    }
  }
  // The cycle in edge order: walk[first] -> walk[last] -> ... -> walk[first + 1] -> walk[first].
  const size_t first = pos[at];
  std::string cycle = Id(committed[at].id);
  for (size_t i = walk.size() - 1; i > first; --i) {
    cycle += std::string(" -") + kinds[i] + "-> " + Id(committed[walk[i]].id);
  }
  cycle += std::string(" -") + kinds[first] + "-> " + Id(committed[at].id);
  return Status::FailedPrecondition("history: cycle: " + cycle + " (" +
                                    std::to_string(n - ordered) + " of " + std::to_string(n) +
                                    " transactions cannot be ordered)");
}

}  // namespace farmem::tx
