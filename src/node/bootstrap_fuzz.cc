// libFuzzer target for the bootstrap handshake decoders (docs/node.md): what the listener makes
// of a peer's bytes (ParseHelloFrame: header checks, HELLO body JSON) and what a connecting node
// makes of the listener's answer (CheckReplyHeader, DecodeReply: WELCOME / error frames, the
// transport address it then dials) and of a kOpListRegions reply (DecodeRegionList).
// Beyond "no crash": every successful decode respects the field limits and re-encodes to bytes
// that decode to the same message, and the listener's framing never asks for or reads past the
// frame it announced. Built with -DFARMEM_FUZZ=ON (scripts/test --fuzz).
//
// Input: byte 0 picks the decoder (low 2 bits), the rest is what the peer sent.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/fuzz_support.h"
#include "common/net/host_port.h"
#include "common/net/socket.h"
#include "node/bootstrap.h"
#include "node/bootstrap_wire.h"

namespace {

using namespace farmem;
using namespace farmem::node;  // node::DecodeRegionList spelled out: farmem:: has one too

std::vector<std::byte> FrameBytes(FrameType type, const std::string& body) {
  FrameHeader h;
  h.type = static_cast<uint16_t>(type);
  h.body_length = static_cast<uint32_t>(body.size());
  const auto hdr = EncodeHeader(h);
  std::vector<std::byte> out(hdr.begin(), hdr.end());
  const auto* b = reinterpret_cast<const std::byte*>(body.data());
  out.insert(out.end(), b, b + body.size());
  return out;
}

bool SameHello(const HelloMsg& a, const HelloMsg& b) {
  return a.token == b.token && a.name == b.name && a.transport_address == b.transport_address &&
         a.backend == b.backend;
}

bool SameRegions(const std::vector<RegionInfo>& a, const std::vector<RegionInfo>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].name != b[i].name || a[i].key != b[i].key || a[i].length != b[i].length) return false;
  }
  return true;
}

void CheckRegions(const std::vector<RegionInfo>& regions) {
  FUZZ_CHECK(regions.size() <= kMaxRegionsListed);
  for (const RegionInfo& r : regions) FUZZ_CHECK(r.name.size() <= kMaxFieldBytes);
  // Encoder round trip: what we decoded, re-encoded, decodes to the same list.
  const std::vector<std::byte> again = EncodeRegionList(regions);
  auto back = node::DecodeRegionList(again);
  FUZZ_CHECK(back.ok() && SameRegions(*back, regions));
}

// The address a node dials after a WELCOME (Transport::add_peer parses it the same way).
void CheckTransportAddress(const std::string& address) {
  auto hp = net::ParseHostPort(address, net::PortZero::kRefused);
  if (!hp.ok()) return;
  FUZZ_CHECK(!hp->first.empty() && hp->second != 0);
  FUZZ_CHECK(hp->first.size() < address.size());
  auto again =
      net::ParseHostPort(net::FormatHostPort(hp->first, hp->second), net::PortZero::kRefused);
  FUZZ_CHECK(again.ok() && again->first == hp->first && again->second == hp->second);
}

void CheckWelcome(const WelcomeMsg& w) {
  FUZZ_CHECK(w.name.size() <= kMaxFieldBytes && w.transport_address.size() <= kMaxFieldBytes &&
             w.backend.size() <= kMaxFieldBytes);
  CheckRegions(w.regions);
  CheckTransportAddress(w.transport_address);
  auto back = DecodeWelcome(EncodeWelcome(w));
  FUZZ_CHECK(back.ok() && back->name == w.name && back->transport_address == w.transport_address &&
             back->backend == w.backend && SameRegions(back->regions, w.regions));
}

// The listener: it reads the header, then exactly the rest of the frame ParseHelloFrame asks for.
void FuzzListener(std::span<const std::byte> stream) {
  size_t have = std::min(stream.size(), kFrameHeaderSize);
  HelloFrame f;
  for (int round = 0;; ++round) {
    FUZZ_CHECK(round < 3);  // header, then body: at most two requests for more
    f = ParseHelloFrame(stream.first(have));
    if (f.kind != HelloFrame::Kind::kNeedMore) break;
    FUZZ_CHECK(f.frame_bytes > have);
    FUZZ_CHECK(f.frame_bytes <= kFrameHeaderSize + kMaxHelloBody);
    if (stream.size() < f.frame_bytes) return;  // the peer never sends the rest
    have = f.frame_bytes;
  }
  // Bytes past the frame never change the decision (the listener does not read them anyway).
  const HelloFrame whole = ParseHelloFrame(stream);
  FUZZ_CHECK(whole.kind == f.kind);
  switch (f.kind) {
    case HelloFrame::Kind::kNeedMore:
      FUZZ_CHECK(false);
    case HelloFrame::Kind::kMalformed:
    case HelloFrame::Kind::kRejected:
      FUZZ_CHECK(!f.error.ok());
      // The answer the listener sends for it is a well-formed error frame.
      FUZZ_CHECK(DecodeError(EncodeError(f.error)).code() == f.error.code());
      return;
    case HelloFrame::Kind::kHello:
      break;
  }
  FUZZ_CHECK(have >= kFrameHeaderSize && f.frame_bytes == have);
  FUZZ_CHECK(SameHello(whole.hello, f.hello));
  const HelloMsg& h = f.hello;
  FUZZ_CHECK(h.token.size() <= kMaxFieldBytes && h.name.size() <= kMaxFieldBytes &&
             h.transport_address.size() <= kMaxFieldBytes && h.backend.size() <= kMaxFieldBytes);
  // Round trip through the client's encoder: the frame a node would send for this HELLO fits the
  // listener's limit and decodes to the same message.
  const std::vector<std::byte> frame = FrameBytes(FrameType::kHello, EncodeHello(h));
  FUZZ_CHECK(frame.size() <= kFrameHeaderSize + kMaxHelloBody);
  const HelloFrame again = ParseHelloFrame(frame);
  FUZZ_CHECK(again.kind == HelloFrame::Kind::kHello && again.frame_bytes == frame.size());
  FUZZ_CHECK(SameHello(again.hello, h));
}

// The connecting node: a 12-byte header, then body_length bytes of body.
void FuzzReplyFrame(std::span<const std::byte> stream) {
  if (stream.size() < kFrameHeaderSize) return;
  const FrameHeader h = DecodeHeader(stream.data());
  const Status st = CheckReplyHeader(h, "fuzz:1");
  if (!st.ok()) {
    FUZZ_CHECK(st.code() == Code::kProtocol);
    return;
  }
  FUZZ_CHECK(h.body_length <= kMaxBootstrapBody);
  const auto rest = stream.subspan(kFrameHeaderSize);
  if (rest.size() < h.body_length) return;  // the peer never sends the rest: RecvAll times out
  const std::string_view body(reinterpret_cast<const char*>(rest.data()), h.body_length);
  auto w = DecodeReply(h.type, body, "fuzz:1");
  if (w.ok()) {
    FUZZ_CHECK(h.type == static_cast<uint16_t>(FrameType::kWelcome));
    CheckWelcome(*w);
  } else if (h.type == static_cast<uint16_t>(FrameType::kError)) {
    // An error frame carries any status but OK; the listener's encoding of it decodes the same.
    const Status again = DecodeError(EncodeError(w.status()));
    FUZZ_CHECK(again.code() == w.status().code() && again.message() == w.status().message());
  }
}

// The bodies on their own, so the fuzzer need not get the length field right to reach JSON.
void FuzzBody(uint8_t selector, std::span<const std::byte> rest) {
  const std::string_view body(reinterpret_cast<const char*>(rest.data()), rest.size());
  switch (selector % 3) {
    case 0: {
      auto w = DecodeWelcome(body);
      if (w.ok()) CheckWelcome(*w);
      break;
    }
    case 1: {
      const Status s = DecodeError(body);
      FUZZ_CHECK(!s.ok());
      const Status again = DecodeError(EncodeError(s));
      FUZZ_CHECK(again.code() == s.code() && again.message() == s.message());
      // The encoder's side: whatever error a node answers with arrives as that error.
      const auto code =
          static_cast<Code>(1 + (selector >> 2) % static_cast<int>(Code::kFailedPrecondition));
      const std::string msg(body.substr(0, std::min<size_t>(body.size(), 64)));
      const Status sent = DecodeError(EncodeError(Status(code, msg)));
      FUZZ_CHECK(sent.code() == code);
      break;
    }
    case 2: {
      auto regions = node::DecodeRegionList(rest);
      if (regions.ok()) CheckRegions(*regions);
      break;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  farmem::fuzz::RestoreCrashSignals();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const auto rest = std::span(reinterpret_cast<const std::byte*>(data) + 1, size - 1);
  switch (data[0] & 3) {
    case 0:
      FuzzListener(rest);
      break;
    case 1:
      FuzzReplyFrame(rest);
      break;
    default:
      FuzzBody(static_cast<uint8_t>(data[0] >> 2), rest);
      break;
  }
  return 0;
}
