// libFuzzer target for the TIER_* wire decoders (tier/format/tier_wire.h) the tier service runs on
// every request: TIER_READ, TIER_WRITE, TIER_COUNTERS and the client's TIER_INFO reply decoder.
// Beyond "no crash" it checks what an accepted request promises the handler: the range lies in
// the region and within the size limit, the page mask has exactly the range's words and no bit
// past its last page, the reply size is at most the range, a write's bytes are exactly its length,
// every counter unit exists; an accepted TIER_INFO reply re-encodes to the same bytes; encoders'
// output of the decoded values decodes again to the same values. Built with -DFARMEM_FUZZ=ON.
//
// Input: first byte selects the decoder (% 4) and a geometry (/ 4 % 4); the rest is the body.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "common/fuzz_support.h"
#include "tier/format/tier_layout.h"
#include "tier/format/tier_wire.h"

namespace {

using namespace farmem;
using namespace farmem::tier;

TierGeometry Geo(uint8_t sel) {
  static const uint64_t kCaps[4][2] = {{uint64_t{1} << 20, 64 << 10},
                                       {uint64_t{64} << 10, 4096},
                                       {uint64_t{16} << 20, 1 << 20},
                                       {uint64_t{3} << 20, 64 << 10}};
  auto g = TierGeometry::Make(kCaps[sel % 4][0], kCaps[sel % 4][1]);
  FUZZ_CHECK(g.ok());
  return *g;
}

constexpr uint64_t kMax = uint64_t{256} << 10;

void FuzzRead(std::span<const std::byte> body, const TierGeometry& geo) {
  auto r = DecodeTierReadRequest(body, geo, kMax);
  if (!r.ok()) {
    const Code c = r.status().code();
    FUZZ_CHECK(c == Code::kProtocol || c == Code::kInvalidArgument || c == Code::kOutOfRange);
    FUZZ_CHECK(!r.status().message().empty());
    return;
  }
  FUZZ_CHECK(r->length >= 1 && r->length <= kMax);
  FUZZ_CHECK(r->offset < geo.capacity && r->length <= geo.capacity - r->offset);
  FUZZ_CHECK(r->mask.size() == MaskWords(PagesSpanned(r->offset, r->length)));
  FUZZ_CHECK(CheckPageMask(r->offset, r->length, r->mask).ok());
  FUZZ_CHECK(TierReadReplyBytes(r->offset, r->length, r->mask) <= r->length);
  const auto again = EncodeTierReadRequest(r->offset, r->length, r->mask);
  FUZZ_CHECK(again.size() == body.size() &&
             std::memcmp(again.data(), body.data(), body.size()) == 0);
}

void FuzzWrite(std::span<const std::byte> body, const TierGeometry& geo) {
  auto r = DecodeTierWriteRequest(body, geo, kMax);
  if (!r.ok()) {
    const Code c = r.status().code();
    FUZZ_CHECK(c == Code::kProtocol || c == Code::kInvalidArgument || c == Code::kOutOfRange);
    return;
  }
  FUZZ_CHECK(!r->data.empty() && r->data.size() <= kMax);
  FUZZ_CHECK(r->offset < geo.capacity && r->data.size() <= geo.capacity - r->offset);
  FUZZ_CHECK(r->data.data() == body.data() + sizeof(TierWriteHead));
  FUZZ_CHECK(r->data.size() + sizeof(TierWriteHead) == body.size());
}

void FuzzCounters(std::span<const std::byte> body, const TierGeometry& geo) {
  auto r = DecodeTierCounters(body, geo.unit_count);
  if (!r.ok()) {
    const Code c = r.status().code();
    FUZZ_CHECK(c == Code::kProtocol || c == Code::kOutOfRange);
    return;
  }
  for (const TierCounterEntry& e : *r) FUZZ_CHECK(e.unit < geo.unit_count);
  const auto again = EncodeTierCounters(*r);
  FUZZ_CHECK(again.size() == body.size() &&
             std::memcmp(again.data(), body.data(), body.size()) == 0);
}

void FuzzInfo(std::span<const std::byte> body) {
  auto r = DecodeTierInfoReply(body);
  if (!r.ok()) {
    FUZZ_CHECK(r.status().code() == Code::kProtocol);
    return;
  }
  FUZZ_CHECK(IsValidMagic(r->magic_word));
  FUZZ_CHECK(r->geometry.capacity % r->geometry.unit_size == 0);
  const auto again = EncodeTierInfoReply(*r);
  FUZZ_CHECK(again.size() == body.size() &&
             std::memcmp(again.data(), body.data(), body.size()) == 0);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  farmem::fuzz::RestoreCrashSignals();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t sel = data[0];
  const auto body = std::as_bytes(std::span(data + 1, size - 1));
  const TierGeometry geo = Geo(sel / 4);
  switch (sel % 4) {
    case 0:
      FuzzRead(body, geo);
      break;
    case 1:
      FuzzWrite(body, geo);
      break;
    case 2:
      FuzzCounters(body, geo);
      break;
    default:
      FuzzInfo(body);
      break;
  }
  return 0;
}
