// WaitFor: the one deadline-bounded poll of the tests ("wait for the event, the deadline only
// bounds a broken implementation", docs/testing.md). Header-only test code, any thread.
#pragma once

#include <chrono>
#include <thread>

namespace farmem::testing {

// Waits until `pred` holds or `limit` passes, polling every 5 ms; returns pred().
template <typename Pred>
inline bool WaitFor(Pred pred, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return pred();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace farmem::testing
