// The one-two-sided lookup driver over any data structure's callbacks (tx_data_structure.h):
// lookup_start, one-sided copies with lookup_end after each (following "continue at" steps),
// then the owner's RPC with rpc_lookup_end. Runs on the calling coroutine's Scheduler thread.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "farmem/coro.h"
#include "farmem/status.h"
#include "farmem/transport.h"
#include "tx/format/tx_data_structure.h"

namespace farmem::tx {

struct DsLookup {
  DsStep found;            // kFound: view into *copy_buf or *reply_buf
  bool one_sided = false;  // served by a one-sided copy
  bool tried_rpc = false;  // the owner was asked
  uint32_t reads = 0;      // one-sided copies made
};

struct DsLookupOptions {
  bool one_sided = true;     // false: the RPC only
  uint32_t max_reads = 16;   // one-sided copies in all (retries and continues), then the RPC
  uint32_t max_retries = 4;  // kRetry in a row, then the RPC
};

// One one-sided copy of `read` from the owner's `region` (peer, key; offset ignored) into *buf
// (resized to read.length); with read.seqlock the 8-byte word at read.offset is read before and
// after it into *recheck, each read after the previous one completed.
Task<Status> CopyDsRead(Scheduler& sched, RemoteRef region, const DsRead& read,
                        std::vector<std::byte>* buf, SeqlockRecheck* recheck);

// `region`: the owner's region (peer, key; offset ignored), `owner`: where the RPC goes.
// `copy_buf` / `reply_buf` (reply_buf sized to the largest reply) are reused across calls.
Task<Result<DsLookup>> OneTwoSidedLookup(Scheduler& sched, TxDsClient& ds, RemoteRef region,
                                         std::span<const std::byte> key, DsLookupOptions options,
                                         std::vector<std::byte>* copy_buf,
                                         std::vector<std::byte>* reply_buf);

}  // namespace farmem::tx
