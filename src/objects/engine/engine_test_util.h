// Helpers shared by the CoRM engine tests (compaction_test.cc, stress_test.cc): the test-only
// fault switch FARMEM_OBJECTS_FAULT (docs/testing.md, docs/objects.md "Merges that re-draw IDs").
// Read on the test's main thread before the threads start.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>

#include "objects/engine/compaction.h"

namespace farmem::corm::engine_testing {

// FARMEM_OBJECTS_FAULT=no_redraw: merges whose IDs collide are rejected (no re-draw);
// =reuse_old_ids: re-draws prefer an ID that an old pointer of the same home carries. Applied to
// =no_meta_relocate: merges leave the destination's arrays in place in the metadata arena;
// =no_meta_release: the arena keeps emptied pages (ObjectsFault() for the arena's own tests).
// Applied to `co`; anything else (or unset) leaves it as is.
inline void ApplyObjectsFault(CompactionOptions& co) {
  const char* e = std::getenv("FARMEM_OBJECTS_FAULT");
  const std::string v = e != nullptr ? e : "";
  if (v == "no_redraw") co.redraw_ids = false;
  if (v == "reuse_old_ids") co.fault_redraw_reuses_old_ids = true;
  if (v == "no_meta_relocate") co.fault_no_meta_relocate = true;
  if (!v.empty()) std::printf("[ fault    ] FARMEM_OBJECTS_FAULT=%s\n", e);
}

// =no_struct_grace: block struct pages are given back without waiting for the grace period;
// =no_struct_moves: structs of live blocks are never moved down (Store::CompactBlockStructs).
inline void ApplyObjectsFault(Store& st) {
  const char* e = std::getenv("FARMEM_OBJECTS_FAULT");
  const std::string v = e != nullptr ? e : "";
  st.set_struct_faults(v == "no_struct_grace", v == "no_struct_moves");
}

inline std::string ObjectsFault() {
  const char* e = std::getenv("FARMEM_OBJECTS_FAULT");
  return e != nullptr ? e : "";
}

}  // namespace farmem::corm::engine_testing
