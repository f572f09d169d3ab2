// Names for cuBLAS status codes (cuBLAS has cublasGetStatusString, but only the name tells a
// user what to search for).
#include "ringtrain/cuda_check.h"

namespace ringtrain::detail {

const char* cublas_status_name(cublasStatus_t status) {
  return cublasGetStatusString(status);
}

}  // namespace ringtrain::detail
