// Frame decoder and encoders of the native TCP transport (see wire.h, docs/wire-format.md).
// DecodeFrame is fuzzed (frame_decoder_fuzz.cc): it must reject, never crash, on any input.
#include "transport/tcp/frame_codec.h"

#include "farmem/status.h"

namespace farmem::tcpwire {
namespace {

template <typename T>
T Load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

template <typename T>
void Store(uint8_t* p, const T& v) {
  std::memcpy(p, &v, sizeof(T));
}

uint8_t* PutHeader(ByteQueue& q, Opcode op, uint8_t flags, uint16_t code, uint64_t seq,
                   uint32_t body_len) {
  uint8_t* p = q.append(sizeof(FrameHeader) + body_len);
  FrameHeader h{body_len, static_cast<uint8_t>(op), flags, code, seq};
  Store(p, h);
  return p + sizeof(FrameHeader);
}

DecodeResult Error(std::string_view why) {
  return {DecodeState::kError, 0, why};
}

// Body-length checks that only need the header, so oversize frames are refused before buffering.
DecodeResult CheckHeader(const FrameHeader& h, const DecodeLimits& lim) {
  const auto op = static_cast<Opcode>(h.opcode);
  uint64_t min = 0, max = 0;
  switch (op) {
    case Opcode::kHello:
      min = sizeof(HelloBody);
      max = sizeof(HelloBody) + kMaxTokenBytes;
      break;
    case Opcode::kRead:
      min = max = sizeof(ReadReq);
      break;
    case Opcode::kWrite:
      min = sizeof(WriteReq);
      max = sizeof(WriteReq) + uint64_t{lim.max_io_bytes};
      break;
    case Opcode::kCompareSwap:
    case Opcode::kFetchAdd:
      min = max = sizeof(AtomicReq);
      break;
    case Opcode::kRpc:
    case Opcode::kRpcResp:
      min = sizeof(RpcHeader);
      max = sizeof(RpcHeader) + uint64_t{lim.max_rpc_bytes};
      break;
    case Opcode::kReadResp:
      min = 0;
      max = lim.max_io_bytes;
      break;
    case Opcode::kWriteResp:
      min = max = 0;
      break;
    case Opcode::kAtomicResp:
      min = max = sizeof(AtomicResp);
      break;
    case Opcode::kError:
      min = 0;
      max = kMaxErrorMessageBytes;
      break;
    default:
      return Error("unknown frame opcode");
  }
  if (h.body_len < min) return Error("frame body shorter than its opcode's fixed part");
  if (h.body_len > max || h.body_len > kMaxFrameBody)
    return Error("frame body length exceeds the maximum for its opcode");
  if (op == Opcode::kError) {
    // Every code of farmem/status.h (kFailedPrecondition is the last; it stopped at kInternal,
    // so a TX_DECIDE's FailedPrecondition closed the connection as a malformed frame).
    if (h.code == 0 || h.code > static_cast<uint16_t>(Code::kFailedPrecondition))
      return Error("error frame carries an invalid status code");
  } else if (h.code != 0) {
    return Error("non-error frame carries a status code");
  }
  const uint8_t allowed_flags = op == Opcode::kWrite ? kFlagDeliveryAck : 0;
  if ((h.flags & ~allowed_flags) != 0) return Error("frame has unknown flag bits set");
  return {DecodeState::kFrame, 0, {}};
}

}  // namespace

bool IsRequestOpcode(uint8_t opcode) {
  return opcode >= static_cast<uint8_t>(Opcode::kHello) &&
         opcode <= static_cast<uint8_t>(Opcode::kRpc);
}

DecodeResult DecodeFrame(std::span<const uint8_t> buf, const DecodeLimits& limits, FrameView* out) {
  if (buf.size() < sizeof(FrameHeader)) return {DecodeState::kNeedMore, sizeof(FrameHeader), {}};
  const auto h = Load<FrameHeader>(buf.data());
  DecodeResult check = CheckHeader(h, limits);
  if (check.state == DecodeState::kError) return check;
  const size_t total = sizeof(FrameHeader) + size_t{h.body_len};
  if (buf.size() < total) return {DecodeState::kNeedMore, total, {}};

  const uint8_t* body = buf.data() + sizeof(FrameHeader);
  FrameView& f = *out;
  f.header = h;
  f.opcode = static_cast<Opcode>(h.opcode);
  f.frame_size = total;
  size_t fixed = 0;
  switch (f.opcode) {
    case Opcode::kHello:
      f.hello = Load<HelloBody>(body);
      fixed = sizeof(HelloBody);
      if (f.hello.magic != kMagic) return Error("hello has a bad magic number");
      if (f.hello.version != kVersion) return Error("hello has an unsupported protocol version");
      if (f.hello.token_len != h.body_len - sizeof(HelloBody))
        return Error("hello token length does not match the frame length");
      break;
    case Opcode::kRead:
      f.read = Load<ReadReq>(body);
      fixed = sizeof(ReadReq);
      if (f.read.length > limits.max_io_bytes) return Error("read length exceeds the maximum");
      if (f.read.reserved != 0) return Error("read request reserved field is not zero");
      break;
    case Opcode::kWrite:
      f.write = Load<WriteReq>(body);
      fixed = sizeof(WriteReq);
      break;
    case Opcode::kCompareSwap:
    case Opcode::kFetchAdd:
      f.atomic = Load<AtomicReq>(body);
      fixed = sizeof(AtomicReq);
      break;
    case Opcode::kRpc:
    case Opcode::kRpcResp:
      f.rpc = Load<RpcHeader>(body);
      fixed = sizeof(RpcHeader);
      if (f.rpc.reserved != 0) return Error("rpc header reserved field is not zero");
      break;
    case Opcode::kAtomicResp:
      f.atomic_resp = Load<AtomicResp>(body);
      fixed = sizeof(AtomicResp);
      break;
    case Opcode::kReadResp:
    case Opcode::kWriteResp:
    case Opcode::kError:
      break;
  }
  f.data = std::span<const uint8_t>(body + fixed, h.body_len - fixed);
  return {DecodeState::kFrame, total, {}};
}

void EncodeHello(ByteQueue& q, std::string_view token) {
  const auto n = static_cast<uint16_t>(token.size());
  uint8_t* p = PutHeader(q, Opcode::kHello, 0, 0, 0, sizeof(HelloBody) + n);
  Store(p, HelloBody{kMagic, kVersion, n});
  if (n != 0) std::memcpy(p + sizeof(HelloBody), token.data(), n);
}

void EncodeRead(ByteQueue& q, uint64_t seq, uint64_t key, uint64_t offset, uint32_t length) {
  uint8_t* p = PutHeader(q, Opcode::kRead, 0, 0, seq, sizeof(ReadReq));
  Store(p, ReadReq{key, offset, length, 0});
}

void EncodeWrite(ByteQueue& q, uint64_t seq, uint64_t key, uint64_t offset, const void* data,
                 uint32_t length, bool delivery_ack) {
  uint8_t* p = PutHeader(q, Opcode::kWrite, delivery_ack ? kFlagDeliveryAck : 0, 0, seq,
                         sizeof(WriteReq) + length);
  Store(p, WriteReq{key, offset});
  if (length != 0) std::memcpy(p + sizeof(WriteReq), data, length);
}

void EncodeAtomic(ByteQueue& q, Opcode op, uint64_t seq, uint64_t key, uint64_t offset,
                  uint64_t operand, uint64_t operand2) {
  uint8_t* p = PutHeader(q, op, 0, 0, seq, sizeof(AtomicReq));
  Store(p, AtomicReq{key, offset, operand, operand2});
}

void EncodeRpc(ByteQueue& q, Opcode op, uint64_t seq, uint32_t imm, const void* payload,
               uint32_t length) {
  uint8_t* p = PutHeader(q, op, 0, 0, seq, sizeof(RpcHeader) + length);
  Store(p, RpcHeader{imm, 0});
  if (length != 0) std::memcpy(p + sizeof(RpcHeader), payload, length);
}

uint8_t* EncodeReadResp(ByteQueue& q, uint64_t seq, uint32_t length) {
  return PutHeader(q, Opcode::kReadResp, 0, 0, seq, length);
}

void EncodeWriteResp(ByteQueue& q, uint64_t seq) {
  PutHeader(q, Opcode::kWriteResp, 0, 0, seq, 0);
}

void EncodeAtomicResp(ByteQueue& q, uint64_t seq, uint64_t old_value) {
  uint8_t* p = PutHeader(q, Opcode::kAtomicResp, 0, 0, seq, sizeof(AtomicResp));
  Store(p, AtomicResp{old_value});
}

void EncodeError(ByteQueue& q, uint64_t seq, uint16_t code, std::string_view message) {
  if (message.size() > kMaxErrorMessageBytes) message = message.substr(0, kMaxErrorMessageBytes);
  const auto n = static_cast<uint32_t>(message.size());
  uint8_t* p = PutHeader(q, Opcode::kError, 0, code, seq, n);
  if (n != 0) std::memcpy(p, message.data(), n);
}

}  // namespace farmem::tcpwire
