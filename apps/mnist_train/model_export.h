// --export-onnx and --export-safetensors: the chief writes the final model in PyTorch's layout
// (torch_layout.h), with the weights the final evaluation used: the EMA ones under
// --ema-decay, else the trained ones. --test-dump-logits writes the test set's logits under
// those same weights, computed by ringtrain's own forward, for the tests to compare with.
#pragma once

#include "options.h"
#include "ringtrain/context.h"
#include "ringtrain/data.h"
#include "ringtrain/model.h"
#include "ringtrain/optim.h"

namespace ringtrain::app {

// Before training, every rank: refuses (usage Error) a model the exporters cannot express, a
// build without the ONNX exporter, two outputs through one path, and (the chief) a path whose
// folder does not exist or cannot be written, so that a long run does not fail at its end.
void check_export_flags(const Options& o, const Model& model, bool chief);

// The chief, after the final evaluation: writes whichever of the files were asked for.
// `ema`: the weight average, or null.
void export_final_model(const Options& o, Model& model, const WeightEma* ema, const Dataset& test,
                        Context& ctx);

}  // namespace ringtrain::app
