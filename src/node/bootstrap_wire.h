// Bootstrap handshake wire format (the one definition; docs/node.md describes the protocol).
// Every frame is a fixed 12-byte little-endian header followed by a JSON body of `body_length`
// bytes. The header is encoded/decoded field by field, never memcpy'd as a struct.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>

namespace farmem::node {

inline constexpr uint32_t kBootstrapMagic = 0x464d4253;  // "SBMF" on the wire: farmem bootstrap
inline constexpr uint16_t kBootstrapVersion = 1;
// Bodies above this are rejected before any byte of them is read.
inline constexpr uint32_t kMaxBootstrapBody = 1u << 20;

enum class FrameType : uint16_t {
  kHello = 1,    // client -> server: {token, name, transport_address, backend}
  kWelcome = 2,  // server -> client: {name, transport_address, backend, regions:[...]}
  kError = 3,    // either way: {code, message}; the sender closes afterwards
};

struct FrameHeader {
  uint32_t magic = kBootstrapMagic;
  uint16_t version = kBootstrapVersion;
  uint16_t type = 0;
  uint32_t body_length = 0;
};
inline constexpr size_t kFrameHeaderSize = 12;
static_assert(sizeof(FrameHeader) == kFrameHeaderSize, "bootstrap header must be 12 bytes");

namespace wire_detail {
inline void PutLe(std::byte* p, uint64_t v, int n) {
  for (int i = 0; i < n; ++i) p[i] = static_cast<std::byte>((v >> (8 * i)) & 0xff);
}
inline uint64_t GetLe(const std::byte* p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}
}  // namespace wire_detail

inline std::array<std::byte, kFrameHeaderSize> EncodeHeader(const FrameHeader& h) {
  std::array<std::byte, kFrameHeaderSize> out{};
  wire_detail::PutLe(out.data() + 0, h.magic, 4);
  wire_detail::PutLe(out.data() + 4, h.version, 2);
  wire_detail::PutLe(out.data() + 6, h.type, 2);
  wire_detail::PutLe(out.data() + 8, h.body_length, 4);
  return out;
}

inline FrameHeader DecodeHeader(const std::byte* p) {
  FrameHeader h;
  h.magic = static_cast<uint32_t>(wire_detail::GetLe(p + 0, 4));
  h.version = static_cast<uint16_t>(wire_detail::GetLe(p + 4, 2));
  h.type = static_cast<uint16_t>(wire_detail::GetLe(p + 6, 2));
  h.body_length = static_cast<uint32_t>(wire_detail::GetLe(p + 8, 4));
  return h;
}

}  // namespace farmem::node
