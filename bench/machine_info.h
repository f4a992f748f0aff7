// What every benchmark's JSON records about the machine it ran on (CPUs, kernel, CPU model, load,
// date) and how busy the CPUs were just before the run: figures are only comparable with these.
#pragma once

#include <chrono>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "farmem/status.h"

namespace farmem::bench {

// {"nproc", "kernel", "arch", "hostname", "cpu", "loadavg_at_start", "date"}; a field that cannot
// be read is left out.
nlohmann::json MachineInfo();

// Fraction of all CPU time spent non-idle during `window` (from /proc/stat); nullopt if unreadable.
std::optional<double> CpuBusyFraction(std::chrono::milliseconds window);

// Restricts the calling thread (and every thread it creates afterwards) to `cpus`.
Status PinToCpus(const std::vector<int>& cpus);

}  // namespace farmem::bench
