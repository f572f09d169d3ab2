// Resuming: finding the checkpoint to continue from (the chief reads it, every rank receives
// its verified bytes), checking that it fits this run, and loading its state into the model,
// the optimizer and the weight average.
#pragma once

#include <optional>
#include <string>

#include "options.h"
#include "ringtrain/checkpoint.h"
#include "ringtrain/comm.h"
#include "ringtrain/model.h"
#include "ringtrain/optim.h"

namespace ringtrain::app {

// Refuses a checkpoint that cannot continue this run (the same on every rank: exit 3).
[[noreturn]] void refuse(const std::string& message);
std::string describe_schedule(const LrSchedule& s);

// Collective over `comm` (rank 0 is the chief that reads). With --checkpoint-dir the chief
// first proves the directory writable and removes the temporaries of an interrupted write.
// --resume FILE: that file; auto: the newest valid checkpoint in the directory; never: none,
// and a directory that holds one is refused. Names of later steps held by invalid files are
// set aside, so that this run can write them.
std::optional<Checkpoint> resolve_checkpoint(Comm& comm, const Options& o);

// The model, the optimizer and the seed must be the checkpoint's (refused otherwise).
void check_checkpoint_fits(const Checkpoint& c, const Options& o, const Model& model,
                           const Optimizer& optimizer, size_t optimizer_buffers);

// Copies the checkpoint's parameters and optimizer state into `model` and `optimizer` (on
// either device). Every rank decoded the same verified bytes: the replicas start identical
// without a broadcast.
void load_checkpoint_state(const Checkpoint& c, Model& model, Optimizer& optimizer);

}  // namespace ringtrain::app
