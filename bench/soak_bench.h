// `farmem bench soak`: legitimate clients (objects and raw, read/write mix, every read checked)
// against a default farmemd child, in rounds without and with hostile clients (slow readers,
// connection floods, garbage, clients killed mid-operation). Main thread drives the rounds.
#pragma once

#include <cstdint>
#include <string>

namespace farmem {

struct SoakBenchOptions {
  double minutes = 10;  // whole run (rounds + set-up + leak check); --quick: about 1.5
  bool quick = false;
  int rounds = 0;  // baseline/hostile pairs; 0 = minutes rounded, 5..30 (--quick: 5)
  // Legitimate load: objects and raw ranges held, coroutines per client thread.
  int objects = 2000;
  int raw_ranges = 256;
  int inflight = 8;
  // Hostile load during the hostile rounds.
  int slow_readers = 2;
  int flood_connections = 300;  // held open per port (bootstrap and data)
  int garbage_per_second = 20;
  int killed_clients = 2;  // child processes alive at once, each SIGKILLed mid-run
  // Loop iterations per second of each killed client (0 = as fast as it can). Paced because a
  // child at full speed is one more saturating client: its load is fair share, not an attack.
  double child_ops_per_second = 200;
  // Nice value of the hostile generator thread and the killed clients (inherited through fork).
  // Hostile hosts would not share farmemd's CPUs; on a 2-CPU machine at nice 0 the generators'
  // own CPU is most of what the legitimate clients lose. farmemd's work for them is not niced.
  int hostile_nice = 19;
  std::string farmemd;  // binary; "" = next to farmem, else PATH
  std::string json_path = "soak.json";
};

// Exit code: 0 ran (targets may MISS), 1 failed, 2 bad options.
int RunSoakBench(SoakBenchOptions options);

// The hidden `farmem bench soak-child`: a client that allocates objects and raw ranges and writes
// them until it is killed (never returns before `max_seconds`). Reports one byte per allocation
// on stdout ('o' object, 'r' raw range).
struct SoakChildOptions {
  std::string connect;
  std::string token = "farmem";
  uint64_t seed = 1;
  double max_seconds = 30;
  double ops_per_second = 0;  // loop iterations (an object op and a raw op each); 0 = unpaced
};
int RunSoakChild(const SoakChildOptions& options);

}  // namespace farmem
