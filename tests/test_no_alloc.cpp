// A steady-state training step allocates nothing: after the first steps have sized every
// buffer, forward, loss, backward and the optimizer run on memory that already exists.
// This file replaces malloc and friends for the whole test binary with counting wrappers
// around glibc's own allocator; counting is on only inside the measured region, per thread.
#include <cstdlib>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "ringtrain/allreduce.h"
#include "ringtrain/data.h"
#include "ringtrain/dense_terms.h"
#include "ringtrain/exact_sum.h"
#include "ringtrain/grad_sync.h"
#include "ringtrain/model.h"
#include "ringtrain/optim.h"
#include "ringtrain/timeline.h"
#include "ringtrain/train.h"
#include "support/fn_allreduce.h"
#include "support/thread_comm.h"

extern "C" {
void* __libc_malloc(size_t size);
void* __libc_calloc(size_t count, size_t size);
void* __libc_realloc(void* pointer, size_t size);
void* __libc_memalign(size_t alignment, size_t size);
}

namespace {
thread_local bool g_counting = false;
thread_local long g_allocations = 0;
void count() {
  if (g_counting) ++g_allocations;
}
// The allocations `work` makes on this thread.
template <typename Work>
long allocations_during(Work&& work) {
  g_allocations = 0;
  g_counting = true;
  work();
  g_counting = false;
  return g_allocations;
}
}  // namespace

extern "C" {
void* malloc(size_t size) {
  count();
  return __libc_malloc(size);
}
void* calloc(size_t count_, size_t size) {
  count();
  return __libc_calloc(count_, size);
}
void* realloc(void* pointer, size_t size) {
  count();
  return __libc_realloc(pointer, size);
}
void* aligned_alloc(size_t alignment, size_t size) {
  count();
  return __libc_memalign(alignment, size);
}
int posix_memalign(void** out, size_t alignment, size_t size) {
  count();
  *out = __libc_memalign(alignment, size);
  return *out == nullptr ? 12 /* ENOMEM */ : 0;
}
void* memalign(size_t alignment, size_t size) {
  count();
  return __libc_memalign(alignment, size);
}
}

using namespace ringtrain;

TEST_CASE("a steady-state training step allocates nothing", "[train][timeline]") {
  set_cpu_threads(1);  // the default; Eigen's multi-threaded GEMM allocates its task list
  for (const char* name : {"mlp", "cnn"}) {
    for (const char* optimizer : {"sgd", "adam"}) {
      for (const bool with_timeline : {false, true}) {
        INFO(name << " with " << optimizer << (with_timeline ? ", recording a timeline" : ""));
        auto model = make_model({.name = name});
        model->init_params(1);
        auto opt = make_optimizer({.kind = optimizer, .momentum = 0.5f}, model->num_params());
        Dataset data;
        data.count = 256;
        data.rows = data.cols = 28;
        data.images.assign(static_cast<size_t>(data.count * 28 * 28), 0);
        data.labels.assign(static_cast<size_t>(data.count), 0);
        for (size_t i = 0; i < data.images.size(); ++i)
          data.images[i] = static_cast<uint8_t>(i * 7);
        for (size_t i = 0; i < data.labels.size(); ++i)
          data.labels[i] = static_cast<uint8_t>(i % 10);
        std::vector<int64_t> indices(64);
        Batch batch;
        StepWorkspace workspace;
        Context ctx;
        // Through the overlap engine too: handing buckets to the communication thread must not
        // allocate either (the reduction here only counts).
        int64_t reductions = 0;
        testing::FnAllreduce counting([&reductions](float*, int64_t) { ++reductions; });
        const std::unique_ptr<GradSync> sync = make_grad_sync(
            model->grads().data(), model->grad_ranges(), counting,
            {.first_bucket_elements = 1, .bucket_elements = 1, .overlap = true}, ctx);
        // --timeline: its store is allocated here, once; recording into it must not allocate.
        Timeline timeline;
        LayerTimer layer_timer(timeline);
        if (with_timeline) {
          workspace.timeline = &timeline;
          sync->set_timeline(&timeline);
          model->set_backward_observer(&layer_timer);
        }
        const auto step = [&](int64_t s) {
          for (size_t i = 0; i < indices.size(); ++i) {
            indices[i] = (s * 64 + static_cast<int64_t>(i)) % data.count;
          }
          make_batch(data, indices, batch.images, batch.labels);
          train_step(*model, *opt, batch, 0.01f, workspace, ctx, sync.get());
        };
        for (int64_t s = 0; s < 2; ++s) step(s);  // sizes every buffer
        CHECK(allocations_during([&] {
                for (int64_t s = 2; s < 6; ++s) step(s);
              }) == 0);
        CHECK(reductions > 0);
        if (with_timeline) CHECK(timeline.events().size() > 0);
        model->set_backward_observer(nullptr);
      }
    }
  }
}

namespace {

// ThreadComm copies each message into a vector of its own (it allocates, as MPI's eager
// buffers would); what the test counts is the ring's own allocations, so every call into the
// transport runs with counting paused.
class UncountedTransport final : public Comm {
 public:
  explicit UncountedTransport(Comm& inner) : inner_(inner) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  int local_rank() const override { return inner_.local_rank(); }
  int local_size() const override { return inner_.local_size(); }
  std::string name() const override { return inner_.name(); }
  CommRequest isend(const float* data, size_t n, int peer, int tag) override {
    const Paused paused;
    return inner_.isend(data, n, peer, tag);
  }
  CommRequest irecv(float* data, size_t n, int peer, int tag) override {
    const Paused paused;
    return inner_.irecv(data, n, peer, tag);
  }
  void wait(CommRequest& request) override {
    const Paused paused;
    inner_.wait(request);
  }
  void allreduce_library(float* data, size_t n, ReduceOp op) override {
    const Paused paused;
    inner_.allreduce_library(data, n, op);
  }
  void broadcast(void* data, size_t bytes, int root) override {
    const Paused paused;
    inner_.broadcast(data, bytes, root);
  }
  void allgather(const void* send, void* recv, size_t bytes) override {
    const Paused paused;
    inner_.allgather(send, recv, bytes);
  }
  void barrier() override {
    const Paused paused;
    inner_.barrier();
  }

 private:
  struct Paused {
    bool was = g_counting;
    Paused() { g_counting = false; }
    ~Paused() { g_counting = was; }
  };
  Comm& inner_;
};

}  // namespace

TEST_CASE("a steady-state host ring allreduce allocates nothing, on every wire", "[wire]") {
  for (GradWire wire : {GradWire::kFp32, GradWire::kBf16, GradWire::kFp16}) {
    INFO(to_string(wire));
    const size_t count = 100'003;
    std::vector<long> allocations(3, -1);
    run_ranks(3, [&](Comm& thread_comm) {
      UncountedTransport comm(thread_comm);
      const std::unique_ptr<Allreduce> allreduce = make_allreduce(
          comm, {.ring = {.segment_elements = 4096, .window = 3}, .wire = wire}, Context{});
      allreduce->reserve(count);
      std::vector<float> data(count);
      for (size_t i = 0; i < count; ++i)
        data[i] = static_cast<float>(i % 101) * 0.01f - 0.5f + static_cast<float>(comm.rank());
      allocations[static_cast<size_t>(comm.rank())] = allocations_during([&] {
        for (int run = 0; run < 3; ++run) allreduce->run(data.data(), count, ReduceOp::kAvg);
      });
    });
    CHECK(allocations == std::vector<long>{0, 0, 0});
  }
}

TEST_CASE("a steady-state --reproducible step allocates nothing", "[train][exact]") {
  set_cpu_threads(1);
  // The mlp's micro-shards are stacked and its terms computed from the kept rows
  // (DenseShardTerms); the cnn's micro-shards run one after another with kept gradients. Two
  // ranks, so that the exact ring moves its terms; averaging on the stepping thread (no
  // overlap), so that the counter (per thread) sees the exact sum's work too.
  for (const char* name : {"mlp", "cnn"}) {
    INFO(name);
    constexpr int kRanks = 2;
    constexpr int64_t kMicroBatch = 8, kLocalShards = 4;
    std::vector<long> allocations(kRanks, -1);
    run_ranks(kRanks, [&](Comm& thread_comm) {
      UncountedTransport comm(thread_comm);
      auto model = make_model({.name = name});
      model->init_params(1);
      auto opt = make_optimizer({.kind = "sgd", .momentum = 0.5f}, model->num_params());
      Context ctx;
      ExactGradSum exact(comm, model->grads().data(), model->grad_ranges(), kRanks * kLocalShards,
                         kLocalShards, RingOptions{},
                         DenseShardTerms::make_for(*model, kMicroBatch, kLocalShards));
      const std::unique_ptr<Allreduce> allreduce = make_exact_allreduce(exact);
      const std::unique_ptr<GradSync> sync =
          make_grad_sync(model->grads().data(), model->grad_ranges(), *allreduce,
                         {.first_bucket_elements = 1, .bucket_elements = 1, .overlap = false}, ctx);
      StepWorkspace workspace;
      workspace.exact_sum = &exact;
      Batch batch;
      const int64_t rows = kMicroBatch * kLocalShards;
      batch.images = Tensor(Shape{rows, 28, 28, 1});
      batch.labels.resize(static_cast<size_t>(rows));
      const auto step = [&](int64_t s) {
        for (int64_t i = 0; i < batch.images.numel(); ++i)
          batch.images[i] = static_cast<float>((i * 7 + s + comm.rank()) % 256) / 255.0f;
        for (int64_t r = 0; r < rows; ++r)
          batch.labels[static_cast<size_t>(r)] = static_cast<int32_t>((r + s) % 10);
        train_step(*model, *opt, batch, 0.01f, workspace, ctx, sync.get());
      };
      for (int64_t s = 0; s < 2; ++s) step(s);  // sizes every buffer
      allocations[static_cast<size_t>(comm.rank())] = allocations_during([&] {
        for (int64_t s = 2; s < 5; ++s) step(s);
      });
    });
    CHECK(allocations == std::vector<long>(kRanks, 0));
  }
}
