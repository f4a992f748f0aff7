// TATP population, inputs and expected outcomes (see tatp_workload.h). Pure functions.
#include "tatp_workload.h"

#include <algorithm>
#include <cstring>
#include <utility>

namespace farmem::bench::tatp {
namespace {

constexpr uint64_t kKeyShift = 16;  // (s_id << 16) | (type << 8) | start_time

void PutU32(std::vector<std::byte>& v, size_t at, uint32_t x) {
  std::memcpy(v.data() + at, &x, sizeof(x));
}

uint8_t Byte(SplitMix64& rng, uint64_t below) {
  return static_cast<uint8_t>(rng.Below(below));
}

// `count` distinct values of 1..4 (a random subset).
std::vector<uint8_t> DistinctTypes(SplitMix64& rng, size_t count) {
  std::array<uint8_t, 4> t = {1, 2, 3, 4};
  for (size_t i = 0; i < 3; ++i) std::swap(t[i], t[i + rng.Below(4 - i)]);
  return {t.begin(), t.begin() + static_cast<std::ptrdiff_t>(count)};
}

}  // namespace

uint64_t SubscriberKey(uint64_t s_id) {
  return s_id;
}

uint64_t SecondaryKey(uint64_t s_id) {
  // 15 decimal digits as nibbles (60 bits), most significant first, tag nibble 0xF on top.
  const std::string nbr = SubNbr(s_id);
  uint64_t k = 0xF;
  for (char c : nbr) k = (k << 4) | static_cast<uint64_t>(c - '0');
  return k;
}

uint64_t AccessInfoKey(uint64_t s_id, uint8_t ai_type) {
  return (s_id << kKeyShift) | (uint64_t{ai_type} << 8);
}
uint64_t SpecialFacilityKey(uint64_t s_id, uint8_t sf_type) {
  return (s_id << kKeyShift) | (uint64_t{sf_type} << 8);
}
uint64_t CallForwardingKey(uint64_t s_id, uint8_t sf_type, uint8_t start_time) {
  return (s_id << kKeyShift) | (uint64_t{sf_type} << 8) | start_time;
}

std::string SubNbr(uint64_t s_id) {
  std::string s = std::to_string(s_id);
  return std::string(s.size() < 15 ? 15 - s.size() : 0, '0') + s;
}

uint64_t NurandA(uint64_t subscribers) {
  if (subscribers <= 1000000) return 65535;
  if (subscribers <= 10000000) return 1048575;
  return 2097151;
}

uint64_t NurandSubscriber(SplitMix64& rng, uint64_t subscribers) {
  const uint64_t a = rng.Below(NurandA(subscribers) + 1);
  const uint64_t b = 1 + rng.Below(subscribers);
  return ((a | b) % subscribers) + 1;
}

SubscriberRows Populate(uint64_t s_id, uint64_t seed) {
  SplitMix64 rng(seed ^ (s_id * 0x9E3779B97F4A7C15ull));
  SubscriberRows r;
  r.subscriber.key = SubscriberKey(s_id);
  r.subscriber.value.assign(kSubscriberBytes, std::byte{0});
  auto& sv = r.subscriber.value;
  const uint64_t nbr = SecondaryKey(s_id);
  std::memcpy(sv.data(), &nbr, 8);
  const uint16_t bits = static_cast<uint16_t>(rng.Below(1u << 10));
  std::memcpy(sv.data() + kSubBitsOffset, &bits, 2);
  for (size_t i = 0; i < 5; ++i) sv[10 + i] = static_cast<std::byte>(Byte(rng, 256));   // hex
  for (size_t i = 0; i < 10; ++i) sv[15 + i] = static_cast<std::byte>(Byte(rng, 256));  // byte2
  PutU32(sv, 28, static_cast<uint32_t>(rng.Next()));                                    // msc
  PutU32(sv, kSubVlrOffset, static_cast<uint32_t>(rng.Next()));                         // vlr

  r.secondary.key = SecondaryKey(s_id);
  r.secondary.value.resize(kSecondaryBytes);
  std::memcpy(r.secondary.value.data(), &s_id, 8);

  for (uint8_t t : DistinctTypes(rng, 1 + rng.Below(4))) {
    Row row{AccessInfoKey(s_id, t), std::vector<std::byte>(kAccessInfoBytes)};
    for (size_t i = 0; i < 10; ++i)
      row.value[i] = static_cast<std::byte>(i < 2 ? Byte(rng, 256) : 'A' + Byte(rng, 26));
    r.access_info.push_back(std::move(row));
  }
  for (uint8_t t : DistinctTypes(rng, 1 + rng.Below(4))) {
    Row row{SpecialFacilityKey(s_id, t), std::vector<std::byte>(kSpecialFacilityBytes)};
    row.value[kSfIsActiveOffset] = static_cast<std::byte>(rng.Below(100) < 85 ? 1 : 0);
    row.value[1] = static_cast<std::byte>(Byte(rng, 256));
    row.value[kSfDataAOffset] = static_cast<std::byte>(Byte(rng, 256));
    for (size_t i = 3; i < 8; ++i) row.value[i] = static_cast<std::byte>('A' + Byte(rng, 26));
    r.special_facility.push_back(std::move(row));
    for (uint8_t st : kStartTimes) {
      if (rng.Below(2) == 0) continue;
      Row cf{CallForwardingKey(s_id, t, st), std::vector<std::byte>(kCallForwardingBytes)};
      cf.value[kCfEndTimeOffset] = static_cast<std::byte>(1 + rng.Below(24));
      for (size_t i = 1; i < 16; ++i) cf.value[i] = static_cast<std::byte>('0' + Byte(rng, 10));
      r.call_forwarding.push_back(std::move(cf));
    }
  }
  return r;
}

const char* TxTypeName(TxType t) {
  switch (t) {
    case TxType::kGetSubscriberData:
      return "GET_SUBSCRIBER_DATA";
    case TxType::kGetAccessData:
      return "GET_ACCESS_DATA";
    case TxType::kGetNewDestination:
      return "GET_NEW_DESTINATION";
    case TxType::kUpdateSubscriberData:
      return "UPDATE_SUBSCRIBER_DATA";
    case TxType::kUpdateLocation:
      return "UPDATE_LOCATION";
    case TxType::kInsertCallForwarding:
      return "INSERT_CALL_FORWARDING";
    case TxType::kDeleteCallForwarding:
      return "DELETE_CALL_FORWARDING";
  }
  return "?";
}

const char* TxTypeShort(TxType t) {
  static constexpr const char* kShort[kTxTypes] = {"GSD", "GAD", "GND", "USD", "UL", "ICF", "DCF"};
  return kShort[static_cast<size_t>(t)];
}

double MixPercent(TxType t) {
  static constexpr double kMix[kTxTypes] = {35, 35, 10, 2, 14, 2, 2};
  return kMix[static_cast<size_t>(t)];
}

double ExpectedGetNewDestinationPercent() {
  // SF row present (2.5 of 4 types on average) and active (0.85); then some CF row of that SF
  // with start_time <= the given one (each present with p = 1/2) and end_time (uniform 1..24) >
  // the given end_time (uniform 1..24). Exact over the inputs.
  double sum = 0;
  for (uint8_t st : kStartTimes) {
    const int eligible = st == 0 ? 1 : st == 8 ? 2 : 3;
    for (int et = 1; et <= 24; ++et) {
      const double q = 0.5 * static_cast<double>(24 - et) / 24.0;  // a given row qualifies
      double none = 1;
      for (int i = 0; i < eligible; ++i) none *= 1 - q;
      sum += 1 - none;
    }
  }
  return 100.0 * 0.625 * 0.85 * sum / (3.0 * 24.0);
}

double ExpectedSuccessPercent(TxType t) {
  switch (t) {
    case TxType::kGetSubscriberData:
    case TxType::kUpdateLocation:
      return 100.0;
    case TxType::kGetAccessData:
    case TxType::kUpdateSubscriberData:
      return 62.5;
    case TxType::kGetNewDestination:
      return ExpectedGetNewDestinationPercent();
    case TxType::kInsertCallForwarding:
    case TxType::kDeleteCallForwarding:
      return 31.25;
  }
  return 0;
}

std::array<double, kTxTypes> PopulationExpectedSuccessPercent(uint64_t subscribers, uint64_t seed,
                                                              uint64_t samples) {
  std::array<double, kTxTypes> out{};
  out[static_cast<size_t>(TxType::kGetSubscriberData)] = 100.0;
  out[static_cast<size_t>(TxType::kUpdateLocation)] = 100.0;
  if (subscribers == 0 || samples == 0) return out;
  // Per subscriber: ACCESS_INFO rows, SPECIAL_FACILITY rows and active ones (each 0..4).
  struct Shares {
    uint8_t ai = 0, sf = 0, active = 0;
  };
  std::vector<Shares> pop(subscribers + 1);
  for (uint64_t s = 1; s <= subscribers; ++s) {
    const SubscriberRows r = Populate(s, seed);
    pop[s].ai = static_cast<uint8_t>(r.access_info.size());
    pop[s].sf = static_cast<uint8_t>(r.special_facility.size());
    for (const Row& row : r.special_facility)
      pop[s].active += row.value[kSfIsActiveOffset] == std::byte{1} ? 1 : 0;
  }
  // GET_NEW_DESTINATION's chance once an active SPECIAL_FACILITY row is found (steady-state
  // CALL_FORWARDING rows): the spec's figure without its 0.625 x 0.85.
  const double gnd_given_active = ExpectedGetNewDestinationPercent() / (0.625 * 0.85);
  SplitMix64 rng(0x7A7Bull);  // fixed: the expectation of a population is a constant
  uint64_t ai = 0, sf = 0, active = 0;
  for (uint64_t i = 0; i < samples; ++i) {
    const Shares& sh = pop[NurandSubscriber(rng, subscribers)];
    ai += sh.ai;
    sf += sh.sf;
    active += sh.active;
  }
  // The sub_type of an input is uniform over 1..4, independent of the subscriber.
  const double n = 4.0 * static_cast<double>(samples);
  const double p_ai = static_cast<double>(ai) / n, p_sf = static_cast<double>(sf) / n;
  const double p_active = static_cast<double>(active) / n;
  out[static_cast<size_t>(TxType::kGetAccessData)] = 100.0 * p_ai;
  out[static_cast<size_t>(TxType::kUpdateSubscriberData)] = 100.0 * p_sf;
  out[static_cast<size_t>(TxType::kGetNewDestination)] = p_active * gnd_given_active;
  // INSERT: the SF row exists and the CF row does not (p = 1/2); DELETE: the CF row exists, which
  // needs its SF row (p = 1/2 given it).
  out[static_cast<size_t>(TxType::kInsertCallForwarding)] = 100.0 * p_sf * 0.5;
  out[static_cast<size_t>(TxType::kDeleteCallForwarding)] = 100.0 * p_sf * 0.5;
  return out;
}

TxInput NextInput(SplitMix64& rng, uint64_t subscribers) {
  TxInput in;
  const uint64_t pick = rng.Below(100);
  uint64_t acc = 0;
  for (size_t i = 0; i < kTxTypes; ++i) {
    acc += static_cast<uint64_t>(MixPercent(static_cast<TxType>(i)));
    if (pick < acc) {
      in.type = static_cast<TxType>(i);
      break;
    }
  }
  in.s_id = NurandSubscriber(rng, subscribers);
  in.sub_type = static_cast<uint8_t>(1 + rng.Below(4));
  in.start_time = kStartTimes[rng.Below(3)];
  in.end_time = static_cast<uint8_t>(1 + rng.Below(24));
  in.bit = static_cast<uint8_t>(rng.Below(2));
  in.data_a = static_cast<uint8_t>(rng.Below(256));
  in.vlr_location = static_cast<uint32_t>(rng.Next());
  for (char& c : in.numberx) c = static_cast<char>('0' + rng.Below(10));
  return in;
}

std::array<std::byte, 8> KeyBytes(uint64_t key) {
  std::array<std::byte, 8> b;
  std::memcpy(b.data(), &key, 8);
  return b;
}

uint64_t LoadU64(std::span<const std::byte> b) {
  uint64_t v = 0;
  std::memcpy(&v, b.data(), std::min<size_t>(8, b.size()));
  return v;
}

}  // namespace farmem::bench::tatp
