// --device resolution and the CPU side of the device plumbing, in every build and on machines
// with or without a GPU (the GPU math itself is tested in tests/gpu/).
#include <catch2/catch.hpp>

#include "ringtrain/context.h"
#include "ringtrain/gpu.h"
#include "ringtrain/model.h"
#include "ringtrain/optim.h"
#include "ringtrain/tensor.h"

using namespace ringtrain;

TEST_CASE("device choice: cpu never touches CUDA; unknown values are refused", "[device]") {
  const DeviceChoice cpu = choose_device("cpu", 0, 1);
  CHECK(cpu.device == Device::kCpu);
  CHECK(cpu.gpu == -1);
  CHECK(cpu.why == "--device cpu");
  CHECK_THROWS_WITH(choose_device("gpu", 0, 1), Catch::Contains("--device must be one of"));
}

TEST_CASE("device choice: auto and cuda follow the visible GPUs and the local rank", "[device]") {
  std::string why;
  const int gpus = visible_gpus(&why);
  const DeviceChoice automatic = choose_device("auto", 3, 4);
  if (gpus == 0) {
    CHECK(automatic.device == Device::kCpu);
    CHECK_THAT(automatic.why, Catch::Contains(why));
    CHECK_THROWS_WITH(choose_device("cuda", 0, 1), Catch::Contains("no usable GPU"));
  } else {
    CHECK(automatic.device == Device::kCuda);
    CHECK(automatic.gpu == 3 % gpus);
    CHECK(choose_device("cuda", 0, 1).gpu == 0);
  }
}

TEST_CASE("host tensors copy explicitly; a host model's parameter copies round-trip", "[device]") {
  Tensor t(Shape{4});
  t.copy_from_host(std::vector<float>{1, 2, 3, 4});
  CHECK(t.to_host() == std::vector<float>{1, 2, 3, 4});
  CHECK_THROWS(t.copy_from_host(std::vector<float>{1, 2}));
  auto model = make_model({.name = "mlp", .hidden = {8}});
  model->init_params(3);
  std::vector<float> params = model->params_to_host();
  params[0] += 1.0f;
  model->params_from_host(params);
  CHECK(model->params_to_host() == params);
  auto adam = make_optimizer({.kind = "adam"}, model->num_params(), Context{});
  auto state = state_to_host(*adam);
  REQUIRE(state.size() == 2);
  state[1][5] = 0.25f;
  state_from_host(*adam, state);
  CHECK(state_to_host(*adam)[1][5] == 0.25f);
  state.pop_back();
  CHECK_THROWS(state_from_host(*adam, state));
}

TEST_CASE("without a GPU path, CUDA tensors and device optimizers are refused clearly",
          "[device]") {
  if (gpu_build()) return;  // the GPU build allocates them (tests/gpu/)
  CHECK_THROWS_WITH(Tensor(Shape{3}, Device::kCuda), Catch::Contains("needs the GPU path"));
  Context cuda;
  cuda.device = Device::kCuda;
  CHECK_THROWS_WITH(make_optimizer({}, 3, cuda), Catch::Contains("needs the GPU path"));
}

#ifdef RINGTRAIN_HAVE_GPU
#include <cublas_v2.h>

// cuBLAS is loaded on first use (src/cuda/cublas_dynamic.cpp), not linked: this proves the
// library is found and its entry points resolve, on any machine with the toolkit, GPU or not.
TEST_CASE("cuBLAS loads on first use and its entry points resolve", "[device]") {
  // The real library's words (our stand-in, used when it cannot be loaded, says "not loaded").
  CHECK(std::string(cublasGetStatusString(CUBLAS_STATUS_SUCCESS)) == "success");
  CHECK(std::string(cublasGetStatusString(CUBLAS_STATUS_NOT_INITIALIZED)) ==
        "the library was not initialized");
}
#endif
