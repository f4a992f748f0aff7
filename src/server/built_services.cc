// BuiltServices: the list of services linked into farmemd (see built_services.h).
#include "server/built_services.h"

#include "objects/service/object_service.h"
#include "pools/pools_service.h"
#include "tier/service/tier_service.h"
#include "tx/service/tx_service.h"

namespace farmem {

const std::vector<const ServiceDescriptor*>& BuiltServices() {
  static const std::vector<const ServiceDescriptor*> services = {
      &PoolsServiceDescriptor(),
      &ObjectsServiceDescriptor(),
      &TierServiceDescriptor(),
      &TxServiceDescriptor(),
  };
  return services;
}

}  // namespace farmem
