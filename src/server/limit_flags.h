// farmemd's `--limit KEY=VALUE` flag: every connection limit of the listeners (native TCP data
// port, bootstrap port, metrics endpoint) by name, checked and applied to their limit structs.
// The table of keys is written once here (kLimitKeys in limit_flags.cc) and in docs/server.md.
#pragma once

#include <string>
#include <vector>

#include "farmem/node.h"
#include "farmem/status.h"
#include "farmem/transport.h"
#include "server/metrics_http.h"

namespace farmem {

// The limits a `--limit` item can set.
struct ListenerLimits {
  TcpLimits tcp;
  BootstrapLimits bootstrap;
  MetricsHttpLimits metrics;
};

// Applies items "KEY=VALUE" (e.g. "tcp.max_rpcs_in_flight=128") in order. InvalidArgument, naming
// the item, for an unknown key (the message lists the known ones), a value that is not a whole
// number in the key's range, or a combination that cannot work (a resume mark above its cap, a
// minimum back-off above its maximum). Nothing is changed on error.
Status ApplyLimitItems(const std::vector<std::string>& items, ListenerLimits& limits);

// "key (default N), ..." for --help.
std::string LimitKeysHelp();

}  // namespace farmem
