// Pure helpers of the libfabric backend: hex addresses, mr_mode plan, wire messages.
// Kept free of libfabric objects (only its constants) so the unit tests need no provider.
#include "transport/fabric/fabric_util.h"

#include <rdma/fabric.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <random>

namespace farmem::fabric {

std::string HexEncode(std::span<const std::byte> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(bytes.size() * 2);
  for (std::byte b : bytes) {
    const auto v = static_cast<unsigned>(b);
    out.push_back(kDigits[v >> 4]);
    out.push_back(kDigits[v & 0xf]);
  }
  return out;
}

std::string ShmSourceName() {
  std::random_device rd;
  const uint64_t token = (static_cast<uint64_t>(rd()) << 32) | rd();
  char hex[17];
  std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(token));
  return ShmFilePrefix(getpid()) + hex;
}

std::string ShmFilePrefix(int pid) {
  return std::to_string(pid) + "_";
}

namespace {
int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}
}  // namespace

Result<std::vector<std::byte>> HexDecode(std::string_view hex) {
  if (hex.empty()) return Status::InvalidArgument("empty fabric address");
  if (hex.size() % 2 != 0) {
    return Status::InvalidArgument("fabric address has odd length " + std::to_string(hex.size()));
  }
  if (hex.size() / 2 > kMaxEndpointName) {
    return Status::InvalidArgument("fabric address longer than " +
                                   std::to_string(kMaxEndpointName) + " bytes");
  }
  std::vector<std::byte> out(hex.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    const int hi = HexValue(hex[2 * i]);
    const int lo = HexValue(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      return Status::InvalidArgument("fabric address is not hex: '" + std::string(hex) + "'");
    }
    out[i] = static_cast<std::byte>(hi << 4 | lo);
  }
  return out;
}

uint64_t SupportedMrModeBits() {
  return FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
}

Result<MrPlan> PlanForMrMode(uint64_t mr_mode, size_t key_size) {
  MrPlan plan;
  // Legacy FI_MR_BASIC (value 1) means VIRT_ADDR|PROV_KEY|ALLOCATED; FI_MR_SCALABLE (2) means none.
  if (mr_mode & FI_MR_BASIC) {
    mr_mode =
        (mr_mode & ~uint64_t{FI_MR_BASIC}) | FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ALLOCATED;
  }
  mr_mode &= ~uint64_t{FI_MR_SCALABLE};
  const uint64_t unsupported = mr_mode & ~SupportedMrModeBits();
  if (unsupported != 0) {
    return Status::Unavailable("provider requires unsupported mr_mode bits 0x" +
                               HexEncode(std::as_bytes(std::span(&unsupported, 1))) +
                               " (little-endian hex)");
  }
  if (key_size == 0 || key_size > 8) {
    return Status::Unavailable("provider mr_key_size " + std::to_string(key_size) +
                               " not supported (need 1..8 bytes)");
  }
  plan.virt_addr = mr_mode & FI_MR_VIRT_ADDR;
  plan.prov_key = mr_mode & FI_MR_PROV_KEY;
  plan.local = mr_mode & FI_MR_LOCAL;
  plan.endpoint_bind = mr_mode & FI_MR_ENDPOINT;
  plan.allocated = mr_mode & FI_MR_ALLOCATED;
  plan.key_size = key_size;
  return plan;
}

uint64_t RequestedKey(const MrPlan& plan, uint64_t region_key, unsigned attempt) {
  if (plan.prov_key) return 0;
  // Mix in the attempt so a collision retry asks for a different key (splitmix64 step).
  uint64_t k = region_key + uint64_t{attempt} * 0x9e3779b97f4a7c15ull;
  if (attempt != 0) {
    k = (k ^ (k >> 30)) * 0xbf58476d1ce4e5b9ull;
    k = (k ^ (k >> 27)) * 0x94d049bb133111ebull;
    k ^= k >> 31;
  }
  if (plan.key_size < 8) k &= (uint64_t{1} << (plan.key_size * 8)) - 1;
  return k;
}

std::string MrPlanString(const MrPlan& plan) {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += '|';
    s += name;
  };
  add(plan.local, "LOCAL");
  add(plan.virt_addr, "VIRT_ADDR");
  add(plan.allocated, "ALLOCATED");
  add(plan.prov_key, "PROV_KEY");
  add(plan.endpoint_bind, "ENDPOINT");
  return s.empty() ? "none" : s;
}

Result<ParsedMsg> ParseMessage(std::span<const std::byte> bytes, uint32_t max_payload) {
  ParsedMsg msg;
  if (bytes.size() < sizeof(WireHeader)) {
    return Status::Protocol("message of " + std::to_string(bytes.size()) +
                            " bytes is shorter than the header");
  }
  std::memcpy(&msg.header, bytes.data(), sizeof(WireHeader));
  const WireHeader& h = msg.header;
  if (h.magic != kWireMagic) return Status::Protocol("bad message magic");
  if (h.version != kWireVersion) {
    return Status::Protocol("unsupported message version " + std::to_string(h.version));
  }
  if (h.type < static_cast<uint8_t>(MsgType::kRpcRequest) ||
      h.type > static_cast<uint8_t>(MsgType::kLookupReply)) {
    return Status::Protocol("unknown message type " + std::to_string(h.type));
  }
  if (h.name_len > kMaxEndpointName) return Status::Protocol("endpoint name too long");
  if (h.payload_len > max_payload) {
    return Status::Protocol("payload of " + std::to_string(h.payload_len) +
                            " bytes exceeds the limit " + std::to_string(max_payload));
  }
  const size_t body = bytes.size() - sizeof(WireHeader);
  if (size_t{h.name_len} + h.payload_len != body) {
    return Status::Protocol("message lengths do not add up");
  }
  msg.name = bytes.subspan(sizeof(WireHeader), h.name_len);
  msg.payload = bytes.subspan(sizeof(WireHeader) + h.name_len, h.payload_len);
  return msg;
}

void BuildMessage(std::vector<std::byte>& out, MsgType type, uint32_t imm, uint64_t seq,
                  uint32_t status_code, std::span<const std::byte> name,
                  std::span<const std::byte> payload) {
  WireHeader h{};
  h.magic = kWireMagic;
  h.version = kWireVersion;
  h.type = static_cast<uint8_t>(type);
  h.name_len = static_cast<uint16_t>(name.size());
  h.imm = imm;
  h.payload_len = static_cast<uint32_t>(payload.size());
  h.seq = seq;
  h.status_code = status_code;
  out.resize(sizeof(h) + name.size() + payload.size());
  std::memcpy(out.data(), &h, sizeof(h));
  if (!name.empty()) std::memcpy(out.data() + sizeof(h), name.data(), name.size());
  if (!payload.empty()) {
    std::memcpy(out.data() + sizeof(h) + name.size(), payload.data(), payload.size());
  }
}

}  // namespace farmem::fabric
