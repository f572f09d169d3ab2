// The run plan: everything mnist_train derives from its options and the job before it trains
// (batch sizes, step counts, the learning-rate schedule, whether and how gradients are
// averaged, and what a resume changes), as one pure function, so that each rule is tested
// without starting ranks (tests/test_run_plan.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "options.h"
#include "ringtrain/grad_sync.h"
#include "ringtrain/optim.h"

namespace ringtrain::app {

// What the plan needs to know of the job.
struct JobShape {
  int ranks = 1;       // every rank of the job
  int data_ranks = 1;  // the ranks that share the global batch (the workers under ps)
  int local_size = 1;  // ranks on this node
  int cores = 1;       // this node's cores
  Device device = Device::kCpu;
  int64_t train_images = 0;
};

// What a resumed checkpoint fixes.
struct ResumePoint {
  int64_t step = 0;
  int64_t global_batch = 0;
  int64_t ranks = 1;        // the data ranks that wrote it
  int64_t micro_batch = 0;  // its --reproducible --micro-batch; 0 without --reproducible
};

struct RunPlan {
  // Per rank and pass: --batch-size, or the global batch / (ranks x passes).
  int64_t batch_size = 0;
  int64_t accumulate_steps = 1;  // passes per optimizer step
  int64_t global_batch = 0;      // samples per optimizer step, over every rank and pass
  // --reproducible: the global batch's micro-shards, and how many each data rank computes
  // (0 and 0 otherwise).
  int64_t micro_shards = 0;
  int64_t local_micro_shards = 0;
  int64_t steps_per_epoch = 0;
  int64_t total_steps = 0;
  int64_t start_step = 0;
  LrSchedule schedule;  // --lr-scaling and --warmup-epochs applied, validated
  // A GradSync averages the gradients (the ring strategy on several ranks, or a slowed
  // transport under test); its buckets and whether it overlaps backward.
  bool average_gradients = false;
  GradSyncConfig grad_sync;
  std::string overlap_reason;  // for the log: why grad_sync.overlap is what it is
  // Set when the checkpoint was written by another rank count or in the other mode (with or
  // without --reproducible): the line the chief warns with.
  std::string resume_note;
};

// Throws a usage Error (exit 2) for a range that only this job shows (check_derived_ranges),
// and refuses (exit 3, every rank) a checkpoint whose global batch these ranks cannot keep.
RunPlan plan_run(const Options& o, const JobShape& job, const std::optional<ResumePoint>& resumed);

}  // namespace ringtrain::app
