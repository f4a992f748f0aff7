// What every benchmark's JSON records about the machine it ran on (CPUs, kernel, CPU model, load,
// date) and how busy the CPUs were just before the run: figures are only comparable with these.
#pragma once

#include <chrono>
#include <optional>

#include <nlohmann/json.hpp>

namespace farmem::bench {

// {"nproc", "kernel", "arch", "hostname", "cpu", "loadavg_at_start", "date"}; a field that cannot
// be read is left out.
nlohmann::json MachineInfo();

// Fraction of all CPU time spent non-idle during `window` (from /proc/stat); nullopt if unreadable.
std::optional<double> CpuBusyFraction(std::chrono::milliseconds window);

}  // namespace farmem::bench
