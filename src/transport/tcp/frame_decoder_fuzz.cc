// libFuzzer target for the TCP transport's frame decoder: arbitrary bytes must decode to frames,
// "need more" or a Protocol error, never crash or read out of bounds (built with -DFARMEM_FUZZ=ON).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "transport/tcp/frame_codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace farmem::tcpwire;
  // The first byte picks small or default limits so both limit paths get exercised.
  DecodeLimits limits;
  if (size > 0 && (data[0] & 1)) limits = DecodeLimits{4096, 1024};
  std::span<const uint8_t> rest(data, size);
  // Decode a stream of frames the way the NIC thread and the initiator do.
  for (int guard = 0; guard < 100000; ++guard) {
    FrameView f;
    const DecodeResult r = DecodeFrame(rest, limits, &f);
    if (r.state != DecodeState::kFrame) {
      if (r.state == DecodeState::kNeedMore && r.needed <= rest.size()) __builtin_trap();
      break;
    }
    if (f.frame_size < sizeof(FrameHeader) || f.frame_size > rest.size()) __builtin_trap();
    // Touch every byte of the variable part: ASan flags any view outside the input.
    volatile uint8_t sink = 0;
    for (uint8_t b : f.data) sink = sink ^ b;
    (void)sink;
    if (f.data.data() < rest.data() || f.data.data() + f.data.size() > rest.data() + f.frame_size)
      __builtin_trap();
    rest = rest.subspan(f.frame_size);
  }
  return 0;
}
