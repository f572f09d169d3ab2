// mnist_train's options: every flag's value, the choice flags as enums, and the rules that
// check them: single ranges when they are parsed (flags.cpp), and every rule that combines
// flags, or flags with the job (ranks, device, data), in one place (flag_rules.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "ringtrain/allreduce.h"
#include "ringtrain/context.h"
#include "ringtrain/optim.h"
#include "ringtrain/ps.h"

namespace ringtrain::app {

enum class Strategy { kRing, kParameterServers, kLocalSgd };
const char* to_string(Strategy strategy);  // "ring", "ps", "local-sgd"
// --overlap (and --no-overlap, which is --overlap off).
enum class OverlapChoice { kAuto, kOn, kOff };
const char* to_string(OverlapChoice choice);  // "auto", "on", "off"
enum class LrScaling { kNone, kLinear };
const char* to_string(LrScaling scaling);  // "none", "linear"

struct Options {
  std::string data_dir;
  std::string model = "mlp";
  std::vector<int64_t> hidden;
  int64_t epochs = 1;
  int64_t steps = 0;
  int64_t batch_size = 32;
  // --global-batch-size: the samples of one step over every data rank (0: --batch-size x
  // ranks). The per-rank batch is this / ranks.
  int64_t global_batch_size = 0;
  // --accumulate-steps: forward/backward passes per optimizer step, each on a batch of
  // --batch-size; the global batch (of an optimizer step) is batch x ranks x this.
  int64_t accumulate_steps = 1;
  // --reproducible: micro-shards of --micro-batch rows, averaged exactly (exact_sum.h), so
  // that the result does not depend on the rank count.
  bool reproducible = false;
  int64_t micro_batch = 8;
  OptimizerConfig optimizer;
  LrSchedule schedule;
  double warmup_epochs = 0.0;
  float ema_decay = 0.0f;
  uint64_t seed = 42;
  int threads = 1;
  std::string device = "auto";
  bool cuda_graphs = false;
  bool data_on_gpu = false;
  ConvImpl conv_impl = ConvImpl::kDirect;
  int64_t log_every = 100;
  int64_t eval_every = 0;
  int64_t eval_batch = 1000;
  std::string metrics_out;
  std::string save_params;
  // The final weights (the EMA ones under --ema-decay) in PyTorch's layout (model_export.h).
  std::string export_onnx;
  std::string export_safetensors;
  std::string timeline;  // --timeline: the Chrome trace file rank 0 writes (timeline.h)
  std::string log_level = "info";
  AllreduceAlgorithm allreduce = AllreduceAlgorithm::kRing;
  GradWire grad_wire = GradWire::kFp32;  // --grad-wire: what the gradient ring sends (wire.h)
  OverlapChoice overlap = OverlapChoice::kAuto;
  double fusion_threshold_mb = 4.0;
  double first_bucket_mb = 0.25;
  LrScaling lr_scaling = LrScaling::kNone;
  int64_t check_replicas = 0;
  // Strategies (docs/strategies.md).
  Strategy strategy = Strategy::kRing;
  int num_ps = 1;
  PsMode ps_mode = PsMode::kSync;
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
  std::vector<std::string> flags_given;  // the strategies' flags (and --allreduce) passed
  std::string effective_config;          // as --print-config prints it (config_file.h)
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
  std::string test_dump_logits;  // the chief writes the exported weights' test-set logits here
};

// A flag, or a combination of flags, that this job cannot run with: the same usage Error
// (exit 2) on every rank, since every rank decides from the same flags.
[[noreturn]] void refuse_usage(const std::string& message);
// Registers every flag of mnist_train on `app`, writing into `o` (flags.cpp).
void add_flags(CLI::App& app, Options& o);
// The flags' ranges that depend on this job (flags.cpp), checked where run() derives the
// global batch and the step counts: --batch-size x data_ranks at most train_images, --epochs
// and --warmup-epochs x steps per epoch within the step limit. data_ranks: the ranks that share
// the global batch (the workers under --strategy ps). Every rank throws the same Error, exit 2,
// naming the flag and its allowed range for this job.
void check_derived_ranges(const Options& o, int data_ranks, int64_t train_images);

// Every rule that combines flags, or flags with this job (the rank count and the device),
// checked before anything is built, the same on every rank (every rank decides from the same
// flags): a usage Error (exit 2) naming the flags. --strategy ps and local-sgd run on the CPU:
// `device` is set to cpu for them (said in the log).
void check_flag_combinations(Options& o, int ranks);
// The rules that need the device this rank will train on (--cuda-graphs, --conv-impl,
// --data-on-gpu need a GPU; --cuda-graphs needs one rank).
void check_device_flags(const Options& o, int ranks, const DeviceChoice& device);

}  // namespace ringtrain::app
