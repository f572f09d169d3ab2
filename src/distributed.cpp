// Sampler shards, broadcast, sharded evaluation, replica checks (see distributed.h).
#include "ringtrain/distributed.h"

#include <chrono>
#include <thread>

#include <fmt/format.h>

#include "ringtrain/check.h"

namespace ringtrain {

std::span<const int64_t> rank_batch(std::span<const int64_t> epoch_order, int64_t step_in_epoch,
                                    int64_t batch_per_rank, int rank, int ranks) {
  const int64_t global_batch = batch_per_rank * ranks;
  const int64_t begin = step_in_epoch * global_batch + rank * batch_per_rank;
  RINGTRAIN_CHECK(begin + batch_per_rank <= static_cast<int64_t>(epoch_order.size()),
                  "step {} of the epoch needs samples up to {}, the epoch has {}", step_in_epoch,
                  begin + batch_per_rank, epoch_order.size());
  return epoch_order.subspan(static_cast<size_t>(begin), static_cast<size_t>(batch_per_rank));
}

void broadcast_params(Comm& comm, Model& model, int root) {
  comm.broadcast(model.params().data(), static_cast<size_t>(model.num_params()) * sizeof(float),
                 root);
}

EvalResult evaluate_sharded(Comm& comm, Model& model, const Dataset& data, int64_t batch_size,
                            Batch& scratch, Context& ctx) {
  const int64_t ranks = comm.size(), rank = comm.rank();
  const int64_t begin = data.count * rank / ranks, end = data.count * (rank + 1) / ranks;
  const EvalResult mine = evaluate(model, data, begin, end, batch_size, scratch, ctx);
  EvalResult total;
  // Added in rank order on every rank: the same total everywhere.
  for (const EvalResult& part : allgather_value(comm, mine)) {
    total.correct += part.correct;
    total.samples += part.samples;
    total.loss_sum += part.loss_sum;
  }
  return total;
}

void check_replicas(Comm& comm, const Model& model, int64_t step) {
  const auto& views = model.param_views();
  std::vector<uint64_t> mine(views.size());
  for (size_t v = 0; v < views.size(); ++v) {
    mine[v] = hash_bytes(model.params().data() + views[v].offset,
                         static_cast<size_t>(views[v].size) * sizeof(float));
  }
  std::vector<uint64_t> all(mine.size() * static_cast<size_t>(comm.size()));
  comm.allgather(mine.data(), all.data(), mine.size() * sizeof(uint64_t));
  std::string diverged;
  size_t first_view = views.size();
  // Report the parameter that comes first in the model (forward order), the likeliest origin.
  for (int r = 1; r < comm.size(); ++r) {
    bool differs = false;
    for (size_t v = 0; v < views.size(); ++v) {
      if (all[static_cast<size_t>(r) * views.size() + v] != all[v]) {
        differs = true;
        if (first_view == views.size() || views[v].layer < views[first_view].layer) first_view = v;
      }
    }
    if (differs) diverged += fmt::format("{}{}", diverged.empty() ? "" : ", ", r);
  }
  RINGTRAIN_CHECK(diverged.empty(),
                  "replicas diverged at step {}: rank(s) {} hold parameters that differ from "
                  "rank 0's, first in {} (layer {}); the ranks must run the same binary, flags "
                  "and data",
                  step, diverged, views[first_view].name, views[first_view].layer);
}

GradBucketer::ReduceFn make_bucket_reduce(Comm& comm, const std::string& algorithm,
                                          RingScratch& scratch, double delay_ms) {
  RINGTRAIN_CHECK(algorithm == "ring" || algorithm == "mpi",
                  "--allreduce '{}' is unknown: use ring or mpi", algorithm);
  const bool ring = algorithm == "ring";
  return [&comm, &scratch, ring, delay_ms](float* data, int64_t count) {
    if (delay_ms > 0) {
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(delay_ms));
    }
    if (ring) {
      ring_allreduce(comm, data, static_cast<size_t>(count), ReduceOp::kAvg, scratch);
    } else {
      comm.allreduce_library(data, static_cast<size_t>(count), ReduceOp::kAvg);
    }
  };
}

}  // namespace ringtrain
