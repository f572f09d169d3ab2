// The chief's checkpoint writes, shared by the ring's loop and the parameter-server chief: the
// header every checkpoint of this run carries, the write itself (with the crash-consistency
// test's kill point), and its log line and metrics record.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "options.h"
#include "ringtrain/checkpoint.h"
#include "ringtrain/comm.h"
#include "ringtrain/report.h"

namespace ringtrain::app {

// What every checkpoint of this run says about the run.
struct CheckpointHeader {
  std::string model;
  std::string layers;  // Model::signature()
  int64_t num_params = 0;
  int64_t steps_per_epoch = 1;
  uint64_t seed = 0;
  int64_t global_batch = 0;
  int ranks = 1;  // the data ranks
  LrSchedule schedule;
  std::string optimizer;
};
// A checkpoint of `step` with the header filled in; the caller adds the state.
Checkpoint checkpoint_at(const CheckpointHeader& header, int64_t step);

class CheckpointWriter {
 public:
  // Writes nothing without --checkpoint-dir. A long write posts progress on `board` (the
  // others wait for the chief in their next collective).
  CheckpointWriter(const Options& o, MetricsWriter& metrics, ProgressBoard& board);
  bool enabled() const { return dir_.has_value(); }
  // Writes `c` (the chief only), logs "checkpoint: step {}{note} written to {} in {} ms" and
  // records it in the metrics. Non-finite values are refused with advice, naming the step;
  // the checkpoints already written stay intact.
  void save(const Checkpoint& c, const std::string& note = "");

 private:
  const Options& o_;
  MetricsWriter& metrics_;
  std::optional<CheckpointDir> dir_;
};

}  // namespace ringtrain::app
