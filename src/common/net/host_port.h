// "host:port" and "[v6]:port" parsing, the one implementation every listener and connector uses
// (bootstrap, transport, farmemd flags, metrics endpoint).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "farmem/status.h"

namespace farmem::net {

enum class PortZero : uint8_t { kAllowed, kRefused };

// Splits `address` into host (brackets of an IPv6 literal removed) and port 0..65535. Port 0 is
// an error unless `zero` is kAllowed (a listener's "any free port"); so is an IPv6 host without
// brackets ("::1:80" is ambiguous), and so is a bracket inside the host. InvalidArgument
// otherwise. FormatHostPort(host, port) of a result parses back to the same host and port.
Result<std::pair<std::string, uint16_t>> ParseHostPort(std::string_view address,
                                                       PortZero zero = PortZero::kAllowed);

}  // namespace farmem::net
