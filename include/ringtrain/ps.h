// The parameter-server strategy (TensorFlow's ps/worker jobs), offered beside the ring so that
// users can measure the source documents' claim that the ring beats it on their own cluster.
//
// Servers hold the parameters, each a contiguous shard of the flat buffer with its own
// optimizer; workers compute gradients on their share of each global batch, push each shard's
// part to its server and pull the shard back. Two modes:
//  - sync (SyncReplicasOptimizer): a server applies the average of the first R gradients
//    computed for its current version; gradients computed for an older version are dropped and
//    counted. R = workers is synchronous data-parallel SGD; R < workers leaves backup workers,
//    so that a slow one no longer slows the job.
//    With --reproducible (sync, R = workers) the workers push their micro-shards' fixed-point
//    sums (exact_sum.h) instead, and the server adds them as integers: the update is the
//    ring's exact average, the same bits for any number of workers or servers.
//  - async: a server applies each gradient on arrival, provided it was computed on parameters
//    at most S updates old (the staleness bound); an older one is rejected, and the worker
//    recomputes it on the parameters the rejection carried back.
//
// This file holds the parts with no transport: the shard plan, a shard's server logic
// (ShardServer) and the statistics. ps_mpi.h moves them over MPI.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ringtrain/model.h"
#include "ringtrain/optim.h"

namespace ringtrain {

enum class PsMode { kSync, kAsync };
const char* to_string(PsMode mode);
PsMode parse_ps_mode(const std::string& text);  // "sync" | "async"; throws naming --ps-mode

// A server's part of the flat buffer, [begin, end).
struct ShardRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// Splits the flat buffer over `servers` in contiguous ranges cut at tensor boundaries, so that
// every tensor lives on one server (as TensorFlow places variables). Greedy: walking the
// tensors in buffer order, shard s ends at the boundary nearest to (s + 1) / servers of the
// whole, never leaving a later shard empty. tensor_sizes are in buffer order; a shard is
// empty only when there are fewer tensors than servers (refused: every server must hold one).
std::vector<ShardRange> plan_shards(std::span<const int64_t> tensor_sizes, int servers);
// The model's tensors' sizes in buffer order (param_views sorted by offset).
std::vector<int64_t> tensor_sizes(const Model& model);

// The exact sum's unit of scale inside a shard: the part of one gradient segment (exact_sum.h)
// that lies in the shard, and that segment's index in ExactGradSum::segments(). A segment may
// straddle two shards (they are cut at tensors, a segment may hold a layer's weights and
// bias); each part carries the segment's shift.
struct SegmentPiece {
  ShardRange range;  // absolute, within the shard
  size_t segment = 0;
};
// Per shard, the pieces of `segments` (which tile the buffer in order) that lie in it.
std::vector<std::vector<SegmentPiece>> split_segments(std::span<const ShardRange> shards,
                                                      std::span<const GradRange> segments);

// The largest staleness bin recorded; older (accepted) gradients count in the last bin.
inline constexpr int kStalenessBins = 64;

// What one server did. Fixed size, so that the job can gather every rank's with one allgather.
struct PsServerStats {
  int64_t updates = 0;         // optimizer steps applied to the shard
  int64_t gradients = 0;       // gradients received (pushes)
  int64_t aggregated = 0;      // sync: gradients that went into an update
  int64_t dropped_stale = 0;   // sync: gradients for an older version, dropped
  int64_t rejected_stale = 0;  // async: gradients over the staleness bound, sent back
  int64_t max_staleness = 0;   // async: the largest staleness accepted
  int64_t bytes_received = 0;  // every message, headers included
  int64_t bytes_sent = 0;
  int64_t staleness[kStalenessBins] = {};  // async: accepted gradients by staleness
};

struct ShardServerConfig {
  PsMode mode = PsMode::kSync;
  int workers = 1;
  int replicas_to_aggregate = 1;  // sync: R, 1 <= R <= workers
  int64_t max_staleness = 0;      // async: S >= 0
  // --reproducible (sync with R = workers only): pushes are fixed-point sums with one shift
  // per piece of this shard (split_segments), averaged exactly over `exact_micro_shards`
  // micro-shards. Empty: float gradients.
  std::vector<SegmentPiece> exact_pieces;
  int64_t exact_micro_shards = 0;
};

// One shard's server, without a transport: it receives pushes and says whom to answer. The
// parameters live here; the optimizer is this shard's (elementwise, so sharding changes no
// arithmetic).
class ShardServer {
 public:
  ShardServer(const ShardServerConfig& config, ShardRange range,
              std::unique_ptr<Optimizer> optimizer);

  // The starting point: the shard's parameters, its optimizer state (buffers as in
  // Optimizer::state(), empty for none), the optimizer's step count and the version.
  void start(std::span<const float> params, const std::vector<std::vector<float>>& state,
             int64_t optimizer_steps, int64_t version);

  // Where a pushed gradient must be received before push() is called: sync mode receives a
  // current gradient straight into the worker's slot (no copy); anything else lands in a
  // scratch buffer. Valid until the next push().
  std::span<float> gradient_buffer(int worker, int64_t version);
  // The same for an exact server (exact_pieces given): where a push's fixed-point sums (one
  // per parameter of the shard) and its shifts (one per piece) must be received.
  struct ExactPush {
    std::span<int64_t> sums;
    std::span<int32_t> shifts;
  };
  ExactPush exact_buffer(int worker, int64_t version);
  bool exact() const { return !config_.exact_pieces.empty(); }

  struct PushOutcome {
    bool accepted = false;  // applied now or held for this version's update
    bool applied = false;   // an update happened (the version advanced)
    int64_t staleness = 0;  // version - the gradient's version, at arrival
    // Workers to answer now with the current parameters; valid until the next push (it views
    // a buffer of the server's, so that a push allocates nothing).
    std::span<const int> answer;
  };
  // Worker `worker` pushes the gradient it computed on `version` (already in
  // gradient_buffer(worker, version)) with learning rate lr. Throws for a version from the
  // future or a worker that pushes twice for one version (a broken worker).
  PushOutcome push(int worker, int64_t version, float lr);

  int64_t version() const { return version_; }
  std::span<const float> params() const { return params_; }
  Optimizer& optimizer() { return *optimizer_; }
  const ShardRange& range() const { return range_; }
  PsServerStats& stats() { return stats_; }
  // Gradients of each worker that went into an update (sync) or were applied (async).
  const std::vector<int64_t>& applied_per_worker() const { return applied_per_worker_; }

 private:
  void apply(std::span<const float> gradient, float lr);
  // average_ = the exact average of the pending workers' fixed-point sums.
  void average_exactly();

  ShardServerConfig config_;
  ShardRange range_;
  std::unique_ptr<Optimizer> optimizer_;
  std::vector<float> params_;
  int64_t version_ = 0;
  // sync: one slot per worker for the current version, and who has filled theirs, in order.
  std::vector<std::vector<float>> slots_;
  std::vector<int> pending_;
  std::vector<int> answer_;  // what PushOutcome::answer views
  std::vector<float> average_;
  std::vector<float> scratch_;  // stale sync gradients, async gradients
  // Exact servers: per worker, the pushed sums and shifts of the current version.
  std::vector<std::vector<int64_t>> exact_sums_;
  std::vector<std::vector<int32_t>> exact_shifts_;
  std::vector<int64_t> exact_total_;
  std::vector<int64_t> applied_per_worker_;
  PsServerStats stats_;
};

// A staleness histogram as text: "0: 120, 1: 80, 2: 3 (max 2)".
std::string describe_staleness(const PsServerStats& stats);

}  // namespace ringtrain
