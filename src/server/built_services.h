// The one place where farmemd's services are composed: every service this build contains, in
// start order. A new design adds its descriptor here and nowhere else in the daemon.
#pragma once

#include <vector>

#include "service/service.h"

namespace farmem {

// Descriptors of the built services ("pools", "objects", ...), in start order.
const std::vector<const ServiceDescriptor*>& BuiltServices();

}  // namespace farmem
