// Whether libfabric shm copies one-sided reads from a given server with CMA (process_vm_readv by
// the reading process, page by page) or through its bounce buffers with memcpy, whose copies a
// pattern check cannot trust (docs/tier.md "Client"). Pure checks plus one syscall; any thread.
#pragma once

#include <string_view>

namespace farmem::tier {

// The server process id of a farmem fabric address ("<hex endpoint>.<pid>.<fd>.<table id>",
// src/transport/fabric), 0 when the address has none.
int ShmServerPid(std::string_view transport_address);

// True when shm will use CMA towards `server_pid`: FI_SHM_DISABLE_CMA (`disable_cma_env`, the
// variable's value or nullptr) is not set to a true value (1/yes/true/on, any case), and the
// kernel lets this process read the server's memory (a 1-byte process_vm_readv at address 0 fails
// with EFAULT, not EPERM: same uid or CAP_SYS_PTRACE, and Yama's ptrace_scope allows it). False
// when it cannot tell (no pid, the process is gone).
bool ShmUsesCma(int server_pid, const char* disable_cma_env);

}  // namespace farmem::tier
