// Child processes of the benchmarks that run other programs (farmemd, `farmem bench soak-child`,
// `farmem bench channels-node`, mpirun): fork + exec with redirected output, kill and reap.
// Called from the benchmark's main thread (or one generator thread); no state of its own.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "farmem/status.h"

namespace farmem::bench {

// fork + exec of args[0] (a path) with stdout/stderr redirected (-1 = /dev/null), stdin from
// /dev/null, every other descriptor closed; the child dies with us (PR_SET_PDEATHSIG).
// `cpu` >= 0 pins the child to that CPU before exec (what `taskset -c CPU` does).
Result<pid_t> Spawn(const std::vector<std::string>& args, int stdout_fd, int stderr_fd,
                    int cpu = -1);

// SIGKILL (or SIGTERM with a grace period, then SIGKILL) and reap.
void KillAndReap(pid_t pid, std::chrono::milliseconds grace);

// A loopback port that was free a moment ago (bind 127.0.0.1:0, then close): a child may still
// lose a race for it, so callers retry with another port or fail clearly.
Result<uint16_t> PickFreePort();

}  // namespace farmem::bench
