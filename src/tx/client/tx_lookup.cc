// OneTwoSidedLookup (tx_lookup.h): the Storm read loop, data-structure independent. Runs on the
// caller's Scheduler thread.
#include "tx/client/tx_lookup.h"

#include <string>

#include "node/rpc_call.h"

namespace farmem::tx {

Task<Status> CopyDsRead(Scheduler& sched, RemoteRef region, const DsRead& read,
                        std::vector<std::byte>* buf, SeqlockRecheck* recheck) {
  buf->resize(read.length);
  RemoteRef ref = region;
  ref.offset = read.offset;
  if (!read.seqlock) co_return co_await sched.read(ref, buf->data(), buf->size());
  // Version, copy, version again, in this order (one system call on shm).
  const ReadSegment segments[] = {{ref.offset, &recheck->before, 8},
                                  {ref.offset, buf->data(), buf->size()},
                                  {ref.offset, &recheck->after, 8}};
  co_return co_await sched.read_ordered(ref.peer, ref.key, segments);
}

Task<Result<DsLookup>> OneTwoSidedLookup(Scheduler& sched, TxDsClient& ds, RemoteRef region,
                                         std::span<const std::byte> key, DsLookupOptions options,
                                         std::vector<std::byte>* copy_buf,
                                         std::vector<std::byte>* reply_buf) {
  DsLookup out;
  if (options.one_sided) {
    DsStep step = ds.lookup_start(key);
    DsRead last;
    uint32_t retries = 0;
    while (out.reads < options.max_reads &&
           (step.kind == DsStep::kRead || step.kind == DsStep::kRetry)) {
      if (step.kind == DsStep::kRetry) {
        if (++retries > options.max_retries) break;
      } else {
        retries = 0;
        last = step.read;
      }
      // A data structure's bad step (a corrupted cache entry, a racy chain pointer) must not
      // become a huge or unaligned read: it ends the one-sided part.
      if (last.length < 8 || last.length > kMaxDsRead || last.length % 8 != 0) break;
      ++out.reads;
      SeqlockRecheck recheck{};
      Status st = co_await CopyDsRead(sched, region, last, copy_buf, &recheck);
      if (!st.ok()) co_return st;
      step = ds.lookup_end(*copy_buf, last, last.seqlock ? &recheck : nullptr, key);
      if (step.kind == DsStep::kFound) {
        out.found = step;
        out.one_sided = true;
        co_return out;
      }
    }
  }
  out.tried_rpc = true;
  const std::vector<std::byte> req = ds.rpc_request(key);
  Result<std::span<const std::byte>> r =
      co_await CallRpc(sched, region.peer, ds.rpc_opcode(), req, *reply_buf,
                       "lookup RPC " + std::to_string(ds.rpc_opcode()));
  if (!r.ok()) co_return r.status();
  Result<DsStep> step = ds.rpc_lookup_end(*r, key);
  if (!step.ok()) co_return step.status();
  if (step->kind != DsStep::kFound) co_return Status::Internal("rpc_lookup_end: not kFound");
  out.found = *step;
  co_return out;
}

}  // namespace farmem::tx
