// Storm's data-structure callbacks (docs/tx.md "Data structures"): what a remote data structure
// gives the transaction layer so that its reads are one-two-sided. TxDsClient's callbacks run on
// the reading transaction's thread (an object shared by threads must be thread-safe);
// TxDsOwner::rpc_handler on the owner's RPC threads. The hash table is the first user
// (tx_client.cc's TxHashTableDs, TxService), tx_lookup.h the driver; a user's data structure
// joins transactions through TxClient::add_data_structure (docs/tx.md "User data structures").
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "farmem/status.h"
#include "farmem/tx_ds.h"
#include "tx/format/tx_layout.h"

namespace farmem::tx {

// The callbacks are public types (farmem/tx_ds.h): a user's data structure implements them with
// the installed headers only. These names are the tx layers' own spelling of them.
using DsRead = ::farmem::TxDsRead;
inline constexpr uint32_t kMaxDsRead = ::farmem::kTxMaxDsRead;
using DsStep = ::farmem::TxDsStep;
using TxDsClient = ::farmem::TxDsClient;
using TxDsOwner = ::farmem::TxDsOwner;

}  // namespace farmem::tx
