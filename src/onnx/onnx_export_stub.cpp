// The ONNX exporter of a build without libonnx-dev (RINGTRAIN_ONNX found nothing or was OFF):
// the same functions, refusing with what to do about it.
#include <fmt/format.h>

#include "ringtrain/check.h"
#include "ringtrain/onnx_export.h"

namespace ringtrain {

namespace {
[[noreturn]] void refuse(const std::string& flag) {
  throw Error(fmt::format("{}: this build has no ONNX exporter; install libonnx-dev and "
                          "libprotobuf-dev (scripts/install_deps.sh) and configure again",
                          flag),
              ExitCode::kUsage, /*on_every_rank=*/true);
}
}  // namespace

bool onnx_export_available() {
  return false;
}

std::string onnx_model_bytes(const TorchModel&, const std::string&, const std::string& flag) {
  refuse(flag);
}

void write_onnx_model(const std::string&, const TorchModel&, const std::string&,
                      const std::string& flag) {
  refuse(flag);
}

}  // namespace ringtrain
