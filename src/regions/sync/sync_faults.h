// Test-only switches that remove one protection each from the regions synchronization, so the
// tests show they catch its absence (docs/regions_sync.md, "Tests"). Never set outside tests; the
// library reads the switch on the calling thread (a relaxed atomic).
#pragma once

#include <string_view>

namespace farmem::regions::sync::testing {

enum class SyncFault : int {
  kNone = 0,
  kBarrierEarly,  // rbarrier_wait arrives but does not wait for the round
  kMutexSkip,     // rmutex_lock takes a ticket but does not wait for its turn
  kBellNoWait,    // rbell_wait returns the current value without waiting for a change
};
void SetSyncFault(SyncFault fault);
SyncFault GetSyncFault();
// "barrier_early" | "mutex_skip" | "bell_nowait" | "" (none); false for an unknown name.
bool ParseSyncFault(std::string_view name, SyncFault* out);

}  // namespace farmem::regions::sync::testing
