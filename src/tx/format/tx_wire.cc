// Encoders and decoders of the transaction RPC bodies (tx_wire.h): every length and field of a
// request is checked here before the service touches a table. Pure functions, any thread.
#include "tx/format/tx_wire.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace farmem::tx_wire {
namespace {

template <typename T>
T Load(std::span<const std::byte> bytes) {
  T v;
  std::memcpy(&v, bytes.data(), sizeof(T));
  return v;
}
template <typename T>
void Append(std::vector<std::byte>& out, const T& v) {
  const auto* p = reinterpret_cast<const std::byte*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}
void AppendBytes(std::vector<std::byte>& out, std::span<const std::byte> b) {
  out.insert(out.end(), b.begin(), b.end());
}

Status CheckKeyLen(uint32_t key_len, const char* what) {
  if (key_len < tx::kMinKeySize || key_len > tx::kMaxKeySize || key_len % 8 != 0) {
    return Status::Protocol(std::string(what) + ": key_len " + std::to_string(key_len) +
                            " is not a multiple of 8 in [8, 64]");
  }
  return Status::OK();
}
Status CheckCount(uint32_t count, const char* what) {
  if (count == 0 || count > kMaxBatchItems) {
    return Status::Protocol(std::string(what) + ": count " + std::to_string(count) +
                            " outside [1, " + std::to_string(kMaxBatchItems) + "]");
  }
  return Status::OK();
}
bool ValidName(std::string_view n) {
  if (n.empty() || n.size() > kMaxTableName) return false;
  for (char c : n) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '_' || c == '.' || c == '-';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

TableInfoEntry EncodeTableInfo(std::string_view name, uint64_t region_key, uint64_t region_bytes,
                               const tx::TxGeometry& g) {
  TableInfoEntry e;
  std::memset(&e, 0, sizeof(e));
  std::memcpy(e.name, name.data(), std::min(name.size(), kMaxTableName));
  e.region_key = region_key;
  e.region_bytes = region_bytes;
  e.key_size = g.key_size;
  e.value_size = g.value_size;
  e.width = g.width;
  e.num_buckets = g.num_buckets;
  e.overflow_buckets = g.overflow_buckets;
  e.partition = g.partition;
  e.num_partitions = g.num_partitions;
  e.hash_seed = g.hash_seed;
  return e;
}

std::vector<std::byte> EncodeTableInfoReply(std::span<const TableInfo> tables) {
  std::vector<std::byte> out;
  Append(out, TableInfoReply{static_cast<uint32_t>(tables.size()), 0});
  for (const TableInfo& t : tables) {
    Append(out, EncodeTableInfo(t.name, t.region_key, t.region_bytes, t.geometry));
  }
  return out;
}

Result<std::vector<TableInfo>> DecodeTableInfoReply(std::span<const std::byte> bytes) {
  if (bytes.size() < sizeof(TableInfoReply)) {
    return Status::Protocol("TX_TABLE_INFO reply: shorter than its header");
  }
  const auto h = Load<TableInfoReply>(bytes);
  if (h.reserved != 0) return Status::Protocol("TX_TABLE_INFO reply: reserved field not 0");
  if (h.num_tables > kMaxTables) {
    return Status::Protocol("TX_TABLE_INFO reply: " + std::to_string(h.num_tables) +
                            " tables, more than " + std::to_string(kMaxTables));
  }
  if (bytes.size() != sizeof(TableInfoReply) + uint64_t{h.num_tables} * sizeof(TableInfoEntry)) {
    return Status::Protocol("TX_TABLE_INFO reply: length does not match its table count");
  }
  std::vector<TableInfo> out;
  for (uint32_t i = 0; i < h.num_tables; ++i) {
    const auto e =
        Load<TableInfoEntry>(bytes.subspan(sizeof(TableInfoReply) + i * sizeof(TableInfoEntry)));
    const size_t name_len = strnlen(e.name, sizeof(e.name));
    if (name_len == sizeof(e.name)) {
      return Status::Protocol("TX_TABLE_INFO reply: table name not NUL-terminated");
    }
    TableInfo t;
    t.name.assign(e.name, name_len);
    if (!ValidName(t.name)) return Status::Protocol("TX_TABLE_INFO reply: bad table name");
    t.region_key = e.region_key;
    t.region_bytes = e.region_bytes;
    t.geometry.key_size = e.key_size;
    t.geometry.value_size = e.value_size;
    t.geometry.width = e.width;
    t.geometry.num_buckets = e.num_buckets;
    t.geometry.overflow_buckets = e.overflow_buckets;
    t.geometry.partition = e.partition;
    t.geometry.num_partitions = e.num_partitions;
    t.geometry.hash_seed = e.hash_seed;
    if (Status st = tx::ValidateGeometry(t.geometry); !st.ok()) {
      return Status::Protocol("TX_TABLE_INFO reply: table " + t.name + ": " +
                              std::string(st.message()));
    }
    if (t.region_bytes != tx::RegionBytes(t.geometry)) {
      return Status::Protocol("TX_TABLE_INFO reply: table " + t.name +
                              ": region length does not match its geometry");
    }
    out.push_back(std::move(t));
  }
  return out;
}

std::vector<std::byte> EncodeKeyRequest(uint16_t table, std::span<const std::byte> key,
                                        uint64_t txid, uint64_t lease_ns) {
  std::vector<std::byte> out;
  Append(out, KeyRequest{table, static_cast<uint16_t>(key.size()), 0, txid, lease_ns});
  AppendBytes(out, key);
  return out;
}

Result<KeyOp> DecodeKeyRequest(std::span<const std::byte> bytes, bool needs_txid) {
  if (bytes.size() < sizeof(KeyRequest)) return Status::Protocol("tx key request: too short");
  const auto r = Load<KeyRequest>(bytes);
  if (r.reserved != 0) return Status::Protocol("tx key request: reserved field not 0");
  if (Status st = CheckKeyLen(r.key_len, "tx key request"); !st.ok()) return st;
  if (bytes.size() != sizeof(KeyRequest) + r.key_len) {
    return Status::Protocol("tx key request: body length is not header + key_len");
  }
  if (needs_txid && (r.txid == 0 || r.lease_ns == 0)) {
    return Status::Protocol("tx lock request: txid and lease_ns must not be 0");
  }
  if (!needs_txid && (r.txid != 0 || r.lease_ns != 0)) {
    return Status::Protocol("TX_LOOKUP: txid and lease_ns must be 0");
  }
  return KeyOp{r.table, r.txid, r.lease_ns, bytes.subspan(sizeof(KeyRequest), r.key_len)};
}

std::vector<std::byte> EncodeValidateRequest(uint16_t table, uint64_t txid,
                                             std::span<const ValidateItem> items) {
  std::vector<std::byte> out;
  const uint16_t key_len = items.empty() ? 0 : static_cast<uint16_t>(items[0].key.size());
  Append(out, ValidateRequest{table, key_len, static_cast<uint16_t>(items.size()), 0, txid});
  for (const ValidateItem& i : items) {
    Append(out, i.version);
    AppendBytes(out, i.key);
  }
  return out;
}

Result<ValidateOp> DecodeValidateRequest(std::span<const std::byte> bytes) {
  if (bytes.size() < sizeof(ValidateRequest)) return Status::Protocol("TX_VALIDATE: too short");
  const auto r = Load<ValidateRequest>(bytes);
  if (r.reserved != 0) return Status::Protocol("TX_VALIDATE: reserved field not 0");
  if (Status st = CheckKeyLen(r.key_len, "TX_VALIDATE"); !st.ok()) return st;
  if (Status st = CheckCount(r.count, "TX_VALIDATE"); !st.ok()) return st;
  const size_t item_bytes = 8 + size_t{r.key_len};
  if (bytes.size() != sizeof(ValidateRequest) + r.count * item_bytes) {
    return Status::Protocol("TX_VALIDATE: body length is not header + count * (8 + key_len)");
  }
  ValidateOp op{r.table, r.txid, {}};
  for (size_t i = 0; i < r.count; ++i) {
    auto at = bytes.subspan(sizeof(ValidateRequest) + i * item_bytes, item_bytes);
    op.items.push_back(ValidateItem{Load<uint64_t>(at), at.subspan(8)});
  }
  return op;
}

std::vector<std::byte> EncodeBatchRequest(uint16_t table, uint64_t txid,
                                          std::span<const BatchEntry> items) {
  std::vector<std::byte> out;
  Append(out, BatchHeader{table, static_cast<uint16_t>(items.size()), 0, txid});
  for (const BatchEntry& e : items) {
    const uint16_t vlen = e.op == kWrite ? static_cast<uint16_t>(e.value.size()) : 0;
    Append(out, BatchItem{e.op, 0, static_cast<uint16_t>(e.key.size()), vlen, 0});
    AppendBytes(out, e.key);
    if (e.op == kWrite) AppendBytes(out, e.value);
  }
  return out;
}

namespace {

// The items of TX_COMMIT / TX_UNLOCK (BatchItem) and of TX_PREPARE / TX_DECIDE (TwoPhaseItem: the
// same 8 bytes, the last field a table id instead of reserved) from `at` to the body's end.
Status ParseItems(std::span<const std::byte> bytes, size_t at, size_t count, const char* what,
                  bool allow_unlock, bool tables, std::vector<TwoPhaseEntry>* out) {
  static_assert(sizeof(BatchItem) == sizeof(TwoPhaseItem));
  for (size_t i = 0; i < count; ++i) {
    if (bytes.size() - at < sizeof(TwoPhaseItem)) {
      return Status::Protocol(std::string(what) + ": item " + std::to_string(i) + " truncated");
    }
    const auto it = Load<TwoPhaseItem>(bytes.subspan(at));
    at += sizeof(TwoPhaseItem);
    if (it.reserved != 0 || (!tables && it.table != 0)) {
      return Status::Protocol(std::string(what) + ": reserved field not 0");
    }
    const bool known =
        it.op == kWrite || it.op == kRemove || (allow_unlock && it.op == kUnlockOnly);
    if (!known) {
      return Status::Protocol(std::string(what) + ": item " + std::to_string(i) + ": bad op " +
                              std::to_string(it.op));
    }
    if (Status st = CheckKeyLen(it.key_len, what); !st.ok()) return st;
    if (it.op != kWrite && it.value_len != 0) {
      return Status::Protocol(std::string(what) + ": value on a non-write item");
    }
    if (it.value_len > tx::kMaxValueSize) {
      return Status::Protocol(std::string(what) + ": value_len over " +
                              std::to_string(tx::kMaxValueSize));
    }
    if (bytes.size() - at < size_t{it.key_len} + it.value_len) {
      return Status::Protocol(std::string(what) + ": item " + std::to_string(i) + " truncated");
    }
    TwoPhaseEntry e;
    e.op = static_cast<BatchOp>(it.op);
    e.table = it.table;
    e.key = bytes.subspan(at, it.key_len);
    at += it.key_len;
    e.value = bytes.subspan(at, it.value_len);
    at += it.value_len;
    out->push_back(e);
  }
  if (at != bytes.size()) return Status::Protocol(std::string(what) + ": trailing bytes");
  return Status::OK();
}

}  // namespace

Result<BatchOpRequest> DecodeBatchRequest(std::span<const std::byte> bytes, bool commit) {
  const char* what = commit ? "TX_COMMIT" : "TX_UNLOCK";
  if (bytes.size() < sizeof(BatchHeader))
    return Status::Protocol(std::string(what) + ": too short");
  const auto h = Load<BatchHeader>(bytes);
  if (h.reserved != 0) return Status::Protocol(std::string(what) + ": reserved field not 0");
  if (h.txid == 0) return Status::Protocol(std::string(what) + ": txid 0");
  if (Status st = CheckCount(h.count, what); !st.ok()) return st;
  std::vector<TwoPhaseEntry> items;
  FARMEM_RETURN_IF_ERROR(
      ParseItems(bytes, sizeof(BatchHeader), h.count, what, !commit, false, &items));
  BatchOpRequest req{h.table, h.txid, {}};
  for (const TwoPhaseEntry& e : items) req.items.push_back(BatchEntry{e.op, e.key, e.value});
  return req;
}

std::vector<std::byte> EncodeTwoPhaseRequest(uint64_t txid, uint64_t lease_ns, uint8_t decision,
                                             uint16_t total,
                                             std::span<const std::string> participants,
                                             std::span<const TwoPhaseEntry> items) {
  std::vector<std::byte> out;
  const uint16_t n = participants.empty() ? total : static_cast<uint16_t>(participants.size());
  Append(out,
         TwoPhaseHeader{txid, lease_ns, n, static_cast<uint16_t>(items.size()), decision, 0, 0});
  for (const std::string& a : participants) {
    ParticipantEntry p;
    std::memset(&p, 0, sizeof(p));
    std::memcpy(p.address, a.data(), std::min(a.size(), kParticipantBytes - 1));
    Append(out, p);
  }
  for (const TwoPhaseEntry& e : items) {
    const uint16_t vlen = e.op == kWrite ? static_cast<uint16_t>(e.value.size()) : 0;
    Append(out, TwoPhaseItem{e.op, 0, static_cast<uint16_t>(e.key.size()), vlen, e.table});
    AppendBytes(out, e.key);
    if (e.op == kWrite) AppendBytes(out, e.value);
  }
  return out;
}

Result<TwoPhaseRequest> DecodeTwoPhaseRequest(std::span<const std::byte> bytes, bool prepare) {
  const char* what = prepare ? "TX_PREPARE" : "TX_DECIDE";
  const auto bad = [&](const std::string& why) {
    return Status::Protocol(std::string(what) + ": " + why);
  };
  if (bytes.size() < sizeof(TwoPhaseHeader)) return bad("too short");
  const auto h = Load<TwoPhaseHeader>(bytes);
  if (h.reserved != 0 || h.reserved2 != 0) return bad("reserved field not 0");
  if (h.txid == 0) return bad("txid 0");
  TwoPhaseRequest req;
  req.txid = h.txid;
  req.lease_ns = h.lease_ns;
  req.decision = h.decision;
  req.num_participants = h.num_participants;
  size_t at = sizeof(TwoPhaseHeader);
  if (prepare) {
    if (h.decision != 0) return bad("decision not 0");
    if (h.lease_ns == 0) return bad("lease_ns 0");
    if (h.num_participants < 2 || h.num_participants > kMaxParticipants) {
      return bad("num_participants " + std::to_string(h.num_participants) + " outside [2, " +
                 std::to_string(kMaxParticipants) + "]");
    }
    if (Status st = CheckCount(h.count, what); !st.ok()) return st;
    if (bytes.size() - at < h.num_participants * sizeof(ParticipantEntry)) {
      return bad("participant list truncated");
    }
    for (size_t i = 0; i < h.num_participants; ++i, at += sizeof(ParticipantEntry)) {
      const auto* p = reinterpret_cast<const char*>(bytes.data() + at);
      const size_t len = strnlen(p, kParticipantBytes);
      if (len == 0 || len == kParticipantBytes) {
        return bad("participant " + std::to_string(i) + " is empty or not NUL-terminated");
      }
      for (size_t j = len; j < kParticipantBytes; ++j) {
        if (p[j] != 0) return bad("participant " + std::to_string(i) + " not NUL-padded");
      }
      req.participants.emplace_back(p, len);
    }
    if (IsDsParticipant(req.participants[0])) {
      return bad("participant 0 (the keeper of the decision) is a data structure's owner");
    }
  } else {
    if (h.decision != kDecideCommit && h.decision != kDecideAbort) {
      return bad("decision " + std::to_string(h.decision) + " is neither commit nor abort");
    }
    if (h.lease_ns != 0) return bad("lease_ns not 0");
    if (h.count == 0) {
      // A prepared participant's outcome (num_participants 0), or the first participant's commit
      // when it holds none of the writes, only the decision (2..16 participants).
      if (h.num_participants == 1 || h.num_participants > kMaxParticipants) {
        return bad("num_participants " + std::to_string(h.num_participants) +
                   " without items: 0, or 2.." + std::to_string(kMaxParticipants));
      }
      if (h.num_participants != 0 && h.decision != kDecideCommit) {
        return bad("a first participant's abort decision");
      }
    } else {
      if (Status st = CheckCount(h.count, what); !st.ok()) return st;
      if (h.decision != kDecideCommit) return bad("items with an abort decision");
      if (h.num_participants == 0 || h.num_participants > kMaxParticipants) {
        return bad("num_participants " + std::to_string(h.num_participants) + " outside [1, " +
                   std::to_string(kMaxParticipants) + "]");
      }
    }
  }
  FARMEM_RETURN_IF_ERROR(ParseItems(bytes, at, h.count, what, false, true, &req.items));
  return req;
}

Result<StatusRequest> DecodeStatusRequest(std::span<const std::byte> bytes) {
  if (bytes.size() != sizeof(StatusRequest)) return Status::Protocol("TX_STATUS: length is not 8");
  const auto r = Load<StatusRequest>(bytes);
  if (r.txid == 0) return Status::Protocol("TX_STATUS: txid 0");
  return r;
}

Result<StatusReply> DecodeStatusReply(std::span<const std::byte> bytes) {
  if (bytes.size() != sizeof(StatusReply)) return Status::Protocol("TX_STATUS reply: length");
  const auto r = Load<StatusReply>(bytes);
  if (r.outcome != kDecideCommit && r.outcome != kDecideAbort && r.outcome != kOutcomeUndecided) {
    return Status::Protocol("TX_STATUS reply: unknown outcome " + std::to_string(r.outcome));
  }
  for (uint8_t b : r.reserved) {
    if (b != 0) return Status::Protocol("TX_STATUS reply: reserved field not 0");
  }
  return r;
}

Result<ItemResult> DecodeItemReply(std::span<const std::byte> bytes, uint32_t value_size) {
  if (bytes.size() != sizeof(ItemReply) + value_size) {
    return Status::Protocol("tx item reply: length is not 24 + value_size");
  }
  return ItemResult{Load<ItemReply>(bytes), bytes.subspan(sizeof(ItemReply))};
}

}  // namespace farmem::tx_wire
