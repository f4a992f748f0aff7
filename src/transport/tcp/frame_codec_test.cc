// Tests of the TCP transport's frame codec: every frame round-trips, partial input asks for more,
// and malformed input (bad magic/version/opcode/code/flags, oversize or short bodies) is rejected.
#include "transport/tcp/frame_codec.h"

#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "farmem/status.h"

namespace farmem::tcpwire {
namespace {

std::vector<uint8_t> Bytes(const ByteQueue& q) {
  return std::vector<uint8_t>(q.data(), q.data() + q.size());
}

// A decoded frame together with the bytes its spans point into.
struct Decoded {
  std::vector<uint8_t> bytes;
  FrameView f;
};

// Decodes exactly one frame that must fill `q` completely.
Decoded DecodeOne(const ByteQueue& q) {
  Decoded d;
  d.bytes = Bytes(q);
  DecodeResult r = DecodeFrame(d.bytes, {}, &d.f);
  EXPECT_EQ(r.state, DecodeState::kFrame) << r.error;
  EXPECT_EQ(d.f.frame_size, d.bytes.size());
  return d;  // moving the vector keeps its heap buffer, so d.f's spans stay valid
}

std::string Text(std::span<const uint8_t> s) {
  return std::string(reinterpret_cast<const char*>(s.data()), s.size());
}

DecodeResult Decode(const std::vector<uint8_t>& b, const DecodeLimits& lim = {}) {
  FrameView f;
  return DecodeFrame(b, lim, &f);
}

std::vector<uint8_t> RawHeader(uint8_t opcode, uint32_t body_len, uint16_t code = 0,
                               uint8_t flags = 0, uint64_t seq = 7) {
  std::vector<uint8_t> b(sizeof(FrameHeader));
  FrameHeader h{body_len, opcode, flags, code, seq};
  std::memcpy(b.data(), &h, sizeof(h));
  return b;
}

TEST(FrameCodec, HelloRoundTrip) {
  ByteQueue q;
  EncodeHello(q, "secret-token");
  Decoded d = DecodeOne(q);
  const FrameView& f = d.f;
  EXPECT_EQ(f.opcode, Opcode::kHello);
  EXPECT_EQ(f.header.seq, 0u);
  EXPECT_EQ(f.hello.magic, kMagic);
  EXPECT_EQ(f.hello.version, kVersion);
  EXPECT_EQ(Text(f.data), "secret-token");
}

TEST(FrameCodec, RequestsRoundTrip) {
  ByteQueue q;
  EncodeRead(q, 11, 0xabcdef, 4096, 64);
  const char payload[] = "hello world";
  EncodeWrite(q, 12, 0x1234, 8, payload, sizeof(payload), true);
  EncodeWrite(q, 13, 0x1234, 16, payload, 0, false);
  EncodeAtomic(q, Opcode::kCompareSwap, 14, 5, 24, 100, 200);
  EncodeAtomic(q, Opcode::kFetchAdd, 15, 5, 32, 3, 0);
  EncodeRpc(q, Opcode::kRpc, 16, 0xfeed, payload, sizeof(payload));

  std::vector<uint8_t> all = Bytes(q);
  std::span<const uint8_t> rest(all);
  std::vector<FrameView> frames;
  while (!rest.empty()) {
    FrameView f;
    DecodeResult r = DecodeFrame(rest, {}, &f);
    ASSERT_EQ(r.state, DecodeState::kFrame) << r.error;
    frames.push_back(f);
    rest = rest.subspan(f.frame_size);
  }
  ASSERT_EQ(frames.size(), 6u);
  EXPECT_EQ(frames[0].opcode, Opcode::kRead);
  EXPECT_EQ(frames[0].header.seq, 11u);
  EXPECT_EQ(frames[0].read.key, 0xabcdefu);
  EXPECT_EQ(frames[0].read.offset, 4096u);
  EXPECT_EQ(frames[0].read.length, 64u);

  EXPECT_EQ(frames[1].opcode, Opcode::kWrite);
  EXPECT_EQ(frames[1].header.flags, kFlagDeliveryAck);
  EXPECT_EQ(frames[1].write.offset, 8u);
  EXPECT_EQ(frames[1].data.size(), sizeof(payload));
  EXPECT_EQ(std::memcmp(frames[1].data.data(), payload, sizeof(payload)), 0);
  EXPECT_EQ(frames[2].header.flags, 0);
  EXPECT_TRUE(frames[2].data.empty());

  EXPECT_EQ(frames[3].opcode, Opcode::kCompareSwap);
  EXPECT_EQ(frames[3].atomic.operand, 100u);
  EXPECT_EQ(frames[3].atomic.operand2, 200u);
  EXPECT_EQ(frames[4].opcode, Opcode::kFetchAdd);
  EXPECT_EQ(frames[4].atomic.operand, 3u);

  EXPECT_EQ(frames[5].opcode, Opcode::kRpc);
  EXPECT_EQ(frames[5].rpc.imm, 0xfeedu);
  EXPECT_EQ(frames[5].data.size(), sizeof(payload));
}

TEST(FrameCodec, ResponsesRoundTrip) {
  ByteQueue q;
  uint8_t* p = EncodeReadResp(q, 21, 4);
  std::memcpy(p, "abcd", 4);
  Decoded d = DecodeOne(q);
  const FrameView& f = d.f;
  EXPECT_EQ(f.opcode, Opcode::kReadResp);
  EXPECT_EQ(Text(f.data), "abcd");

  q.clear();
  EncodeWriteResp(q, 22);
  d = DecodeOne(q);
  EXPECT_EQ(f.opcode, Opcode::kWriteResp);
  EXPECT_EQ(f.header.seq, 22u);

  q.clear();
  EncodeAtomicResp(q, 23, 0x1122334455667788ull);
  d = DecodeOne(q);
  EXPECT_EQ(f.atomic_resp.old_value, 0x1122334455667788ull);

  q.clear();
  EncodeRpc(q, Opcode::kRpcResp, 24, 9, "xyz", 3);
  d = DecodeOne(q);
  EXPECT_EQ(f.opcode, Opcode::kRpcResp);
  EXPECT_EQ(f.rpc.imm, 9u);
  EXPECT_EQ(Text(f.data), "xyz");

  q.clear();
  EncodeError(q, 25, static_cast<uint16_t>(Code::kOutOfRange), "too far");
  d = DecodeOne(q);
  EXPECT_EQ(f.opcode, Opcode::kError);
  EXPECT_EQ(f.header.code, static_cast<uint16_t>(Code::kOutOfRange));
  EXPECT_EQ(Text(f.data), "too far");
}

TEST(FrameCodec, ErrorMessageIsTruncatedToTheWireLimit) {
  ByteQueue q;
  EncodeError(q, 1, static_cast<uint16_t>(Code::kInternal), std::string(5000, 'x'));
  Decoded d = DecodeOne(q);
  const FrameView& f = d.f;
  EXPECT_EQ(f.data.size(), kMaxErrorMessageBytes);
}

// Every code of farmem/status.h crosses the wire: a TX_DECIDE's FailedPrecondition (the last
// code) was refused as a malformed frame, which closed the connection and failed every other
// operation on it (found by tests/tx_netns_test.sh: "TX_LOCK: malformed frame ... invalid status
// code"). 0 and codes past the last stay refused.
TEST(FrameCodec, ErrorFramesCarryEveryStatusCode) {
  for (uint16_t c = 1; c <= static_cast<uint16_t>(Code::kFailedPrecondition); ++c) {
    ByteQueue q;
    EncodeError(q, 9, c, "why");
    Decoded d = DecodeOne(q);
    EXPECT_EQ(d.f.opcode, Opcode::kError) << c;
    EXPECT_EQ(d.f.header.code, c);
  }
  const auto last = static_cast<uint16_t>(Code::kFailedPrecondition);
  EXPECT_EQ(Decode(RawHeader(static_cast<uint8_t>(Opcode::kError), 0, 0)).state,
            DecodeState::kError);
  EXPECT_EQ(Decode(RawHeader(static_cast<uint8_t>(Opcode::kError), 0, last + 1)).state,
            DecodeState::kError);
}

TEST(FrameCodec, EveryPrefixNeedsMore) {
  ByteQueue q;
  EncodeWrite(q, 3, 1, 0, "0123456789", 10, false);
  const std::vector<uint8_t> all = Bytes(q);
  for (size_t n = 0; n < all.size(); ++n) {
    std::vector<uint8_t> prefix(all.begin(), all.begin() + static_cast<ptrdiff_t>(n));
    DecodeResult r = Decode(prefix);
    ASSERT_EQ(r.state, DecodeState::kNeedMore) << "prefix " << n;
    EXPECT_EQ(r.needed, n < sizeof(FrameHeader) ? sizeof(FrameHeader) : all.size());
  }
}

TEST(FrameCodec, RejectsUnknownOpcode) {
  for (uint8_t op : {0, 7, 15, 21, 255}) {
    DecodeResult r = Decode(RawHeader(op, 0));
    EXPECT_EQ(r.state, DecodeState::kError) << int(op);
  }
}

TEST(FrameCodec, RejectsOversizeBeforeTheBodyArrives) {
  // Only the header is present: the length alone must be enough to refuse.
  DecodeResult r = Decode(RawHeader(static_cast<uint8_t>(Opcode::kWrite), 0xffffffffu));
  EXPECT_EQ(r.state, DecodeState::kError);
  r = Decode(RawHeader(static_cast<uint8_t>(Opcode::kReadResp), kMaxIoBytes + 1));
  EXPECT_EQ(r.state, DecodeState::kError);
  DecodeLimits small{1024, 100};
  r = Decode(RawHeader(static_cast<uint8_t>(Opcode::kRpc), sizeof(RpcHeader) + 101), small);
  EXPECT_EQ(r.state, DecodeState::kError);
  r = Decode(RawHeader(static_cast<uint8_t>(Opcode::kRpc), sizeof(RpcHeader) + 100), small);
  EXPECT_EQ(r.state, DecodeState::kNeedMore);
  r = Decode(RawHeader(static_cast<uint8_t>(Opcode::kError), kMaxErrorMessageBytes + 1,
                       static_cast<uint16_t>(Code::kInternal)));
  EXPECT_EQ(r.state, DecodeState::kError);
}

TEST(FrameCodec, RejectsBodiesOfTheWrongFixedSize) {
  EXPECT_EQ(Decode(RawHeader(static_cast<uint8_t>(Opcode::kRead), sizeof(ReadReq) - 1)).state,
            DecodeState::kError);
  EXPECT_EQ(Decode(RawHeader(static_cast<uint8_t>(Opcode::kRead), sizeof(ReadReq) + 1)).state,
            DecodeState::kError);
  EXPECT_EQ(Decode(RawHeader(static_cast<uint8_t>(Opcode::kCompareSwap), 8)).state,
            DecodeState::kError);
  EXPECT_EQ(Decode(RawHeader(static_cast<uint8_t>(Opcode::kAtomicResp), 16)).state,
            DecodeState::kError);
  EXPECT_EQ(Decode(RawHeader(static_cast<uint8_t>(Opcode::kWriteResp), 1)).state,
            DecodeState::kError);
  EXPECT_EQ(Decode(RawHeader(static_cast<uint8_t>(Opcode::kHello), 2)).state, DecodeState::kError);
}

TEST(FrameCodec, RejectsBadHello) {
  ByteQueue q;
  EncodeHello(q, "tok");
  std::vector<uint8_t> good = Bytes(q);
  const size_t body = sizeof(FrameHeader);

  std::vector<uint8_t> bad_magic = good;
  bad_magic[body] ^= 0xff;
  EXPECT_EQ(Decode(bad_magic).state, DecodeState::kError);

  std::vector<uint8_t> bad_version = good;
  bad_version[body + 4] = 99;
  EXPECT_EQ(Decode(bad_version).state, DecodeState::kError);

  std::vector<uint8_t> bad_token_len = good;
  bad_token_len[body + 6] = 2;  // says 2 bytes, frame carries 3
  EXPECT_EQ(Decode(bad_token_len).state, DecodeState::kError);

  EXPECT_EQ(Decode(RawHeader(static_cast<uint8_t>(Opcode::kHello),
                             sizeof(HelloBody) + kMaxTokenBytes + 1))
                .state,
            DecodeState::kError);
}

TEST(FrameCodec, RejectsBadCodesFlagsAndReservedFields) {
  // Error frames need a real, non-OK code; other frames must carry none.
  EXPECT_EQ(Decode(RawHeader(static_cast<uint8_t>(Opcode::kError), 0, 0)).state,
            DecodeState::kError);
  EXPECT_EQ(Decode(RawHeader(static_cast<uint8_t>(Opcode::kError), 0, 200)).state,
            DecodeState::kError);
  EXPECT_EQ(Decode(RawHeader(static_cast<uint8_t>(Opcode::kWriteResp), 0, 3)).state,
            DecodeState::kError);
  // Only WRITE has a flag.
  EXPECT_EQ(Decode(RawHeader(static_cast<uint8_t>(Opcode::kWriteResp), 0, 0, 1)).state,
            DecodeState::kError);
  std::vector<uint8_t> w = RawHeader(static_cast<uint8_t>(Opcode::kWrite), sizeof(WriteReq), 0, 2);
  w.resize(w.size() + sizeof(WriteReq));
  EXPECT_EQ(Decode(w).state, DecodeState::kError);

  ByteQueue q;
  EncodeRead(q, 1, 2, 3, 4);
  std::vector<uint8_t> r = Bytes(q);
  r[sizeof(FrameHeader) + 20] = 1;  // ReadReq::reserved
  EXPECT_EQ(Decode(r).state, DecodeState::kError);

  q.clear();
  EncodeRead(q, 1, 2, 3, 1024);
  EXPECT_EQ(Decode(Bytes(q), DecodeLimits{512, 512}).state, DecodeState::kError);
}

TEST(FrameCodec, RequestOpcodeClassification) {
  EXPECT_TRUE(IsRequestOpcode(static_cast<uint8_t>(Opcode::kHello)));
  EXPECT_TRUE(IsRequestOpcode(static_cast<uint8_t>(Opcode::kRpc)));
  EXPECT_FALSE(IsRequestOpcode(static_cast<uint8_t>(Opcode::kReadResp)));
  EXPECT_FALSE(IsRequestOpcode(static_cast<uint8_t>(Opcode::kError)));
  EXPECT_FALSE(IsRequestOpcode(0));
}

TEST(ByteQueue, AppendConsumeAndReuseStorage) {
  ByteQueue q;
  q.append("abcdef", 6);
  q.consume(2);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(q.data()), q.size()), "cdef");
  std::span<uint8_t> space = q.prepare(100000);
  ASSERT_GE(space.size(), 100000u);
  std::memcpy(space.data(), "gh", 2);
  q.commit(2);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(q.data()), q.size()), "cdefgh");
  q.consume(6);
  EXPECT_TRUE(q.empty());
  q.append("z", 1);
  EXPECT_EQ(q.size(), 1u);
  EXPECT_EQ(*q.data(), 'z');
}

}  // namespace
}  // namespace farmem::tcpwire
