// --strategy ps: the parameter-server strategy's entry point (ps_strategy.cpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "options.h"
#include "ringtrain/checkpoint.h"
#include "ringtrain/data.h"
#include "ringtrain/model.h"
#include "ringtrain/mpi_comm.h"
#include "run_plan.h"

namespace ringtrain::app {

// What run() has settled before it hands over to the parameter servers' own loop.
struct StrategySetup {
  const MnistData& data;
  std::string data_dir;
  Model& model;
  Context& ctx;
  const RunPlan& plan;
  const std::optional<Checkpoint>& resumed;
};

// This rank's part (server or worker) from setup to summary. world: every rank, watched by the
// watchdog; job: the same ranks with the workers first (job rank 0, the chief, is worker 0),
// the first --num-ps world ranks last.
int run_parameter_servers(const Options& o, MpiComm& world, MpiComm& job,
                          const StrategySetup& setup);

}  // namespace ringtrain::app
