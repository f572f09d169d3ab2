// The training step, evaluation and the parameter file (see train.h).
#include "ringtrain/train.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>

#include "ringtrain/check.h"
#include "ringtrain/checkpoint.h"
#include "ringtrain/dense_terms.h"
#include "ringtrain/exact_sum.h"
#include "ringtrain/ops.h"
#include "ringtrain/progress_board.h"
#include "ringtrain/timeline.h"

namespace ringtrain {

static_assert(std::endian::native == std::endian::little,
              "the parameter file is little-endian; add byte swapping for big-endian hosts");

namespace {

// What happens to each gradient range as backward finishes it, in a pass of an accumulating
// step: added into the local sum (the passes before the last), or the sum folded in and the
// range handed to the GradSync (the last pass). Without accumulation: only the hand-over.
struct RangeSink {
  enum class Fold { kNone, kStart, kAdd, kFinish };
  Fold fold = Fold::kNone;
  float* grads = nullptr;
  float* accumulated = nullptr;
  float passes = 1.0f;  // the divisor of kFinish's mean
  GradSync* sync = nullptr;

  bool wants_ranges() const { return fold != Fold::kNone || sync != nullptr; }
  void operator()(const GradRange& range) const {
    if (fold != Fold::kNone) {
      float* __restrict g = grads + range.begin;
      float* __restrict sum = accumulated + range.begin;
      const int64_t n = range.end - range.begin;
      if (fold == Fold::kStart) {
        std::copy(g, g + n, sum);
      } else if (fold == Fold::kAdd) {
        for (int64_t i = 0; i < n; ++i) sum[i] += g[i];
      } else {
        for (int64_t i = 0; i < n; ++i) g[i] = (g[i] + sum[i]) / passes;
      }
    }
    if (sync != nullptr) sync->mark_ready(range);
  }
};

// Where backward's results go, besides the sink's ranges: the model's gradient buffer (no
// terms), or only each dense layer's rows, kept by the exact sum for micro-shards first_shard
// on (DenseShardTerms), the layer's ranges then handed to the sink as final.
struct DenseRows {
  DenseShardTerms* terms = nullptr;
  int64_t first_shard = 0;
  std::span<const GradRange> ranges;  // Model::grad_ranges()
};

// Forward, the loss and backward on rows [first, first + rows) of the batch, each gradient
// range handed to `sink` as backward finishes it. The rows are `shards` micro-shards of equal
// rows, each with its own loss mean (stacked, with DenseRows). Adds the correct rows to
// *correct and returns the sum of the micro-shards' mean losses.
double forward_backward(Model& model, const Batch& batch, int64_t first, int64_t rows,
                        int64_t shards, StepWorkspace& workspace, Context& ctx,
                        const RangeSink& sink, int64_t* correct, const DenseRows& dense = {}) {
  ProgressBoard* const board = workspace.board;
  const Shape sample = batch.images.shape().without_leading();
  // A view: forward only reads its input.
  const Tensor images = Tensor::view(
      const_cast<float*>(batch.images.data()) + first * sample.numel(), sample.with_leading(rows));
  TraceScope forward_span(workspace.timeline, TraceKind::kForward);
  const Tensor& logits = model.forward(images, ctx);
  if (board != nullptr) board->progress();  // for the watchdog: computing is moving
  workspace.dlogits.resize(logits.shape());
  // Each micro-shard's loss over its own rows: its gradient is scaled by 1 / its rows.
  const int64_t shard_rows = rows / shards, classes = logits.dim(1);
  double loss = 0.0;
  for (int64_t shard = 0; shard < shards; ++shard) {
    int64_t shard_correct = 0;
    const int64_t at = shard * shard_rows;
    loss +=
        softmax_xent(logits.data() + at * classes, batch.labels.data() + first + at,
                     workspace.dlogits.data() + at * classes, shard_rows, classes, &shard_correct);
    *correct += shard_correct;
  }
  forward_span.close();
  TraceScope backward_span(workspace.timeline, TraceKind::kBackward);
  if (sink.sync != nullptr) sink.sync->begin_backward();
  GradReadyFn on_ready;
  if (sink.wants_ranges()) {
    on_ready = [&sink, board](const GradRange& range) {
      if (board != nullptr) board->progress();
      sink(range);
    };
  }
  if (dense.terms != nullptr) {
    model.backward_inputs(workspace.dlogits, ctx,
                          [&](int layer, const Tensor& x, const Tensor& dy) {
                            dense.terms->save(layer, dense.first_shard, x, dy);
                            if (!on_ready) return;
                            for (const GradRange& range : dense.ranges)
                              if (range.layer == layer) on_ready(range);
                          });
  } else {
    model.backward(workspace.dlogits, ctx, on_ready);
  }
  backward_span.close();
  if (sink.sync != nullptr) sink.sync->finish();
  if (board != nullptr) board->progress();
  return loss;
}

}  // namespace

// Each pass's batch in one piece or, with StepWorkspace::exact_sum, as micro-shards: each
// one's gradients computed alone and kept aside by the exact sum (which then accumulates the
// passes too), the very last one's averaged with every rank's while its backward runs.
// Without the exact sum, the passes before the last add into workspace.accumulated (see
// compute_gradients in train.h). The loss is the mean of the pieces' means, which is the
// batches' mean.
StepStats compute_gradients(Model& model, std::span<const StepInput> passes,
                            StepWorkspace& workspace, Context& ctx, GradSync* sync) {
  RINGTRAIN_CHECK(ctx.device == Device::kCpu,
                  "compute_gradients runs on the CPU; a device step is train_step");
  RINGTRAIN_CHECK(sync == nullptr || sync->device() == Device::kCpu,
                  "a CPU step averages host gradients: its GradSync must be the host engine");
  RINGTRAIN_CHECK(!passes.empty(), "a step needs at least one pass");
  ExactGradSum* const exact = workspace.exact_sum;
  RINGTRAIN_CHECK(exact == nullptr || (sync != nullptr) != workspace.exact_sum_by_caller,
                  "micro-shard steps average through a GradSync over the exact sum, or leave "
                  "the sums to the caller (exact_sum_by_caller), not both or neither");
  const auto pass_count = static_cast<int64_t>(passes.size());
  RINGTRAIN_CHECK(exact == nullptr || exact->local_micro_shards() % pass_count == 0,
                  "{} micro-shards per rank cannot be cut into {} equal passes",
                  exact != nullptr ? exact->local_micro_shards() : 0, pass_count);
  const int64_t pieces = exact != nullptr ? exact->local_micro_shards() / pass_count : 1;
  Tensor& grads = model.grads();
  const bool fold = exact == nullptr && pass_count > 1;
  if (fold) workspace.accumulated.resize(grads.shape());
  StepStats stats;
  double loss_sum = 0.0;
  if (exact != nullptr) exact->begin_step();
  // Backward writes into the model's gradient buffer again when this step ends, however.
  struct GradTarget {
    Model& model;
    bool redirected;
    ~GradTarget() {
      if (redirected) model.write_grads_to(nullptr);
    }
  } const restore{model, exact != nullptr};
  for (int64_t pass = 0; pass < pass_count; ++pass) {
    RINGTRAIN_CHECK(passes[pass].batch != nullptr,
                    "a CPU step trains on host batches; a device data set needs a CUDA context");
    const Batch& batch = *passes[pass].batch;
    const int64_t rows = batch.images.dim(0);
    RINGTRAIN_CHECK(rows % pieces == 0 && static_cast<int64_t>(batch.labels.size()) == rows,
                    "a batch of {} rows and {} labels cannot be cut into {} equal micro-shards",
                    rows, batch.labels.size(), pieces);
    const int64_t piece_rows = rows / pieces;
    stats.samples += rows;
    const bool last_pass = pass + 1 == pass_count;
    if (DenseShardTerms* const dense = exact != nullptr ? exact->dense_terms() : nullptr) {
      // A model of dense layers: the pass's micro-shards stacked into one forward and one
      // backward of the input gradients, with the bits of one after another
      // (Model::can_stack_micro_shards), each dense layer's rows kept for the exact sum,
      // which computes the micro-shards' weight gradients from them (dense_terms.h).
      RINGTRAIN_CHECK(ctx.threads == 1 && piece_rows == dense->micro_shard_rows(),
                      "stacked micro-shards of {} rows on {} Eigen threads: the exact sum keeps "
                      "micro-shards of {} rows, on one thread",
                      piece_rows, ctx.threads, dense->micro_shard_rows());
      const RangeSink sink{.grads = grads.data(), .sync = last_pass ? sync : nullptr};
      loss_sum += forward_backward(
          model, batch, 0, rows, pieces, workspace, ctx, sink, &stats.correct,
          DenseRows{.terms = dense, .first_shard = pass * pieces, .ranges = model.grad_ranges()});
      continue;
    }
    for (int64_t piece = 0; piece < pieces; ++piece) {
      const bool last = last_pass && piece + 1 == pieces;
      RangeSink sink{.grads = grads.data(),
                     .accumulated = workspace.accumulated.data(),
                     .passes = static_cast<float>(pass_count),
                     .sync = last ? sync : nullptr};
      if (fold)
        sink.fold = last_pass ? RangeSink::Fold::kFinish
                              : (pass == 0 ? RangeSink::Fold::kStart : RangeSink::Fold::kAdd);
      // Each micro-shard's gradients go straight to where the exact sum keeps them.
      const int64_t shard = pass * pieces + piece;
      if (exact != nullptr) model.write_grads_to(last ? nullptr : exact->shard_buffer(shard));
      loss_sum += forward_backward(model, batch, piece * piece_rows, piece_rows, 1, workspace, ctx,
                                   sink, &stats.correct);
      if (!last && exact != nullptr) {
        exact->kept_in_place();
        exact->note_written(shard, 0, grads.numel());  // its bounds while it is in cache
      }
    }
  }
  if (exact != nullptr && !workspace.exact_sum_by_caller) exact->finish_step();
  if (sync != nullptr) stats.comm = sync->stats();
  stats.loss = loss_sum / static_cast<double>(pieces * pass_count);
  return stats;
}

StepStats train_step(Model& model, Optimizer& optimizer, std::span<const StepInput> passes,
                     float lr, StepWorkspace& workspace, Context& ctx, GradSync* sync,
                     const BeforeUpdateFn& before_update) {
  RINGTRAIN_CHECK(ctx.device == Device::kCpu || workspace.exact_sum == nullptr,
                  "micro-shard (--reproducible) steps run on the CPU only");
  if (ctx.device == Device::kCuda) {
    RINGTRAIN_CHECK(passes.size() == 1,
                    "gradient accumulation ({} passes per step) runs on the CPU only",
                    passes.size());
    return detail::train_step_device(model, optimizer, passes.front(), lr, workspace, ctx, sync,
                                     before_update);
  }
  StepStats stats = compute_gradients(model, passes, workspace, ctx, sync);
  Tensor& params = model.params();
  const Tensor& grads = model.grads();
  if (before_update && !before_update(stats, {grads.data(), static_cast<size_t>(grads.numel())})) {
    stats.updated = false;
    return stats;
  }
  const TraceScope optimizer_span(workspace.timeline, TraceKind::kOptimizer);
  optimizer.step({params.data(), static_cast<size_t>(params.numel())},
                 {grads.data(), static_cast<size_t>(grads.numel())}, lr);
  return stats;
}

EvalResult evaluate(Model& model, const Dataset& data, int64_t begin, int64_t end,
                    int64_t batch_size, Batch& scratch, Context& ctx, ProgressBoard* board) {
  RINGTRAIN_CHECK(0 <= begin && begin <= end && end <= data.count,
                  "evaluation range [{}, {}) is outside the {} samples", begin, end, data.count);
  RINGTRAIN_CHECK(batch_size > 0, "evaluation batch size must be positive");
  EvalResult result;
  std::vector<int64_t> indices;
  for (int64_t start = begin; start < end; start += batch_size) {
    const int64_t stop = std::min(end, start + batch_size);
    indices.resize(static_cast<size_t>(stop - start));
    std::iota(indices.begin(), indices.end(), start);
    make_batch(data, indices, scratch.images, scratch.labels);
    if (ctx.device == Device::kCuda) {
      const EvalResult part = evaluate_batch_device(model, scratch, ctx, board);
      result.correct += part.correct;
      result.samples += part.samples;
      result.loss_sum += part.loss_sum;
      continue;
    }
    const Tensor& logits = model.forward(scratch.images, ctx);
    int64_t correct = 0;
    const double loss = softmax_xent<float>(logits.data(), scratch.labels.data(), nullptr,
                                            logits.dim(0), logits.dim(1), &correct);
    result.correct += correct;
    result.samples += logits.dim(0);
    result.loss_sum += loss * static_cast<double>(logits.dim(0));
    if (board != nullptr) board->progress();
  }
  return result;
}

namespace {
constexpr char kParamsMagic[8] = {'R', 'T', 'P', 'A', 'R', 'A', 'M', 'S'};
}

void save_params(const std::string& path, std::span<const float> params,
                 const std::function<void()>& progress) {
  std::vector<uint8_t> bytes(sizeof(kParamsMagic) + sizeof(uint64_t) + params.size_bytes());
  const uint64_t count = params.size();
  std::memcpy(bytes.data(), kParamsMagic, sizeof(kParamsMagic));
  std::memcpy(bytes.data() + sizeof(kParamsMagic), &count, sizeof(count));
  if (!params.empty())
    std::memcpy(bytes.data() + sizeof(kParamsMagic) + sizeof(count), params.data(),
                params.size_bytes());
  try {
    write_file_atomically(path, bytes, progress);
  } catch (const Error& error) {
    throw Error(fmt::format("--save-params {}: {}", path, error.what()), error.code());
  }
}

std::vector<float> load_params(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  RINGTRAIN_CHECK(in.good(), "cannot open parameter file {}: {}", path, std::strerror(errno));
  char magic[8] = {};
  uint64_t count = 0;
  in.read(magic, sizeof(magic));
  in.read(reinterpret_cast<char*>(&count), sizeof(count));
  RINGTRAIN_CHECK(in.good() && std::memcmp(magic, kParamsMagic, sizeof(magic)) == 0,
                  "{} is not a ringtrain parameter file (no RTPARAMS header)", path);
  // Compare without multiplying: a lying count must not overflow into a "valid" size.
  const auto size = std::filesystem::file_size(path);
  RINGTRAIN_CHECK(
      size >= 16 && (size - 16) % sizeof(float) == 0 && count == (size - 16) / sizeof(float),
      "{} claims {} parameters but holds {} bytes", path, count, size);
  std::vector<float> params(count);
  in.read(reinterpret_cast<char*>(params.data()),
          static_cast<std::streamsize>(count * sizeof(float)));
  RINGTRAIN_CHECK(in.good(), "reading {} failed", path);
  return params;
}

}  // namespace ringtrain
