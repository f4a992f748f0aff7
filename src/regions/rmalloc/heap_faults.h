// Test-only switch that removes the rmalloc heap's lock, so the multi-process test shows it
// catches overlapping allocations without it (docs/regions_sync.md, "Tests"). Never set outside
// tests; read on the calling thread (a relaxed atomic), inherited by forked children.
#pragma once

namespace farmem::regions::rmalloc::testing {

// TEST ONLY: rmalloc/rfree do not take the lock word in the range's header.
void SetHeapLockDisabled(bool disabled);

}  // namespace farmem::regions::rmalloc::testing
