// What data parallelism adds around the training step: the distributed sampler's shard, the
// initial broadcast, evaluation split over the ranks, and the replica check.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ringtrain/comm.h"
#include "ringtrain/ring.h"
#include "ringtrain/train.h"

namespace ringtrain {

// The distributed sampler. Every rank shuffles the same epoch order (same seed, same epoch);
// step s of an epoch takes the global batch order[s*N*b, (s+1)*N*b) and rank r its slice
// [r*b, (r+1)*b). So N ranks with batch b see, step for step, exactly the samples that one
// rank with batch N*b sees, and every rank runs the same number of steps per epoch:
// floor(count / (N*b)) (the last partial global batch is dropped).
std::span<const int64_t> rank_batch(std::span<const int64_t> epoch_order, int64_t step_in_epoch,
                                    int64_t batch_per_rank, int rank, int ranks);

// Rank `root`'s parameters, bit for bit, on every rank.
void broadcast_params(Comm& comm, Model& model, int root = 0);

// Each rank evaluates its contiguous share of data (rank r: [r*T/N, (r+1)*T/N)); the counts
// and loss sums are added over ranks, so every rank returns the result for the whole set.
EvalResult evaluate_sharded(Comm& comm, Model& model, const Dataset& data, int64_t batch_size,
                            Batch& scratch, Context& ctx);

// Compares a hash of every parameter tensor across ranks. Throws (on every rank, with the same
// message) naming the ranks that differ from rank 0 and the first parameter that differs.
void check_replicas(Comm& comm, const Model& model, int64_t step);

// One setting that every rank must share (the model, the per-rank batch, the seed, the data
// sizes, the code version, ...), as text.
struct ConfigField {
  std::string name;
  std::string value;
};
// Collective. Compares every rank's fields with rank 0's (hashes of the whole values; the
// first 55 characters travel along for the message). On any difference every rank throws the
// same Error (ExitCode::kBadInput, on_every_rank) naming each differing field and rank with
// both values, before anything is trained.
void check_config_consistency(Comm& comm, const std::vector<ConfigField>& fields);

}  // namespace ringtrain
