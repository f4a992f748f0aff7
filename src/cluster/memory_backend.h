// Test hooks of the in-process memory:// store (memory_backend.cc): take a store "offline" to
// simulate a lost or hung control plane, and compact its event history. Any thread; a hook on a
// name no backend holds open does nothing.
#pragma once

#include <cstdint>
#include <string_view>

namespace farmem::cluster {

// While unavailable every call of every backend on store `name` returns Unavailable (with
// `hang`, only once its deadline has passed, like a store that accepts and never answers) and
// watches deliver nothing; when available again they resume after the last revision each
// delivered. Leases keep expiring meanwhile, exactly as on an etcd its clients cannot reach.
void SetMemoryStoreAvailable(std::string_view name, bool available, bool hang = false);

// Drops the event history before `revision`: a watch that still needs an older revision (or
// starts at one) gets on_error FailedPrecondition "... compacted" once.
void CompactMemoryStore(std::string_view name, int64_t revision);

}  // namespace farmem::cluster
