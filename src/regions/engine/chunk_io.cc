// One-sided chunk transfers for the store and rmmap (chunk_io.h). Runs on the calling thread's
// Scheduler; nothing here is shared between threads.
#include "regions/engine/chunk_io.h"

#include <chrono>

namespace farmem::regions {

Status RunChunkPieces(Scheduler& s, const std::vector<ChunkPiece>& pieces, bool write) {
  if (pieces.empty()) return Status::OK();
  std::vector<Status> st(pieces.size());
  for (size_t i = 0; i < pieces.size(); ++i) {
    s.spawn([](Scheduler& s, ChunkPiece p, Status* out, bool write) -> Task<void> {
      if (write)
        *out = co_await s.write(p.ref, p.src, p.len, true);
      else
        *out = co_await s.read(p.ref, p.dst, p.len);
    }(s, pieces[i], &st[i], write));
  }
  FARMEM_RETURN_IF_ERROR(s.run(std::chrono::seconds(60)));
  for (const Status& x : st)
    if (!x.ok()) return x;
  return Status::OK();
}

}  // namespace farmem::regions
