// Wire format of the channel control messages (RPCs in kChannelOpcodes; docs/channels.md, "Wire"):
// built by a ChannelThread opening an endpoint, parsed by the Manager's JOIN handler, which runs
// inline on the transport's progress thread. Fixed little-endian header, then the name bytes.
// Also the layouts the channels keep in their slices (read and written one-sided by the members).
#pragma once

#include <cstddef>
#include <cstdint>

#include "farmem/opcodes.h"

namespace farmem::channels::wire {

// JOIN: "node `from` has an endpoint of channel <name>, its slice is [offset, offset+length) of
// its channel region". Reply: JoinReply.
inline constexpr uint16_t kOpJoin = kChannelOpcodes.first + 0;
static_assert(kChannelOpcodes.contains(kOpJoin));

inline constexpr uint32_t kJoinMagic = 0x4a4e4843;  // "CHNJ"
inline constexpr uint16_t kMaxNameBytes = 256;

struct JoinRequest {
  uint32_t magic;
  uint32_t from;        // NodeId of the sender
  uint64_t offset;      // sender's slice offset in its channel region
  uint64_t length;      // slice bytes (must equal the receiver's)
  uint16_t name_bytes;  // followed by the name
  uint16_t reserved[3];
};
static_assert(sizeof(JoinRequest) == 32);
static_assert(offsetof(JoinRequest, name_bytes) == 24);

enum class JoinState : uint32_t {
  kJoined = 1,  // receiver has the endpoint: its slice follows
  kKept = 2,    // receiver has no endpoint yet: the join is kept until early_join_ttl
};

struct JoinReply {
  uint32_t state;  // JoinState
  uint32_t from;   // NodeId of the replier
  uint64_t offset;
  uint64_t length;
};
static_assert(sizeof(JoinReply) == 24);

// ---- Slice layouts (docs/channels.md, "Layouts") ----------------------------------------------

// Ticket lock words (TicketLock's slice; the kvstore's lock array). The kvstore uses the top 16
// bits of now_serving as its lock's roll-back count (kServingRollbackUnit, docs/channels.md
// "Failed modifications"); the ticket number is the low 48 bits (kServingTicketMask).
struct TicketWords {
  uint64_t next_ticket;
  uint64_t now_serving;
};
static_assert(sizeof(TicketWords) == 16);
inline constexpr uint64_t kServingTicketMask = (uint64_t{1} << 48) - 1;
inline constexpr uint64_t kServingRollbackUnit = uint64_t{1} << 48;

// RingBuffer record slot header, followed by the payload padded to words. Record seq goes to
// slot (seq - 1) % capacity; seq 0 = never written.
struct RingRecordHeader {
  uint64_t seq;
  uint64_t checksum;  // of seq; length and payload words
  uint64_t length;    // payload bytes
};
static_assert(sizeof(RingRecordHeader) == 24);

// SharedQueue: head and tail at the home's slice start, then the slots.
struct QueueEnds {
  uint64_t head;
  uint64_t tail;
};
static_assert(sizeof(QueueEnds) == 16);
// state 2L = free for lap L, 2L + 1 = full in lap L (zeroed = free for lap 0).
struct QueueSlot {
  uint64_t state;
  uint64_t value;
};
static_assert(sizeof(QueueSlot) == 16);

// KvStore value slot (on the node that inserted the value): this header, then the value padded to
// words (KvConfig::value_bytes, the same on every member), then the checksum word (of counter;
// key, value words). The value words and the checksum are adjacent so that update writes both in
// one write; a get that sees some of the new words and some old ones fails the checksum.
struct KvSlotHeader {
  uint64_t key;
  uint64_t counter;  // bumped by every insert into this slot
  uint64_t valid;    // 1 once the insert is linearized, 0 after a delete
};
static_assert(sizeof(KvSlotHeader) == 24);
static_assert(offsetof(KvSlotHeader, valid) == 16);
// Bytes of one slot holding `value_words` value words: header, value, checksum.
constexpr size_t KvSlotBytes(size_t value_words) {
  return sizeof(KvSlotHeader) + 8 * value_words + 8;
}
static_assert(KvSlotBytes(1) == 40);

// KvStore tracker record (payload of a node's tracker ringbuffer). kAbort retracts an insert of
// the same producer that failed (it follows that insert in the ring); it removes the entry like a
// delete. `ticket` is the key lock's ticket of the modification: an index applies an insert only
// when its entry for the key is older (a lower ticket), so records of different producers applied
// in any order leave the newest.
enum class KvTrackerOp : uint64_t { kInsert = 1, kDelete = 2, kAbort = 3 };
struct KvTrackerRecord {
  uint64_t op;  // KvTrackerOp
  uint64_t key;
  uint64_t node;  // where the value lives
  uint64_t slot;
  uint64_t counter;
  uint64_t ticket;
};
static_assert(sizeof(KvTrackerRecord) == 48);

// KvStore catch-up row of one lock (after the lock words in every member's slice: row i / n of
// member i % n for lock i, like the lock words): word m = the last record of member m's tracker
// ring that rolled back or completed a failed modification under this lock. A node applies member
// m's ring up to it before it modifies a key of the lock (when the lock's roll-back count moved).
constexpr size_t KvCatchUpRowBytes(size_t members) {
  return 8 * members;
}
static_assert(KvCatchUpRowBytes(3) == 24);

}  // namespace farmem::channels::wire
