// ParseHostPort: strict host:port splitting (digits only, no empty parts, port range checked).
#include "common/net/host_port.h"

namespace farmem::net {

Result<std::pair<std::string, uint16_t>> ParseHostPort(std::string_view address, PortZero zero) {
  const std::string text(address);
  std::string_view host, port;
  if (!address.empty() && address.front() == '[') {
    const size_t close = address.find(']');
    if (close == std::string_view::npos || close + 1 >= address.size() ||
        address[close + 1] != ':') {
      return Status::InvalidArgument("bad address '" + text + "' (expected [ipv6]:port)");
    }
    host = address.substr(1, close - 1);
    port = address.substr(close + 2);
  } else {
    const size_t colon = address.rfind(':');
    if (colon == std::string_view::npos) {
      return Status::InvalidArgument("bad address '" + text + "' (expected host:port)");
    }
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
    if (host.find(':') != std::string_view::npos) {
      return Status::InvalidArgument("bad address '" + text +
                                     "' (an IPv6 host needs brackets: [ipv6]:port)");
    }
  }
  if (host.empty() || port.empty()) {
    return Status::InvalidArgument("bad address '" + text + "' (expected host:port)");
  }
  // No host name or IP literal has a bracket; "[[x]:1" would otherwise give the host "[x", which
  // FormatHostPort turns into "[x:1", an address that no longer parses (bootstrap_fuzz).
  if (host.find_first_of("[]") != std::string_view::npos) {
    return Status::InvalidArgument("bad address '" + text + "' (brackets inside the host)");
  }
  if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string_view::npos) {
    return Status::InvalidArgument("bad port in address '" + text + "'");
  }
  uint32_t p = 0;
  for (char c : port) p = p * 10 + static_cast<uint32_t>(c - '0');
  if (p > 65535 || (p == 0 && zero == PortZero::kRefused)) {
    return Status::InvalidArgument("port out of range in address '" + text + "'");
  }
  return std::make_pair(std::string(host), static_cast<uint16_t>(p));
}

}  // namespace farmem::net
