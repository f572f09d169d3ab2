// A steady-state training step allocates nothing: after the first steps have sized every
// buffer, forward, loss, backward and the optimizer run on memory that already exists.
// This file replaces malloc and friends for the whole test binary with counting wrappers
// around glibc's own allocator; counting is on only inside the measured region, per thread.
#include <cstdlib>

#include <catch2/catch.hpp>

#include "ringtrain/data.h"
#include "ringtrain/grad_sync.h"
#include "ringtrain/model.h"
#include "ringtrain/optim.h"
#include "ringtrain/timeline.h"
#include "ringtrain/train.h"
#include "support/fn_allreduce.h"

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
        g_allocations = 0;
        g_counting = true;
        for (int64_t s = 2; s < 6; ++s) step(s);
        g_counting = false;
        CHECK(g_allocations == 0);
        CHECK(reductions > 0);
        if (with_timeline) CHECK(timeline.events().size() > 0);
        model->set_backward_observer(nullptr);
      }
    }
  }
}
