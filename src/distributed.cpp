// Sampler shards, broadcast, sharded evaluation, replica checks (see distributed.h).
#include "ringtrain/distributed.h"

#include <algorithm>
#include <cstring>

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
  const PhaseScope phase(comm.board(), "parameter broadcast");
  if (model.device() != Device::kCpu) {
    // `comm` is a host transport here (the MpiComm): stage through host memory, explicitly.
    std::vector<float> host = model.params_to_host();
    comm.broadcast(host.data(), host.size() * sizeof(float), root);
    model.params_from_host(host);
    return;
  }
  comm.broadcast(model.params().data(), static_cast<size_t>(model.num_params()) * sizeof(float),
                 root);
}

EvalResult evaluate_sharded(Comm& comm, Model& model, const Dataset& data, int64_t batch_size,
                            Batch& scratch, Context& ctx) {
  const int64_t ranks = comm.size(), rank = comm.rank();
  const int64_t begin = data.count * rank / ranks, end = data.count * (rank + 1) / ranks;
  const EvalResult mine =
      evaluate(model, data, begin, end, batch_size, scratch, ctx, &comm.board());
  const PhaseScope phase(comm.board(), "evaluation sum");
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
  // A device model's parameters are hashed from an explicit host copy.
  const std::vector<float> staged =
      model.device() == Device::kCpu ? std::vector<float>() : model.params_to_host();
  const float* params = model.device() == Device::kCpu ? model.params().data() : staged.data();
  for (size_t v = 0; v < views.size(); ++v) {
    mine[v] =
        hash_bytes(params + views[v].offset, static_cast<size_t>(views[v].size) * sizeof(float));
  }
  std::vector<uint64_t> all(mine.size() * static_cast<size_t>(comm.size()));
  {
    const PhaseScope phase(comm.board(), "replica check");
    comm.allgather(mine.data(), all.data(), mine.size() * sizeof(uint64_t));
  }
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

void check_config_consistency(Comm& comm, const std::vector<ConfigField>& fields) {
  const PhaseScope phase(comm.board(), "configuration check");
  // First the shape of the list: binaries of different versions may not even agree on it.
  std::string names;
  for (const ConfigField& field : fields) names += field.name + ";";
  const uint64_t shape[2] = {fields.size(), hash_bytes(names.data(), names.size())};
  std::vector<uint64_t> shapes(2 * static_cast<size_t>(comm.size()));
  comm.allgather(shape, shapes.data(), sizeof(shape));
  std::string other_lists;
  for (int r = 1; r < comm.size(); ++r) {
    const auto i = 2 * static_cast<size_t>(r);
    if (shapes[i] != shapes[0] || shapes[i + 1] != shapes[1])
      other_lists += fmt::format("{}{}", other_lists.empty() ? "" : ", ", r);
  }
  if (!other_lists.empty()) {
    throw Error(fmt::format("configuration check: rank(s) {} describe their configuration with "
                            "other fields than rank 0: they run another version of mnist_train; "
                            "run the same binary on every rank",
                            other_lists),
                ExitCode::kBadInput, /*on_every_rank=*/true);
  }

  // One fixed-size record per field: the hash of the whole value and its start, for messages.
  struct Record {
    uint64_t hash;
    char text[56];
  };
  std::vector<Record> mine(fields.size());
  for (size_t f = 0; f < fields.size(); ++f) {
    const std::string& value = fields[f].value;
    mine[f].hash = hash_bytes(value.data(), value.size());
    std::memset(mine[f].text, 0, sizeof(mine[f].text));
    std::memcpy(mine[f].text, value.data(), std::min(value.size(), sizeof(mine[f].text) - 1));
  }
  std::vector<Record> all(fields.size() * static_cast<size_t>(comm.size()));
  if (!fields.empty()) comm.allgather(mine.data(), all.data(), fields.size() * sizeof(Record));
  std::string differences;
  constexpr int kShown = 12;  // enough to act on; the count says how many more
  int total = 0;
  for (size_t f = 0; f < fields.size(); ++f) {
    std::string ranks_differing;
    for (int r = 1; r < comm.size(); ++r) {
      const Record& theirs = all[static_cast<size_t>(r) * fields.size() + f];
      if (theirs.hash == all[f].hash) continue;
      if (++total > kShown) continue;
      ranks_differing += fmt::format("; rank {} has '{}'", r, theirs.text);
    }
    if (!ranks_differing.empty())
      differences +=
          fmt::format("\n  {}: rank 0 has '{}'{}", fields[f].name, all[f].text, ranks_differing);
  }
  if (total > 0) {
    throw Error(
        fmt::format("configuration check: the ranks disagree, so training would hang or "
                    "diverge; nothing was trained.{}{}\n  every rank must run the same "
                    "binary with the same flags and the same data",
                    differences,
                    total > kShown ? fmt::format("\n  ({} more differences)", total - kShown)
                                   : std::string()),
        ExitCode::kBadInput, /*on_every_rank=*/true);
  }
}

}  // namespace ringtrain
