// The property data parallelism rests on, for one step: the gradient averaged over N ranks, each
// on its shard of the global batch (rank_batch), equals the gradient of the whole global batch
// on one rank, up to float32 rounding, within a bound derived below rather than fitted. Swept
// over N = 2, 3, 4 thread ranks, the ring's average and the library allreduce, the mlp and the
// cnn; and the bound is shown to catch a sum instead of the mean, a missing shard and another
// batch.
//
// Why the test's inputs are exact. A ReLU (or max-pool) input within rounding of a tie can come
// out on either side in two forward passes whose GEMMs block the sums differently (that depends
// on the batch size and on the CPU's caches and vector width), and the two backward passes then
// differ by one sample's whole contribution through that unit: no rounding bound covers it. At
// Glorot init on real images, a few of the ~10^5 pre-activations of a batch do lie within the
// forward rounding bound of 0, so such a flip cannot be ruled out. The test removes the
// question: the images are binary (bytes 0 and 255, which make_batch turns into exactly 0 and
// 1) and every weight is rounded to a multiple of 2^-6. Then every forward value of layer l is
// a multiple of 2^-6l, and where the sum of the absolute terms of every output stays below
// 2^(24-6l) (checked, for every unit of every sample), every partial sum of every order is a
// float32: the forward pass is exact on every CPU, whatever the blocking, FMA or vector width,
// and both computations see the same logits, ReLU masks and pooling choices (also checked: the
// model's logits equal an exact double-precision mirror of it, bit for bit). What is left to
// differ is the backward pass's summation order and the averaging: what the claim is about.
//
// The bound. Let u = 2^-24 and gamma(k) = k u / (1 - k u) (Higham, Accuracy and Stability of
// Numerical Algorithms, 3.1; any order of a k-term dot product errs by at most gamma(k) times
// the sum of the absolute products, FMA or not). With the forward exact, every gradient element
// is a chain of products and sums over the same exact activations, masks and float softmax p:
//  - dlogits = p / b - onehot / b: at most 3 roundings (1/b, the product, the subtraction);
//  - each backward step through a dense or conv layer: a dot product over its outputs (10, or
//    9 x Cout for a conv), ReLU masks, pooling routes and flatten exact;
//  - the parameter gradient: a dot product over the S samples (dense: b; conv: b x H x W);
//  - N ranks: N - 1 additions and one division by N (the ring; the library allreduce sums in
//    double and rounds once).
// Composing (Higham, lemma 3.3), with K = 3 + C + S + N where C is the sum of the inner
// dimensions on the way from the logits to the parameter and S uses the global batch:
//   |g - g*| <= gamma(K) G  elementwise, for g = g_N and for g = g_1,
// where g* is the exact gradient of the exact forward and G the same backward pass on absolute
// values: |W| for W, (p + onehot) / B for dlogits, the true activations, masks and routes. Hence
//   |g_N - g_1| <= 2 gamma(K) G + K 2^-148
// (the last term covers underflow, which does not happen here). G is computed in double by the
// mirror below, from a double softmax: its own error (about 20 u relative in the float softmax,
// 10^-13 in double) is covered by inflating it by 1e-5. The bound uses no CPU-specific constant:
// it holds for any blocking and summation order. Observed here: a few percent of it or less,
// printed by each section; a sum instead of the mean, a missing shard or another batch exceeds
// it by orders of magnitude (the second test case).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <span>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "ringtrain/allreduce.h"
#include "ringtrain/context.h"
#include "ringtrain/data.h"
#include "ringtrain/distributed.h"
#include "ringtrain/exact_sum.h"
#include "ringtrain/grad_sync.h"
#include "ringtrain/model.h"
#include "ringtrain/ops.h"
#include "ringtrain/ring.h"
#include "ringtrain/train.h"
#include "support/thread_comm.h"

using namespace ringtrain;

namespace {

constexpr int64_t kGlobalBatch = 96;  // divisible by 2, 3 and 4
constexpr int64_t kSteps = 2;         // step 1's batch is the "another batch" of the negatives
constexpr uint64_t kSeed = 11;
constexpr double kGrid = 64.0;  // weights are multiples of 2^-6
constexpr double kU = 0x1p-24;  // float32 unit roundoff

double gamma_of(double k) {
  return k * kU / (1.0 - k * kU);
}

// Binary images (each pixel on with probability 1/4) and labels from mt19937, whose output the
// standard fixes (its distributions are not fixed, so they are not used).
const Dataset& binary_data() {
  static const Dataset data = [] {
    Dataset d;
    d.count = kGlobalBatch * kSteps;
    d.rows = 28;
    d.cols = 28;
    std::mt19937 generator(2024);
    d.images.resize(static_cast<size_t>(d.count * d.image_size()));
    for (auto& pixel : d.images) pixel = (generator() >> 30) == 0 ? 255 : 0;
    d.labels.resize(static_cast<size_t>(d.count));
    for (auto& label : d.labels) label = static_cast<uint8_t>(generator() % 10);
    return d;
  }();
  return data;
}

std::span<const int64_t> epoch_order() {
  static EpochSampler sampler(binary_data().count, kSeed);
  static const std::vector<int64_t> order = [] {
    const auto o = sampler.order(0);
    return std::vector<int64_t>(o.begin(), o.end());
  }();
  return order;
}

Batch batch_of(std::span<const int64_t> indices) {
  Batch batch;
  make_batch(binary_data(), indices, batch.images, batch.labels);
  return batch;
}

// Glorot from the seed, rounded to the grid (biases start at 0, on every grid).
std::vector<float> grid_params(const std::string& name) {
  auto model = make_model({.name = name});
  model->init_params(kSeed);
  std::vector<float> params = model->params_to_host();
  for (float& p : params) p = static_cast<float>(std::nearbyint(p * kGrid) / kGrid);
  return params;
}

// One rank's gradient on `indices`, with compute_gradients as a training step computes it;
// with `sync`, averaged by it while backward runs, as the ring strategy's step does.
void rank_gradient(Model& model, std::span<const int64_t> indices, GradSync* sync = nullptr) {
  const Batch batch = batch_of(indices);
  StepWorkspace workspace;
  Context ctx;
  compute_gradients(model, batch, workspace, ctx, sync);
}

std::vector<float> global_gradient(const std::string& name, int64_t step) {
  auto model = make_model({.name = name});
  model->params_from_host(grid_params(name));
  rank_gradient(*model, rank_batch(epoch_order(), step, kGlobalBatch, 0, 1));
  return model->grads().to_host();
}

enum class Averaging { kRing, kLibrary, kRingSumBug, kMissingShardBug };

// Every rank's gradient after averaging over `ranks` thread ranks, each on its rank_batch shard
// of step 0 (the bug variants: a sum instead of the mean; rank 1 on rank 0's shard).
std::vector<std::vector<float>> averaged_gradients(const std::string& name, int ranks,
                                                   Averaging averaging) {
  const std::vector<float> params = grid_params(name);
  const int64_t per_rank = kGlobalBatch / ranks;
  std::vector<std::vector<float>> results(static_cast<size_t>(ranks));
  run_ranks(ranks, [&](Comm& comm) {
    auto model = make_model({.name = name});
    model->params_from_host(params);
    const int shard =
        averaging == Averaging::kMissingShardBug && comm.rank() == 1 ? 0 : comm.rank();
    const auto shard_indices = rank_batch(epoch_order(), 0, per_rank, shard, ranks);
    Tensor& grads = model->grads();
    if (averaging == Averaging::kRingSumBug) {
      rank_gradient(*model, shard_indices);
      RingScratch scratch;
      ring_allreduce(comm, grads.data(), static_cast<size_t>(grads.numel()), ReduceOp::kSum,
                     scratch);
    } else {
      // The trainer's route: buckets of the flat gradient buffer (small ones, so that there are
      // several), each averaged by the run's Allreduce as backward reports it.
      const std::unique_ptr<Allreduce> allreduce = make_allreduce(
          comm,
          {.algorithm = averaging == Averaging::kLibrary ? AllreduceAlgorithm::kLibrary
                                                         : AllreduceAlgorithm::kRing},
          Context{});
      const std::unique_ptr<GradSync> sync =
          make_grad_sync(grads.data(), model->grad_ranges(), *allreduce,
                         {.first_bucket_elements = 1000,
                          .bucket_elements = 20000,
                          .overlap = averaging != Averaging::kLibrary},
                         Context{});
      REQUIRE(sync->buckets().size() > 1);
      rank_gradient(*model, shard_indices, sync.get());
    }
    results[static_cast<size_t>(comm.rank())] = grads.to_host();
  });
  return results;
}

enum class Accumulation { kFloat, kExact, kRepeatedPassBug };

// Every rank's gradient after an accumulating step of `passes` passes on each of `ranks`
// thread ranks, as mnist_train --accumulate-steps feeds them (pass p of rank r: the slice p of
// the order at the per-pass global batch, rank_batch(order, p, B / (ranks x passes), r,
// ranks)), the passes' sum averaged by the ring while the last backward runs (one rank: no
// averaging). kExact: through the exact sum (--reproducible, micro-shards of 8 rows);
// kRepeatedPassBug: the last pass trains on the first pass's batch again.
std::vector<std::vector<float>> accumulated_gradients(const std::string& name, int ranks,
                                                      int passes, Accumulation accumulation) {
  const std::vector<float> params = grid_params(name);
  const int64_t per_pass = kGlobalBatch / (ranks * passes);
  REQUIRE(per_pass * ranks * passes == kGlobalBatch);
  std::vector<std::vector<float>> results(static_cast<size_t>(ranks));
  run_ranks(ranks, [&](Comm& comm) {
    auto model = make_model({.name = name});
    model->params_from_host(params);
    Tensor& grads = model->grads();
    std::vector<Batch> batches;
    for (int pass = 0; pass < passes; ++pass) {
      const int slice =
          accumulation == Accumulation::kRepeatedPassBug && pass + 1 == passes ? 0 : pass;
      batches.push_back(batch_of(rank_batch(epoch_order(), slice, per_pass, comm.rank(), ranks)));
    }
    std::vector<StepInput> inputs(batches.begin(), batches.end());
    StepWorkspace workspace;
    std::unique_ptr<ExactGradSum> exact;
    std::unique_ptr<Allreduce> allreduce;
    if (accumulation == Accumulation::kExact) {
      constexpr int64_t kMicroBatch = 8;
      exact = std::make_unique<ExactGradSum>(comm, grads.data(), model->grad_ranges(),
                                             kGlobalBatch / kMicroBatch,
                                             kGlobalBatch / kMicroBatch / ranks);
      allreduce = make_exact_allreduce(*exact);
      workspace.exact_sum = exact.get();
    } else if (ranks > 1) {
      allreduce = make_allreduce(comm, {}, Context{});
    }
    std::unique_ptr<GradSync> sync;
    if (allreduce)
      sync = make_grad_sync(grads.data(), model->grad_ranges(), *allreduce,
                            {.first_bucket_elements = 1000, .bucket_elements = 20000}, Context{});
    Context ctx;
    compute_gradients(*model, inputs, workspace, ctx, sync.get());
    results[static_cast<size_t>(comm.rank())] = grads.to_host();
  });
  return results;
}

// ---- the exact mirror: the model's layers in double, from the same flat parameters ----

enum class Kind { kFlatten, kDense, kRelu, kConv, kPool };
struct MirrorLayer {
  Kind kind;
  int64_t in = 0, out = 0;        // dense: features; conv: channels; pool: channels in `in`
  int64_t height = 0, width = 0;  // conv, pool: the input's spatial size
};

std::vector<MirrorLayer> architecture(const std::string& name) {
  if (name == "mlp") {
    return {{Kind::kFlatten}, {Kind::kDense, 784, 500}, {Kind::kRelu}, {Kind::kDense, 500, 500},
            {Kind::kRelu},    {Kind::kDense, 500, 10}};
  }
  return {{Kind::kConv, 1, 8, 28, 28},
          {Kind::kRelu},
          {Kind::kPool, 8, 0, 28, 28},
          {Kind::kConv, 8, 16, 14, 14},
          {Kind::kRelu},
          {Kind::kPool, 16, 0, 14, 14},
          {Kind::kFlatten},
          {Kind::kDense, 784, 10}};
}

struct Reference {
  std::vector<double> logits;  // the exact logits of the global batch
  std::vector<double> g_abs;   // G: the absolute-value gradient, flat as the model's gradients
  std::vector<double> k_base;  // C + S per gradient element (K = 3 + C + S + N)
  double worst_exactness = 0;  // max over units of (sum of |terms|) / 2^(24 - q): <= 1 is exact
};

Reference mirror(const std::string& name, const std::vector<float>& params) {
  auto model = make_model({.name = name});
  const std::vector<MirrorLayer> layers = architecture(name);
  REQUIRE(model->num_layers() == static_cast<int>(layers.size()));
  // Each layer's weight and bias as double, |W| beside W, and where they sit in the flat buffer.
  struct Slot {
    std::vector<double> w, w_abs, b;
    int64_t w_offset = -1, b_offset = -1;
  };
  std::vector<Slot> slots(layers.size());
  for (const ParamView& view : model->param_views()) {
    Slot& slot = slots[static_cast<size_t>(view.layer)];
    const bool weight = view.name.ends_with(".weight");
    std::vector<double> values(params.begin() + view.offset,
                               params.begin() + view.offset + view.size);
    if (weight) {
      const MirrorLayer& layer = layers[static_cast<size_t>(view.layer)];
      const int64_t expected =
          layer.kind == Kind::kConv ? 9 * layer.in * layer.out : layer.in * layer.out;
      REQUIRE(view.size == expected);
      slot.w_abs = values;
      for (double& v : slot.w_abs) v = std::fabs(v);
      slot.w = std::move(values);
      slot.w_offset = view.offset;
    } else {
      slot.b = std::move(values);
      slot.b_offset = view.offset;
    }
  }

  const Batch batch = batch_of(rank_batch(epoch_order(), 0, kGlobalBatch, 0, 1));
  const int64_t b = kGlobalBatch;
  int64_t not_binary = 0;  // 255 x kPixelScale rounds to exactly 1
  for (int64_t i = 0; i < batch.images.numel(); ++i) {
    const float pixel = batch.images.data()[i];
    not_binary += pixel == 0.0f || pixel == 1.0f ? 0 : 1;
  }
  REQUIRE(not_binary == 0);
  // Forward, exact: acts[i] is layer i's input. `grid` is the exponent q of the current values
  // (multiples of 2^-q); the absolute forward (|W| on the non-negative inputs) bounds every
  // partial sum of every output.
  Reference ref;
  std::vector<std::vector<double>> acts(layers.size() + 1);
  acts[0].assign(batch.images.data(), batch.images.data() + batch.images.numel());
  std::vector<double> cols;
  int grid = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    const MirrorLayer& l = layers[i];
    const std::vector<double>& x = acts[i];
    std::vector<double>& y = acts[i + 1];
    std::vector<double> y_abs;
    switch (l.kind) {
      case Kind::kFlatten:
        y = x;
        break;
      case Kind::kRelu:
        y.resize(x.size());
        relu_forward(x.data(), y.data(), static_cast<int64_t>(x.size()));
        break;
      case Kind::kPool:
        y.resize(x.size() / 4);
        maxpool2d_forward(x.data(), y.data(), b, l.height, l.width, l.in);
        break;
      case Kind::kDense:
        y.resize(static_cast<size_t>(b * l.out));
        y_abs.resize(y.size());
        dense_forward(x.data(), slots[i].w.data(), slots[i].b.data(), y.data(), b, l.in, l.out);
        dense_forward(x.data(), slots[i].w_abs.data(), slots[i].b.data(), y_abs.data(), b, l.in,
                      l.out);
        break;
      case Kind::kConv:
        y.resize(static_cast<size_t>(b * l.height * l.width * l.out));
        y_abs.resize(y.size());
        if (conv2d_uses_im2col(l.in, l.out))
          cols.resize(static_cast<size_t>(b * l.height * l.width * 9 * l.in));
        conv2d_forward(x.data(), slots[i].w.data(), slots[i].b.data(), y.data(), cols.data(), b,
                       l.height, l.width, l.in, l.out);
        conv2d_forward(x.data(), slots[i].w_abs.data(), slots[i].b.data(), y_abs.data(),
                       cols.data(), b, l.height, l.width, l.in, l.out);
        break;
    }
    if (!y_abs.empty()) {
      grid += 6;
      for (double v : y_abs)
        ref.worst_exactness = std::fmax(ref.worst_exactness, v / std::ldexp(1.0, 24 - grid));
    }
  }
  ref.logits = acts.back();

  // dlogits for G: (p + onehot) / B, p from a double softmax, inflated by 1e-5 (see the top).
  const int64_t classes = 10;
  std::vector<double> delta(static_cast<size_t>(b * classes));
  for (int64_t r = 0; r < b; ++r) {
    const double* z = ref.logits.data() + r * classes;
    double max = z[0], sum = 0;
    for (int64_t c = 1; c < classes; ++c) max = std::fmax(max, z[c]);
    for (int64_t c = 0; c < classes; ++c) sum += std::exp(z[c] - max);
    for (int64_t c = 0; c < classes; ++c) {
      const double onehot = c == batch.labels[static_cast<size_t>(r)] ? 1.0 : 0.0;
      delta[static_cast<size_t>(r * classes + c)] =
          (std::exp(z[c] - max) / sum + onehot) / static_cast<double>(b) * (1.0 + 1e-5);
    }
  }
  // Backward on absolute values. `chain` is C: the inner dimensions passed so far.
  ref.g_abs.assign(params.size(), 0.0);
  ref.k_base.assign(params.size(), 0.0);
  double chain = 0;
  std::vector<double> dw, db, dx, dcols;
  for (size_t i = layers.size(); i-- > 0;) {
    const MirrorLayer& l = layers[i];
    const std::vector<double>& x = acts[i];
    const bool first = i == 0;
    dx.assign(first ? 0 : x.size(), 0.0);
    double s = 0;  // S: terms per parameter gradient element
    switch (l.kind) {
      case Kind::kFlatten:
        dx = delta;
        break;
      case Kind::kRelu:
        relu_backward(acts[i + 1].data(), delta.data(), dx.data(), static_cast<int64_t>(x.size()));
        break;
      case Kind::kPool:
        maxpool2d_backward(x.data(), acts[i + 1].data(), delta.data(), dx.data(), b, l.height,
                           l.width, l.in);
        break;
      case Kind::kDense:
        dw.assign(slots[i].w.size(), 0.0);
        db.assign(slots[i].b.size(), 0.0);
        dense_backward(x.data(), slots[i].w_abs.data(), delta.data(), dw.data(), db.data(),
                       first ? nullptr : dx.data(), b, l.in, l.out);
        s = static_cast<double>(b);
        break;
      case Kind::kConv:
        dw.assign(slots[i].w.size(), 0.0);
        db.assign(slots[i].b.size(), 0.0);
        if (conv2d_uses_im2col(l.in, l.out)) dcols.assign(cols.size(), 0.0);
        conv2d_backward(x.data(), cols.data(), slots[i].w_abs.data(), delta.data(), dw.data(),
                        db.data(), first ? nullptr : dx.data(), dcols.data(), b, l.height, l.width,
                        l.in, l.out);
        s = static_cast<double>(b * l.height * l.width);
        break;
    }
    if (l.kind == Kind::kDense || l.kind == Kind::kConv) {
      const auto store = [&](const std::vector<double>& values, int64_t offset) {
        for (size_t k = 0; k < values.size(); ++k) {
          ref.g_abs[static_cast<size_t>(offset) + k] = values[k];
          ref.k_base[static_cast<size_t>(offset) + k] = chain + s;
        }
      };
      store(dw, slots[i].w_offset);
      store(db, slots[i].b_offset);
      chain += static_cast<double>(l.kind == Kind::kConv ? 9 * l.out : l.out);
    }
    delta = dx;
  }
  return ref;
}

const Reference& reference(const std::string& name) {
  static const Reference mlp = mirror("mlp", grid_params("mlp"));
  static const Reference cnn = mirror("cnn", grid_params("cnn"));
  return name == "mlp" ? mlp : cnn;
}

struct Comparison {
  double worst_ratio = 0;  // max over elements of |a - b| / bound: <= 1 passes
  size_t violations = 0;   // elements over the bound
  double max_diff = 0;     // max |a - b| / max |b|, for scale
};

// `passes`: an accumulating step's passes per rank, whose sum adds passes - 1 additions and
// one division by the passes to every element, as the ranks' average does.
Comparison compare(std::span<const float> a, std::span<const float> b, const Reference& ref,
                   int ranks, int passes = 0) {
  Comparison result;
  double max_b = 0, max_diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double k = 3.0 + ref.k_base[i] + ranks + passes;
    const double bound = 2.0 * gamma_of(k) * ref.g_abs[i] + k * 0x1p-148;
    const double diff = std::fabs(static_cast<double>(a[i]) - static_cast<double>(b[i]));
    result.worst_ratio = std::fmax(result.worst_ratio, diff / bound);
    if (diff > bound) ++result.violations;
    max_b = std::fmax(max_b, std::fabs(static_cast<double>(b[i])));
    max_diff = std::fmax(max_diff, diff);
  }
  result.max_diff = max_b > 0 ? max_diff / max_b : max_diff;
  return result;
}

bool identical(const std::vector<std::vector<float>>& results) {
  for (const auto& r : results) {
    if (std::memcmp(r.data(), results[0].data(), r.size() * sizeof(float)) != 0) return false;
  }
  return true;
}

// The preconditions of the bound, for one model: exact forward, a faithful mirror.
void check_exact_forward(const std::string& name) {
  const Reference& ref = reference(name);
  std::printf("grad equivalence %s: exact forward, worst (sum of |terms|) / 2^(24 - q) = %.3g\n",
              name.c_str(), ref.worst_exactness);
  INFO(name << ": worst (sum of |terms|) / 2^(24 - q) = " << ref.worst_exactness);
  REQUIRE(ref.worst_exactness <= 1.0);
  auto model = make_model({.name = name});
  model->params_from_host(grid_params(name));
  const Batch batch = batch_of(rank_batch(epoch_order(), 0, kGlobalBatch, 0, 1));
  Context ctx;
  const Tensor& logits = model->forward(batch.images, ctx);
  REQUIRE(static_cast<size_t>(logits.numel()) == ref.logits.size());
  size_t mismatches = 0;
  for (size_t i = 0; i < ref.logits.size(); ++i) {
    if (static_cast<double>(logits.data()[i]) != ref.logits[i]) ++mismatches;
  }
  REQUIRE(mismatches == 0);
}

}  // namespace

TEST_CASE("one step: the gradient averaged over N ranks equals the global batch's gradient",
          "[grad_equivalence]") {
  set_cpu_threads(1);
  for (const char* model : {"mlp", "cnn"}) {
    const std::string name = model;
    check_exact_forward(name);
    const Reference& ref = reference(name);
    const std::vector<float> global = global_gradient(name, 0);
    for (int ranks : {2, 3, 4}) {
      for (const Averaging averaging : {Averaging::kRing, Averaging::kLibrary}) {
        const char* how = averaging == Averaging::kRing ? "ring" : "library";
        const auto results = averaged_gradients(name, ranks, averaging);
        const Comparison c = compare(results[0], global, ref, ranks);
        std::printf(
            "grad equivalence %s N=%d %s: max |g_N - g_1| / bound %.3g, max |g_N - g_1| / "
            "max |g_1| %.3g\n",
            name.c_str(), ranks, how, c.worst_ratio, c.max_diff);
        INFO(name << ", N = " << ranks << ", " << how << ": worst |g_N - g_1| / bound "
                  << c.worst_ratio << ", " << c.violations << " elements over it");
        CHECK(identical(results));  // every rank ends with the same bits
        CHECK(c.violations == 0);
      }
    }
  }
}

TEST_CASE("one step: the bound catches a sum instead of the mean, a missing shard, another batch",
          "[grad_equivalence]") {
  set_cpu_threads(1);
  for (const char* model : {"mlp", "cnn"}) {
    const std::string name = model;
    const Reference& ref = reference(name);
    const std::vector<float> global = global_gradient(name, 0);
    const auto report = [&](const char* what, const Comparison& c) {
      std::printf("grad equivalence %s, %s: max |g - g_1| / bound %.3g, %zu elements over it\n",
                  name.c_str(), what, c.worst_ratio, c.violations);
      INFO(name << ", " << what << ": worst ratio " << c.worst_ratio);
      // Far outside, not just outside: rounding could never explain it.
      CHECK(c.worst_ratio > 100.0);
    };
    for (int ranks : {2, 3, 4}) {
      report(
          ("N=" + std::to_string(ranks) + " summed, not averaged").c_str(),
          compare(averaged_gradients(name, ranks, Averaging::kRingSumBug)[0], global, ref, ranks));
      report(("N=" + std::to_string(ranks) + " rank 1 on rank 0's shard").c_str(),
             compare(averaged_gradients(name, ranks, Averaging::kMissingShardBug)[0], global, ref,
                     ranks));
    }
    report("the next global batch", compare(global_gradient(name, 1), global, ref, 1));
  }
}

TEST_CASE("accumulation: K passes of batch b give one pass of K x b's gradient",
          "[grad_equivalence][accumulate]") {
  set_cpu_threads(1);
  for (const char* model : {"mlp", "cnn"}) {
    const std::string name = model;
    check_exact_forward(name);
    const Reference& ref = reference(name);
    const std::vector<float> global = global_gradient(name, 0);
    for (const auto& [ranks, passes] :
         {std::pair{1, 2}, std::pair{1, 4}, std::pair{2, 2}, std::pair{2, 3}, std::pair{3, 2}}) {
      const auto results = accumulated_gradients(name, ranks, passes, Accumulation::kFloat);
      const Comparison c = compare(results[0], global, ref, ranks, passes);
      std::printf("accumulation %s N=%d K=%d: max |g_NK - g_1| / bound %.3g, / max |g_1| %.3g\n",
                  name.c_str(), ranks, passes, c.worst_ratio, c.max_diff);
      INFO(name << ", N = " << ranks << ", K = " << passes << ": worst ratio " << c.worst_ratio
                << ", " << c.violations << " elements over the bound");
      CHECK(identical(results));
      CHECK(c.violations == 0);
      // The bound is tight enough to see a pass trained twice instead of another batch.
      const Comparison bug =
          compare(accumulated_gradients(name, ranks, passes, Accumulation::kRepeatedPassBug)[0],
                  global, ref, ranks, passes);
      INFO("a repeated pass: worst ratio " << bug.worst_ratio);
      CHECK(bug.worst_ratio > 100.0);
    }
  }
}

TEST_CASE("accumulation under the exact sum: the same bits for any passes and ranks",
          "[grad_equivalence][accumulate][exact]") {
  set_cpu_threads(1);
  fix_cpu_gemm_blocking();
  for (const char* model : {"mlp", "cnn"}) {
    const std::string name = model;
    // 12 micro-shards of 8: one rank in one pass is the reference.
    const std::vector<float> reference = accumulated_gradients(name, 1, 1, Accumulation::kExact)[0];
    for (const auto& [ranks, passes] : {std::pair{1, 2}, std::pair{1, 3}, std::pair{2, 2},
                                        std::pair{3, 2}, std::pair{2, 3}, std::pair{4, 3}}) {
      INFO(name << ", N = " << ranks << ", K = " << passes);
      for (const auto& result : accumulated_gradients(name, ranks, passes, Accumulation::kExact))
        CHECK(std::memcmp(result.data(), reference.data(), reference.size() * sizeof(float)) == 0);
    }
  }
}
