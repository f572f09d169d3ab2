// An Allreduce whose run() is a test's function: the GradSync tests watch which buckets are
// averaged, when and in what order, without a transport.
#pragma once

#include <functional>
#include <utility>

#include "ringtrain/allreduce.h"

namespace ringtrain::testing {

class FnAllreduce final : public Allreduce {
 public:
  using Fn = std::function<void(float* data, int64_t count)>;
  explicit FnAllreduce(Fn fn, AllreduceKind kind = AllreduceKind::kHostRing)
      : fn_(std::move(fn)), kind_(kind) {}
  void run(float* data, size_t count, ReduceOp) override { fn_(data, static_cast<int64_t>(count)); }
  AllreduceKind kind() const override { return kind_; }
  int size() const override { return 2; }

 private:
  Fn fn_;
  AllreduceKind kind_;
};

}  // namespace ringtrain::testing
