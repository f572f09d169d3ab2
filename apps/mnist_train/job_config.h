// What every rank of a job must share for the collectives to line up and the replicas to stay
// identical, as the fields of the configuration check (distributed.h: check_config_consistency).
#pragma once

#include <vector>

#include "options.h"
#include "ringtrain/data.h"
#include "ringtrain/distributed.h"
#include "ringtrain/model.h"

namespace ringtrain::app {

// Per-node settings (--threads, --overlap's decision) may differ and are not listed.
std::vector<ConfigField> config_fields(const Options& o, const Model& model, const MnistData& data,
                                       Device device);

}  // namespace ringtrain::app
