// What mnist_train's parts share: the options, and the setup that the parameter-server
// strategy (ps_strategy.cpp) takes over from the common start of run() in mnist_train.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "ringtrain/checkpoint.h"
#include "ringtrain/data.h"
#include "ringtrain/model.h"
#include "ringtrain/mpi_comm.h"
#include "ringtrain/optim.h"

namespace ringtrain::app {

struct Options {
  std::string data_dir;
  std::string model = "mlp";
  std::vector<int64_t> hidden;
  int64_t epochs = 1;
  int64_t steps = 0;
  int64_t batch_size = 32;
  OptimizerConfig optimizer;
  LrSchedule schedule;
  double warmup_epochs = 0.0;
  float ema_decay = 0.0f;
  uint64_t seed = 42;
  int threads = 1;
  std::string device = "auto";
  bool cuda_graphs = false;
  bool data_on_gpu = false;
  std::string conv_impl = "direct";
  int64_t log_every = 100;
  int64_t eval_every = 0;
  int64_t eval_batch = 1000;
  std::string metrics_out;
  std::string save_params;
  std::string log_level = "info";
  std::string allreduce = "ring";
  std::string overlap = "auto";
  bool no_overlap = false;
  double fusion_threshold_mb = 4.0;
  double first_bucket_mb = 0.25;
  std::string lr_scaling = "none";
  int64_t check_replicas = 0;
  // Strategies (docs/strategies.md).
  std::string strategy = "ring";  // ring | ps | local-sgd
  int num_ps = 1;
  std::string ps_mode = "sync";
  int replicas_to_aggregate = 0;  // 0: every worker
  int64_t max_staleness = -1;     // -1: 2 x workers
  int64_t average_every = 8;
  // Checkpoints and failures.
  std::string checkpoint_dir;
  int64_t checkpoint_every = 0;
  double checkpoint_secs = 0.0;
  int keep_checkpoints = 3;
  std::string resume = "auto";
  double collective_timeout = 60.0;
  bool check_finite = false;
  int64_t max_bad_steps = 5;
  bool batch_size_given = false;         // set from the command line: --batch-size was passed
  std::vector<std::string> flags_given;  // the strategies' flags that were passed
  // Testing only.
  std::string test_kill_in_checkpoint;  // the chief kills itself at this point of the write...
  int64_t test_kill_in_checkpoint_step = -1;  // ...of the checkpoint of this step
  int test_preempt_rank = -1;                 // this rank behaves as if SIGTERM arrived...
  int64_t test_preempt_at_step = -1;          // ...when it starts this step
  double test_comm_delay_ms = 0.0;
  int test_perturb_rank = -1;
  int test_fail_rank = -1;
  int64_t test_fail_at_step = -1;
  int test_stall_rank = -1;
  int64_t test_stall_at_step = -1;
  double test_stall_seconds = 0.0;
  int test_nan_rank = -1;
  std::vector<int64_t> test_nan_steps;
  int test_slow_rank = -1;
  double test_slow_ms = 0.0;
  bool test_stall_at_setup = false;     // --test-stall-rank stalls before the configuration check
  bool test_stall_after_end = false;    // ...or after its last writes, before the final barrier
  double test_slow_transport_ms = 0.0;  // every piece of a broadcast / MPI_Allreduce waits this
  double test_long_compute_ms = 0.0;    // --strategy ps: each worker step computes this long
};

// Registers every flag of mnist_train on `app`, writing into `o` (flags.cpp).
void add_flags(CLI::App& app, Options& o);
// The flags' ranges that depend on this job (flags.cpp), checked where run() derives the
// global batch and the step counts: --batch-size x data_ranks at most train_images, --epochs
// and --warmup-epochs x steps per epoch within the step limit. data_ranks: the ranks that share
// the global batch (the workers under --strategy ps). Every rank throws the same Error, exit 2,
// naming the flag and its allowed range for this job.
void check_derived_ranges(const Options& o, int data_ranks, int64_t train_images);

// What run() has settled before it hands over to a strategy with its own loop.
struct StrategySetup {
  const MnistData& data;
  std::string data_dir;
  Model& model;
  Context& ctx;
  LrSchedule schedule;
  const std::optional<Checkpoint>& resumed;
  int64_t start_step = 0;
  int64_t total_steps = 0;
  int64_t steps_per_epoch = 0;
  int64_t global_batch = 0;
};

// --strategy ps: this rank's part (server or worker) from setup to summary. world: every
// rank, watched by the watchdog; job: the same ranks with the workers first (job rank 0, the
// chief, is worker 0), the first --num-ps world ranks last.
int run_parameter_servers(const Options& o, MpiComm& world, MpiComm& job,
                          const StrategySetup& setup);

// Refuses a checkpoint that cannot continue this run (same on every rank: exit 3).
[[noreturn]] void refuse(const std::string& message);
void check_checkpoint_fits(const Checkpoint& c, const Options& o, const Model& model,
                           const Optimizer& optimizer, size_t optimizer_buffers);
std::string describe_schedule(const LrSchedule& s);
// --test-stall-rank sleeps --test-stall-seconds `where` ("at step 5", "in set-up", ...).
void stall_for_test(const Options& o, int rank, const std::string& where);
// --test-fail-rank, --test-stall-rank, --test-slow-rank: the failures the tests inject.
void inject_test_failures(const Options& o, int rank, int64_t step);

}  // namespace ringtrain::app
