// Fixed-size wire structs sent as raw little-endian bytes (memcpy): the one encoder/decoder every
// RPC wire header uses. Each struct's layout is pinned by static_asserts in its own wire header.
#pragma once

#include <bit>
#include <cstddef>
#include <cstring>
#include <optional>
#include <span>
#include <type_traits>
#include <vector>

namespace farmem {

static_assert(std::endian::native == std::endian::little, "farmem wire format is little-endian");

// Encode a wire struct into bytes.
template <typename T>
std::vector<std::byte> EncodeStruct(const T& msg) {
  static_assert(std::is_trivially_copyable_v<T>);
  std::vector<std::byte> out(sizeof(T));
  std::memcpy(out.data(), &msg, sizeof(T));
  return out;
}

// Decode bytes that must be exactly one T (nullopt when the size is wrong: a malformed message).
template <typename T>
std::optional<T> DecodeStruct(std::span<const std::byte> bytes) {
  static_assert(std::is_trivially_copyable_v<T>);
  if (bytes.size() != sizeof(T)) return std::nullopt;
  T msg;
  std::memcpy(&msg, bytes.data(), sizeof(T));
  return msg;
}

}  // namespace farmem
