// One-sided transfers of a region's bytes: a read or write split at chunk boundaries into pieces,
// all in flight at once on one Scheduler. Used by the store (RegionStore) and by rmmap's mount
// backing, which read and write the same chunks.
#pragma once

#include <cstddef>
#include <vector>

#include "farmem/coro.h"
#include "farmem/node.h"
#include "farmem/status.h"

namespace farmem::regions {

// One one-sided transfer: `len` bytes at `ref`, into `dst` (read) or from `src` (write).
struct ChunkPiece {
  RemoteRef ref;
  std::byte* dst = nullptr;        // read
  const std::byte* src = nullptr;  // write
  size_t len = 0;
};

// Runs every piece at once on `s`; writes are delivery-complete (acknowledged only once the bytes
// reached remote memory). Returns the scheduler's error, else the first failed piece's status,
// unchanged: callers word it for their users. Every operation ends within the transport's
// op_timeout; the scheduler's 60 s bound is a second line.
Status RunChunkPieces(Scheduler& s, const std::vector<ChunkPiece>& pieces, bool write);

}  // namespace farmem::regions
