// TATP (Telecom Application Transaction Processing) for `farmem bench tx`, independent of where it
// runs (farmem tx tables or Redis): the four tables and the secondary index as 8-byte keys and
// fixed-size values, the population rules, NURand subscriber ids, the seven transactions' inputs
// in the 35/35/10/2/14/2/2 mix and their expected success rates. Pure; any thread (no state).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "zipf.h"

namespace farmem::bench::tatp {

// Value sizes (FaSST's TATP, multiples of 8 as farmem tx tables need). Keys are all 8 bytes.
inline constexpr size_t kSubscriberBytes = 40;  // SUBSCRIBER
inline constexpr size_t kSecondaryBytes = 8;    // sub_nbr -> s_id index
inline constexpr size_t kAccessInfoBytes = 16;  // ACCESS_INFO
inline constexpr size_t kSpecialFacilityBytes = 8;
inline constexpr size_t kCallForwardingBytes = 16;

// SUBSCRIBER value layout: [0,8) sub_nbr (packed BCD), [8,10) bit_1..10, [10,15) hex_1..10
// (nibbles), [15,25) byte2_1..10, [28,32) msc_location, [32,36) vlr_location (u32 LE).
inline constexpr size_t kSubBitsOffset = 8;
inline constexpr size_t kSubVlrOffset = 32;
// SPECIAL_FACILITY value: [0] is_active, [1] error_cntrl, [2] data_a, [3,8) data_b.
inline constexpr size_t kSfIsActiveOffset = 0;
inline constexpr size_t kSfDataAOffset = 2;
// CALL_FORWARDING value: [0] end_time, [1,16) numberx (15 digits).
inline constexpr size_t kCfEndTimeOffset = 0;
// ACCESS_INFO value: [0] data1, [1] data2, [2,5) data3, [5,10) data4.

inline constexpr std::array<uint8_t, 3> kStartTimes = {0, 8, 16};

// Keys (8 bytes, little endian u64 each).
uint64_t SubscriberKey(uint64_t s_id);
uint64_t SecondaryKey(uint64_t s_id);  // the packed BCD of sub_nbr, the 15-digit s_id
uint64_t AccessInfoKey(uint64_t s_id, uint8_t ai_type);
uint64_t SpecialFacilityKey(uint64_t s_id, uint8_t sf_type);
uint64_t CallForwardingKey(uint64_t s_id, uint8_t sf_type, uint8_t start_time);
// sub_nbr: s_id zero-padded to 15 digits.
std::string SubNbr(uint64_t s_id);

// NURand's A for a population of `subscribers`: 65535 (<= 1M), 1048575 (<= 10M), else 2097151.
uint64_t NurandA(uint64_t subscribers);
// s_id = ((rand(0..A) | rand(1..P)) % P) + 1.
uint64_t NurandSubscriber(SplitMix64& rng, uint64_t subscribers);

// All rows of one subscriber (deterministic in (seed, s_id)).
struct Row {
  uint64_t key;
  std::vector<std::byte> value;
};
struct SubscriberRows {
  Row subscriber, secondary;
  std::vector<Row> access_info;       // 1-4 rows, distinct ai_type
  std::vector<Row> special_facility;  // 1-4 rows, distinct sf_type; is_active 1 with p = 0.85
  std::vector<Row> call_forwarding;   // per SF row, each start time present with p = 0.5
};
// Population. CALL_FORWARDING is populated at its steady state (FaSST): each start time present
// with p = 1/2, end_time uniform 1..24 — the distribution INSERT/DELETE_CALL_FORWARDING keep it
// at (equal rates, end_time drawn 1..24). The literal initial rule (0-3 rows, end_time = start +
// 1..8) gives GET_NEW_DESTINATION 14.8 % at first, drifting to this state's 20.4 %.
SubscriberRows Populate(uint64_t s_id, uint64_t seed);

enum class TxType : uint8_t {
  kGetSubscriberData = 0,
  kGetAccessData,
  kGetNewDestination,
  kUpdateSubscriberData,
  kUpdateLocation,
  kInsertCallForwarding,
  kDeleteCallForwarding,
};
inline constexpr size_t kTxTypes = 7;
const char* TxTypeName(TxType t);   // "GET_SUBSCRIBER_DATA", ...
const char* TxTypeShort(TxType t);  // "GSD", ...
// Percent of the mix: 35, 35, 10, 2, 14, 2, 2.
double MixPercent(TxType t);
// Expected share of successful transactions (percent) under this population: 100, 62.5, 20.42
// (computed exactly by ExpectedGetNewDestinationPercent), 62.5, 100, 31.25, 31.25.
double ExpectedSuccessPercent(TxType t);
double ExpectedGetNewDestinationPercent();
// The same expectations for one population (Populate with `seed`) under NURand subscriber ids,
// which is what a run's success rates scatter around: NURand concentrates the accesses on a few
// thousand subscribers (effective sample ~2,400 of 10,000), so the population's own share of rows
// differs from the spec's average (10,000 subscribers, seed 42: GET_ACCESS_DATA 61.95 %, not
// 62.5 %). Row presence and SPECIAL_FACILITY activity come from the population (over `samples`
// NURand draws of a fixed generator: ~0.015 points of sampling error at the default); the
// CALL_FORWARDING rows, which INSERT/DELETE_CALL_FORWARDING keep changing, at their steady state
// as in ExpectedSuccessPercent. Indexed by TxType.
std::array<double, kTxTypes> PopulationExpectedSuccessPercent(uint64_t subscribers, uint64_t seed,
                                                              uint64_t samples = 4'000'000);

// One transaction's inputs.
struct TxInput {
  TxType type = TxType::kGetSubscriberData;
  uint64_t s_id = 1;
  uint8_t sub_type = 1;            // ai_type or sf_type, 1..4
  uint8_t start_time = 0;          // 0, 8, 16
  uint8_t end_time = 1;            // 1..24 (GND: the given end time; ICF: the new row's)
  uint8_t bit = 0;                 // USD: new bit_1
  uint8_t data_a = 0;              // USD: new SF data_a
  uint32_t vlr_location = 0;       // UL
  std::array<char, 15> numberx{};  // ICF
};
TxInput NextInput(SplitMix64& rng, uint64_t subscribers);

// Little-endian u64 <-> 8 key bytes.
std::array<std::byte, 8> KeyBytes(uint64_t key);
uint64_t LoadU64(std::span<const std::byte> b);

}  // namespace farmem::bench::tatp

namespace farmem::bench::tatp {

// How one TATP transaction ended (conflicts are retried by the runners, so they never end one).
enum class Outcome : uint8_t { kSuccess, kUnsuccessful, kError };

// What a TATP run counted (one per client thread, merged). A transaction is "completed" when it
// committed or ended unsuccessful by the spec (a missing row, an inactive facility, an existing
// call forwarding): TATP's throughput counts both; conflict aborts are retried inside it.
struct Counts {
  std::array<uint64_t, kTxTypes> completed{};
  std::array<uint64_t, kTxTypes> success{};
  uint64_t conflicts = 0;           // conflict aborts retried (locked, validation, stale, EXEC nil)
  uint64_t errors = 0;              // transactions given up (an error that is not an abort)
  std::vector<int64_t> latency_ns;  // per completed transaction, retries included
  void Add(TxType t, Outcome o, int64_t ns) {
    if (o == Outcome::kError) {
      ++errors;
      return;
    }
    ++completed[static_cast<size_t>(t)];
    if (o == Outcome::kSuccess) ++success[static_cast<size_t>(t)];
    latency_ns.push_back(ns);
  }
  void Merge(const Counts& o) {
    for (size_t i = 0; i < kTxTypes; ++i) {
      completed[i] += o.completed[i];
      success[i] += o.success[i];
    }
    conflicts += o.conflicts;
    errors += o.errors;
    latency_ns.insert(latency_ns.end(), o.latency_ns.begin(), o.latency_ns.end());
  }
  uint64_t Completed() const {
    uint64_t n = 0;
    for (uint64_t c : completed) n += c;
    return n;
  }
};

}  // namespace farmem::bench::tatp
