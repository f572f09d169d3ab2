// cuBLAS, loaded when first used instead of at program start.
//
// Merely loading libcublas.so.13 (and the libcublasLt it pulls in) costs a process about
// 210 MB of resident memory before main() runs (measured: an empty program linked against it
// peaks at 217 MB, against 1 MB without), which a CPU-only run of the GPU build would pay for
// nothing: mnist_train's peak RSS went from 133 MB to 277 MB. So the GPU build does not link
// cuBLAS; it defines the few cuBLAS entry points ringtrain calls, and each resolves the real one
// through dlopen on first use, which only a GPU run reaches. If the library cannot be loaded,
// the calls return CUBLAS_STATUS_NOT_INITIALIZED and the reason is logged once.
#include <dlfcn.h>

#include <cublas_v2.h>

#include <mutex>

#include <spdlog/spdlog.h>

namespace {

struct CublasLibrary {
  void* handle = nullptr;
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetPointerMode_v2) set_pointer_mode = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  decltype(&cublasSetWorkspace_v2) set_workspace = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
  decltype(&cublasSgemm_v2) sgemm = nullptr;
};

template <typename Fn>
bool resolve(void* library, const char* name, Fn& out) {
  out = reinterpret_cast<Fn>(dlsym(library, name));
  if (out == nullptr) spdlog::error("cuBLAS: {} is missing from {}", name, RINGTRAIN_CUBLAS_SONAME);
  return out != nullptr;
}

// The library, loaded once; null when it cannot be (the reason is logged).
const CublasLibrary* cublas() {
  static CublasLibrary library;
  static bool loaded = false;
  static std::once_flag once;
  std::call_once(once, [] {
    library.handle = dlopen(RINGTRAIN_CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (library.handle == nullptr) {
      spdlog::error("cannot load cuBLAS ({}): {}; add its folder to LD_LIBRARY_PATH",
                    RINGTRAIN_CUBLAS_SONAME, dlerror());
      return;
    }
    loaded = resolve(library.handle, "cublasCreate_v2", library.create) &&
             resolve(library.handle, "cublasDestroy_v2", library.destroy) &&
             resolve(library.handle, "cublasSetStream_v2", library.set_stream) &&
             resolve(library.handle, "cublasSetPointerMode_v2", library.set_pointer_mode) &&
             resolve(library.handle, "cublasSetMathMode", library.set_math_mode) &&
             resolve(library.handle, "cublasSetWorkspace_v2", library.set_workspace) &&
             resolve(library.handle, "cublasGetStatusString", library.status_string) &&
             resolve(library.handle, "cublasSgemm_v2", library.sgemm);
  });
  return loaded ? &library : nullptr;
}

}  // namespace

// The definitions the linker finds instead of libcublas's (same names and signatures as
// cublas_api.h declares them).
extern "C" {

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t* handle) {
  const CublasLibrary* lib = cublas();
  return lib ? lib->create(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle) {
  const CublasLibrary* lib = cublas();
  return lib ? lib->destroy(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  const CublasLibrary* lib = cublas();
  return lib ? lib->set_stream(handle, stream) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasSetPointerMode_v2(cublasHandle_t handle,
                                                    cublasPointerMode_t mode) {
  const CublasLibrary* lib = cublas();
  return lib ? lib->set_pointer_mode(handle, mode) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasSetMathMode(cublasHandle_t handle, cublasMath_t mode) {
  const CublasLibrary* lib = cublas();
  return lib ? lib->set_math_mode(handle, mode) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace,
                                                  size_t bytes) {
  const CublasLibrary* lib = cublas();
  return lib ? lib->set_workspace(handle, workspace, bytes) : CUBLAS_STATUS_NOT_INITIALIZED;
}

const char* CUBLASWINAPI cublasGetStatusString(cublasStatus_t status) {
  const CublasLibrary* lib = cublas();
  return lib ? lib->status_string(status) : "cuBLAS is not loaded (see the error above)";
}

cublasStatus_t CUBLASWINAPI cublasSgemm_v2(cublasHandle_t handle, cublasOperation_t transa,
                                           cublasOperation_t transb, int m, int n, int k,
                                           const float* alpha, const float* A, int lda,
                                           const float* B, int ldb, const float* beta, float* C,
                                           int ldc) {
  const CublasLibrary* lib = cublas();
  return lib ? lib->sgemm(handle, transa, transb, m, n, k, alpha, A, lda, B, ldb, beta, C, ldc)
             : CUBLAS_STATUS_NOT_INITIALIZED;
}

}  // extern "C"
