// Resuming (see resume.h).
#include "resume.h"

#include <algorithm>
#include <vector>

#include <fmt/format.h>

#include "ringtrain/check.h"
#include "ringtrain/log.h"

namespace ringtrain::app {

[[noreturn]] void refuse(const std::string& message) {
  throw Error(message, ExitCode::kBadInput, /*on_every_rank=*/true);
}

std::string describe_schedule(const LrSchedule& s) {
  return fmt::format("{} lr {} decay {} per {} staircase {} warmup {} batch {} reference {}",
                     s.kind, s.base_lr, s.decay_rate, s.decay_steps, s.staircase, s.warmup_steps,
                     s.global_batch, s.reference_batch);
}

void check_checkpoint_fits(const Checkpoint& c, const Options& o, const Model& model,
                           const Optimizer& optimizer, size_t optimizer_buffers) {
  if (c.model != o.model || c.layers != model.signature() || c.num_params != model.num_params())
    refuse(fmt::format(
        "the checkpoint at step {} is of model {} ({}, {} parameters); this run "
        "builds {} ({}, {} parameters): use the same --model and --hidden, or "
        "another --checkpoint-dir",
        c.step, c.model, c.layers, c.num_params, o.model, model.signature(), model.num_params()));
  if (c.optimizer != optimizer.name() || c.optimizer_state.size() != optimizer_buffers)
    refuse(fmt::format(
        "the checkpoint at step {} holds {} state with {} buffer(s); this run's "
        "{} needs {}: use the optimizer flags of the run that wrote it",
        c.step, c.optimizer, c.optimizer_state.size(), optimizer.name(), optimizer_buffers));
  if (c.seed != o.seed)
    refuse(
        fmt::format("the checkpoint at step {} was written with --seed {}, this run has "
                    "--seed {}: the data order would change; pass --seed {}",
                    c.step, c.seed, o.seed, c.seed));
}

// The chief finds the checkpoint to resume from (and proves the checkpoint directory is
// writable); every rank receives its verified bytes, or the chief's error. Collective.
std::optional<Checkpoint> resolve_checkpoint(Comm& comm, const Options& o) {
  const PhaseScope phase(comm.board(), "checkpoint broadcast");
  std::vector<uint8_t> payload;
  int64_t status = 0;  // > 0: a checkpoint of that many bytes; 0: none; < 0: an error message
  if (comm.rank() == 0) {
    try {
      std::optional<CheckpointDir> dir;
      if (!o.checkpoint_dir.empty()) {
        dir.emplace(o.checkpoint_dir, o.keep_checkpoints);
        dir->ensure_writable();
        // A chief that died mid-write left its temporary; nobody else writes here now.
        for (const std::string& stale : dir->remove_stale_temporaries())
          spdlog::info("removed {}, the temporary of an interrupted checkpoint write", stale);
      }
      if (o.resume != "auto" && o.resume != "never") {
        payload = read_file_bytes(o.resume);
        const Checkpoint checked = decode_checkpoint(payload, o.resume);
        // Later files of another run in the directory would carry the names of this run's
        // next checkpoints (a name must mean one state) and outrank them in the rotation.
        const std::vector<std::string> later =
            dir ? dir->later_than(checked.step) : std::vector<std::string>{};
        if (!later.empty()) {
          throw Error(fmt::format("--resume {} is at step {}, but --checkpoint-dir {} already "
                                  "holds a later checkpoint ({}), of another run: this run would "
                                  "write other states under its names; use an empty "
                                  "--checkpoint-dir, or --resume auto to continue that run",
                                  o.resume, checked.step, o.checkpoint_dir, later.front()),
                      ExitCode::kBadInput);
        }
        spdlog::info("resuming from {} (--resume): step {}", o.resume, checked.step);
      } else if (dir) {
        std::vector<std::string> skipped;
        std::optional<CheckpointDir::Loaded> newest = dir->load_newest_valid(skipped);
        for (const std::string& why : skipped) spdlog::warn("skipping a checkpoint: {}", why);
        if (newest && o.resume == "never") {
          throw Error(fmt::format("--checkpoint-dir {} holds checkpoints (newest {}) and --resume "
                                  "is never: continue that run with --resume auto, or choose an "
                                  "empty directory; nothing there was changed",
                                  o.checkpoint_dir, newest->path),
                      ExitCode::kBadInput);
        }
        if (!newest && !skipped.empty()) {
          throw Error(fmt::format("--checkpoint-dir {}: none of its {} checkpoint(s) is valid "
                                  "(see the warnings above); move them away to start afresh",
                                  o.checkpoint_dir, skipped.size()),
                      ExitCode::kBadInput);
        }
        // Whatever carries a later step's name now is not a valid checkpoint (the newest valid
        // one was chosen): keep its bytes, but free the names this run is about to write.
        for (const std::string& path : dir->later_than(newest ? newest->checkpoint.step : 0)) {
          spdlog::warn(
              "{} is not a valid checkpoint and this run will write that step again: "
              "set aside as {}",
              path, dir->set_aside(path));
        }
        if (newest) {
          spdlog::info("resuming from {}: step {}", newest->path, newest->checkpoint.step);
          payload = std::move(newest->bytes);
        }
      }
      status = static_cast<int64_t>(payload.size());
    } catch (const Error& error) {
      const std::string message = error.what();
      payload.assign(message.begin(), message.end());
      status = -static_cast<int64_t>(payload.size());
    }
  }
  comm.broadcast(&status, sizeof(status), 0);
  payload.resize(static_cast<size_t>(status < 0 ? -status : status));
  if (!payload.empty()) comm.broadcast(payload.data(), payload.size(), 0);
  if (status < 0) {
    throw Error(std::string(payload.begin(), payload.end()), ExitCode::kBadInput,
                /*on_every_rank=*/true);
  }
  if (status == 0) return std::nullopt;
  return decode_checkpoint(
      payload, o.resume != "auto" && o.resume != "never" ? o.resume : "(broadcast from rank 0)");
}

void load_checkpoint_state(const Checkpoint& c, Model& model, Optimizer& optimizer) {
  if (model.device() == Device::kCuda) {
    model.params_from_host(c.params);
    state_from_host(optimizer, c.optimizer_state);
  } else {
    std::copy(c.params.begin(), c.params.end(), model.params().data());
    const auto state = optimizer.state();
    for (size_t b = 0; b < state.size(); ++b)
      std::copy(c.optimizer_state[b].begin(), c.optimizer_state[b].end(), state[b].begin());
  }
  optimizer.set_steps_taken(c.optimizer_steps);
}

}  // namespace ringtrain::app
