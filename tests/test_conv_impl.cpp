// --conv-impl's names (context.h), in every build: the GPU's Conv2D/MaxPool2D implementation is
// chosen by name, and a wrong name must be refused with a message that names the flag.
#include <string>

#include <catch2/catch.hpp>

#include "ringtrain/check.h"
#include "ringtrain/context.h"

using namespace ringtrain;

TEST_CASE("conv impl: the accepted names round-trip; direct is the default", "[device]") {
  for (const ConvImpl impl : {ConvImpl::kDirect, ConvImpl::kCudnn}) {
    CHECK(parse_conv_impl(to_string(impl)) == impl);
  }
  CHECK(std::string(to_string(ConvImpl::kDirect)) == "direct");
  CHECK(std::string(to_string(ConvImpl::kCudnn)) == "cudnn");
  CHECK(Context{}.conv_impl == ConvImpl::kDirect);
}

TEST_CASE("conv impl: other names are refused, naming --conv-impl and the choices", "[device]") {
  for (const std::string bad : {"", "cuDNN", "CUDNN", "direct ", "auto", "cpu", "gemm"}) {
    INFO("'" << bad << "'");
    CHECK_THROWS_AS(parse_conv_impl(bad), Error);
    CHECK_THROWS_WITH(parse_conv_impl(bad), Catch::Contains("--conv-impl") &&
                                                Catch::Contains("direct, cudnn") &&
                                                Catch::Contains("'" + bad + "'"));
  }
}
