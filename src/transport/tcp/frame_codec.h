// Frame codec of the native TCP transport: a pure, allocation-free decoder (used by the NIC thread,
// the initiator and the fuzzer) plus encoders and the reusable byte queue frames are built in.
// The decoder never reads past the span it is given and validates every length against limits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "transport/tcp/wire.h"

namespace farmem::tcpwire {

struct DecodeLimits {
  uint32_t max_io_bytes = kMaxIoBytes;    // READ length / WRITE data / READ response data
  uint32_t max_rpc_bytes = kMaxRpcBytes;  // RPC request and reply payloads
};

// A decoded frame. Spans point into the decoded buffer: valid until that buffer changes.
struct FrameView {
  FrameHeader header{};
  Opcode opcode = Opcode::kHello;
  size_t frame_size = 0;  // header + body: bytes to consume
  // The opcode's fixed part (only the member named by `opcode` is meaningful).
  HelloBody hello{};
  ReadReq read{};
  WriteReq write{};
  AtomicReq atomic{};
  AtomicResp atomic_resp{};
  RpcHeader rpc{};
  // Variable part: hello token, write data, read response data, RPC payload or error message.
  std::span<const uint8_t> data;
};

enum class DecodeState : uint8_t { kNeedMore, kFrame, kError };

struct DecodeResult {
  DecodeState state = DecodeState::kNeedMore;
  // kNeedMore: total bytes the frame at the start of the buffer needs (header size when unknown).
  size_t needed = 0;
  // kError: why (a static string).
  std::string_view error;
};

// Decodes the frame at the start of `buf`. kError means the stream is corrupt and cannot be
// resynced.
DecodeResult DecodeFrame(std::span<const uint8_t> buf, const DecodeLimits& limits, FrameView* out);

// True for opcodes only an initiator may send.
bool IsRequestOpcode(uint8_t opcode);

// A growable byte FIFO that keeps its storage: append at the tail, consume at the head.
// Steady-state use does not allocate. Growth does not zero the new storage, so pages the queue
// reserves but never fills (a recv buffer sized for a frame that never arrives) stay untouched
// and cost no resident memory.
class ByteQueue {
 public:
  size_t size() const { return tail_ - head_; }
  bool empty() const { return tail_ == head_; }
  const uint8_t* data() const { return buf_.get() + head_; }
  std::span<const uint8_t> readable() const { return {data(), size()}; }
  // Bytes of storage held (content plus free space).
  size_t capacity() const { return cap_; }

  // Returns `n` writable bytes at the tail; they count as content immediately.
  uint8_t* append(size_t n) {
    reserve_tail(n);
    uint8_t* p = buf_.get() + tail_;
    tail_ += n;
    return p;
  }
  void append(const void* src, size_t n) {
    if (n != 0) std::memcpy(append(n), src, n);
  }
  // Returns at least `min_space` writable bytes at the tail (use with commit(), e.g. for recv).
  std::span<uint8_t> prepare(size_t min_space) {
    reserve_tail(min_space);
    return {buf_.get() + tail_, cap_ - tail_};
  }
  void commit(size_t n) { tail_ += n; }
  void consume(size_t n) {
    head_ += n;
    if (head_ == tail_) head_ = tail_ = 0;
  }
  void clear() { head_ = tail_ = 0; }
  // Frees the storage if the queue is empty and holds more than `keep` bytes, so a connection
  // that once carried a large frame does not keep its buffer for the rest of its life.
  void release_if_empty_above(size_t keep) {
    if (empty() && cap_ > keep) {
      buf_.reset();
      cap_ = head_ = tail_ = 0;
    }
  }

 private:
  void reserve_tail(size_t n) {
    if (cap_ - tail_ >= n) return;
    if (head_ != 0) {  // slide the unread bytes to the front before growing
      std::memmove(buf_.get(), buf_.get() + head_, tail_ - head_);
      tail_ -= head_;
      head_ = 0;
      if (cap_ - tail_ >= n) return;
    }
    size_t want = cap_ * 2;
    if (want < tail_ + n) want = tail_ + n;
    if (want < 4096) want = 4096;
    auto bigger = std::make_unique_for_overwrite<uint8_t[]>(want);
    if (tail_ != 0) std::memcpy(bigger.get(), buf_.get(), tail_);
    buf_ = std::move(bigger);
    cap_ = want;
  }

  std::unique_ptr<uint8_t[]> buf_;
  size_t cap_ = 0;
  size_t head_ = 0;
  size_t tail_ = 0;
};

// Encoders: append one complete frame to `q`. The caller has validated sizes against the limits.
void EncodeHello(ByteQueue& q, std::string_view token);
void EncodeRead(ByteQueue& q, uint64_t seq, uint64_t key, uint64_t offset, uint32_t length);
void EncodeWrite(ByteQueue& q, uint64_t seq, uint64_t key, uint64_t offset, const void* data,
                 uint32_t length, bool delivery_ack);
void EncodeAtomic(ByteQueue& q, Opcode op, uint64_t seq, uint64_t key, uint64_t offset,
                  uint64_t operand, uint64_t operand2);
void EncodeRpc(ByteQueue& q, Opcode op, uint64_t seq, uint32_t imm, const void* payload,
               uint32_t length);
// Appends the header of a READ response; the caller copies `length` data bytes to the result.
uint8_t* EncodeReadResp(ByteQueue& q, uint64_t seq, uint32_t length);
void EncodeWriteResp(ByteQueue& q, uint64_t seq);
void EncodeAtomicResp(ByteQueue& q, uint64_t seq, uint64_t old_value);
// `code` is a farmem::Code value other than kOk; the message is truncated to the wire limit.
void EncodeError(ByteQueue& q, uint64_t seq, uint16_t code, std::string_view message);

}  // namespace farmem::tcpwire
