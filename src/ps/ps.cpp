// The parameter server's logic without a transport (see ps.h).
#include "ringtrain/ps.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "ringtrain/check.h"
#include "ringtrain/exact_sum.h"

namespace ringtrain {

const char* to_string(PsMode mode) {
  return mode == PsMode::kSync ? "sync" : "async";
}

PsMode parse_ps_mode(const std::string& text) {
  if (text == "sync") return PsMode::kSync;
  if (text == "async") return PsMode::kAsync;
  RINGTRAIN_FAIL("--ps-mode must be sync or async, got '{}'", text);
}

std::vector<ShardRange> plan_shards(std::span<const int64_t> tensor_sizes, int servers) {
  const auto tensors = static_cast<int64_t>(tensor_sizes.size());
  RINGTRAIN_CHECK(servers >= 1, "--num-ps must be at least 1, got {}", servers);
  RINGTRAIN_CHECK(tensors >= servers,
                  "--num-ps {}: the model has only {} parameter tensors, and each server must "
                  "hold at least one; use --num-ps {} or fewer",
                  servers, tensors, tensors);
  int64_t total = 0;
  for (const int64_t size : tensor_sizes) total += size;
  std::vector<ShardRange> shards;
  int64_t next = 0;  // the first tensor not yet placed
  int64_t offset = 0;
  for (int s = 0; s < servers; ++s) {
    ShardRange shard{offset, offset};
    const int64_t later_servers = servers - 1 - s;
    if (later_servers == 0) {
      for (; next < tensors; ++next) shard.end += tensor_sizes[static_cast<size_t>(next)];
    } else {
      // The ideal end of this shard; take tensors while that brings the end no farther from
      // it (an empty tensor goes along), leaving at least one tensor for each later server.
      const double target =
          static_cast<double>(total) * static_cast<double>(s + 1) / static_cast<double>(servers);
      do {
        shard.end += tensor_sizes[static_cast<size_t>(next++)];
      } while (next < tensors - later_servers &&
               std::abs(static_cast<double>(shard.end + tensor_sizes[static_cast<size_t>(next)]) -
                        target) <= std::abs(static_cast<double>(shard.end) - target));
    }
    offset = shard.end;
    shards.push_back(shard);
  }
  return shards;
}

std::vector<std::vector<SegmentPiece>> split_segments(std::span<const ShardRange> shards,
                                                      std::span<const GradRange> segments) {
  std::vector<std::vector<SegmentPiece>> pieces(shards.size());
  size_t segment = 0;
  for (size_t s = 0; s < shards.size(); ++s) {
    const ShardRange& shard = shards[s];
    for (int64_t at = shard.begin; at < shard.end;) {
      while (segment < segments.size() && segments[segment].end <= at) ++segment;
      RINGTRAIN_CHECK(segment < segments.size() && segments[segment].begin <= at,
                      "the gradient segments do not cover parameter {} of shard [{}, {})", at,
                      shard.begin, shard.end);
      const int64_t end = std::min(shard.end, segments[segment].end);
      pieces[s].push_back({.range = {at, end}, .segment = segment});
      at = end;
    }
  }
  return pieces;
}

std::vector<int64_t> tensor_sizes(const Model& model) {
  std::vector<ParamView> views = model.param_views();
  std::sort(views.begin(), views.end(),
            [](const ParamView& a, const ParamView& b) { return a.offset < b.offset; });
  std::vector<int64_t> sizes;
  int64_t expected = 0;
  for (const ParamView& view : views) {
    RINGTRAIN_CHECK(view.offset == expected, "parameter {} starts at {}, expected {}", view.name,
                    view.offset, expected);
    sizes.push_back(view.size);
    expected += view.size;
  }
  return sizes;
}

ShardServer::ShardServer(const ShardServerConfig& config, ShardRange range,
                         std::unique_ptr<Optimizer> optimizer)
    : config_(config), range_(range), optimizer_(std::move(optimizer)) {
  RINGTRAIN_CHECK(config.workers >= 1, "a parameter server needs at least one worker");
  RINGTRAIN_CHECK(config.mode != PsMode::kSync || (config.replicas_to_aggregate >= 1 &&
                                                   config.replicas_to_aggregate <= config.workers),
                  "--replicas-to-aggregate must be between 1 and the {} workers, got {}",
                  config.workers, config.replicas_to_aggregate);
  RINGTRAIN_CHECK(config.max_staleness >= 0, "--max-staleness must be >= 0, got {}",
                  config.max_staleness);
  const auto size = static_cast<size_t>(range.size());
  params_.assign(size, 0.0f);
  scratch_.assign(size, 0.0f);
  applied_per_worker_.assign(static_cast<size_t>(config.workers), 0);
  if (!config.exact_pieces.empty()) {
    RINGTRAIN_CHECK(config.mode == PsMode::kSync &&
                        config.replicas_to_aggregate == config.workers &&
                        config.exact_micro_shards >= 1,
                    "an exact parameter server aggregates every worker's sums in sync mode");
    int64_t at = range.begin;
    for (const SegmentPiece& piece : config.exact_pieces) {
      RINGTRAIN_CHECK(piece.range.begin == at && piece.range.end > at,
                      "the exact sum's pieces must tile shard [{}, {}): [{}, {}) after {}",
                      range.begin, range.end, piece.range.begin, piece.range.end, at);
      at = piece.range.end;
    }
    RINGTRAIN_CHECK(at == range.end, "the exact sum's pieces end at {}, shard [{}, {})", at,
                    range.begin, range.end);
    const auto workers = static_cast<size_t>(config.workers);
    exact_sums_.assign(workers + 1, std::vector<int64_t>(size));  // the last: stale pushes
    exact_shifts_.assign(workers + 1, std::vector<int32_t>(config.exact_pieces.size()));
    exact_total_.assign(size, 0);
    average_.assign(size, 0.0f);
    pending_.reserve(workers);
  } else if (config.mode == PsMode::kSync) {
    slots_.assign(static_cast<size_t>(config.workers), std::vector<float>(size));
    average_.assign(size, 0.0f);
    pending_.reserve(static_cast<size_t>(config.workers));
  }
  answer_.reserve(static_cast<size_t>(config.workers));
}

void ShardServer::start(std::span<const float> params, const std::vector<std::vector<float>>& state,
                        int64_t optimizer_steps, int64_t version) {
  RINGTRAIN_CHECK(params.size() == params_.size(),
                  "server shard [{}, {}) got {} parameters to start from", range_.begin, range_.end,
                  params.size());
  const auto buffers = optimizer_->state();
  // Everything is checked before anything changes: a refused start leaves the server as it was.
  RINGTRAIN_CHECK(state.empty() || state.size() == buffers.size(),
                  "server shard [{}, {}): {} optimizer state buffers, the optimizer has {}",
                  range_.begin, range_.end, state.size(), buffers.size());
  for (size_t b = 0; b < state.size(); ++b) {
    RINGTRAIN_CHECK(state[b].size() == buffers[b].size(),
                    "server shard [{}, {}): optimizer state buffer {} holds {}, expected {}",
                    range_.begin, range_.end, b, state[b].size(), buffers[b].size());
  }
  std::copy(params.begin(), params.end(), params_.begin());
  // No state given: a fresh start, zero momentum and moments.
  for (size_t b = 0; b < buffers.size(); ++b) {
    if (state.empty()) {
      std::fill(buffers[b].begin(), buffers[b].end(), 0.0f);
    } else {
      std::copy(state[b].begin(), state[b].end(), buffers[b].begin());
    }
  }
  optimizer_->set_steps_taken(optimizer_steps);
  version_ = version;
  pending_.clear();
}

std::span<float> ShardServer::gradient_buffer(int worker, int64_t version) {
  RINGTRAIN_CHECK(!exact(), "gradient_buffer() of an exact server: its pushes are sums");
  RINGTRAIN_CHECK(worker >= 0 && worker < config_.workers, "a push from unknown worker {}", worker);
  if (config_.mode == PsMode::kSync && version == version_) {
    // Checked here, before the transport writes over the gradient held for this version.
    RINGTRAIN_CHECK(std::find(pending_.begin(), pending_.end(), worker) == pending_.end(),
                    "worker {} pushed twice for version {} (a bug)", worker, version);
    return slots_[static_cast<size_t>(worker)];
  }
  return scratch_;
}

ShardServer::ExactPush ShardServer::exact_buffer(int worker, int64_t version) {
  RINGTRAIN_CHECK(exact(), "exact_buffer() of a server of float gradients");
  RINGTRAIN_CHECK(worker >= 0 && worker < config_.workers, "a push from unknown worker {}", worker);
  auto slot = static_cast<size_t>(config_.workers);  // too old: received, then dropped
  if (version == version_) {
    RINGTRAIN_CHECK(std::find(pending_.begin(), pending_.end(), worker) == pending_.end(),
                    "worker {} pushed twice for version {} (a bug)", worker, version);
    slot = static_cast<size_t>(worker);
  }
  return {exact_sums_[slot], exact_shifts_[slot]};
}

void ShardServer::average_exactly() {
  const std::vector<int32_t>& shifts = exact_shifts_[static_cast<size_t>(pending_[0])];
  for (const int w : pending_) {
    // Every worker derived the shifts from the same agreed bounds (ExactGradSum::local_sums).
    RINGTRAIN_CHECK(exact_shifts_[static_cast<size_t>(w)] == shifts,
                    "worker {} pushed other fixed-point scales than worker {} for version {} (a "
                    "bug: the workers agree on them)",
                    w, pending_[0], version_);
  }
  std::fill(exact_total_.begin(), exact_total_.end(), 0);
  for (const int w : pending_) {  // integer addition: the order does not matter
    const std::vector<int64_t>& sums = exact_sums_[static_cast<size_t>(w)];
    for (size_t j = 0; j < exact_total_.size(); ++j) exact_total_[j] += sums[j];
  }
  for (size_t p = 0; p < config_.exact_pieces.size(); ++p) {
    const ShardRange& piece = config_.exact_pieces[p].range;
    const auto offset = static_cast<size_t>(piece.begin - range_.begin);
    const auto size = static_cast<size_t>(piece.size());
    from_fixed_point({exact_total_.data() + offset, size}, shifts[p], config_.exact_micro_shards,
                     {average_.data() + offset, size});
  }
}

void ShardServer::apply(std::span<const float> gradient, float lr) {
  optimizer_->step(params_, gradient, lr);
  ++version_;
  ++stats_.updates;
}

ShardServer::PushOutcome ShardServer::push(int worker, int64_t version, float lr) {
  RINGTRAIN_CHECK(worker >= 0 && worker < config_.workers, "a push from unknown worker {}", worker);
  RINGTRAIN_CHECK(version <= version_,
                  "worker {} pushed a gradient for version {}, but this server is only at {}: "
                  "the worker and the server disagree about the run (a bug)",
                  worker, version, version_);
  PushOutcome outcome;
  outcome.staleness = version_ - version;
  answer_.clear();
  if (config_.mode == PsMode::kSync) {
    if (version < version_) {  // computed for an older version: too late, dropped
      ++stats_.gradients;
      ++stats_.dropped_stale;
      answer_.push_back(worker);
      outcome.answer = answer_;
      return outcome;
    }
    RINGTRAIN_CHECK(std::find(pending_.begin(), pending_.end(), worker) == pending_.end(),
                    "worker {} pushed twice for version {} (a bug)", worker, version);
    ++stats_.gradients;
    outcome.accepted = true;
    pending_.push_back(worker);
    if (static_cast<int>(pending_.size()) < config_.replicas_to_aggregate) return outcome;
    std::sort(pending_.begin(), pending_.end());
    if (exact()) {
      average_exactly();
    } else {
      // The average of the R gradients, summed in worker order whatever order they came in,
      // so that the same workers give the same bits (R = workers: a deterministic run).
      std::copy(slots_[static_cast<size_t>(pending_[0])].begin(),
                slots_[static_cast<size_t>(pending_[0])].end(), average_.begin());
      for (size_t i = 1; i < pending_.size(); ++i) {
        const std::vector<float>& slot = slots_[static_cast<size_t>(pending_[i])];
        for (size_t j = 0; j < average_.size(); ++j) average_[j] += slot[j];
      }
      const auto divisor = static_cast<float>(pending_.size());
      for (float& value : average_) value /= divisor;
    }
    apply(average_, lr);
    stats_.aggregated += static_cast<int64_t>(pending_.size());
    for (const int w : pending_) ++applied_per_worker_[static_cast<size_t>(w)];
    outcome.applied = true;
    answer_.assign(pending_.begin(), pending_.end());
    outcome.answer = answer_;
    pending_.clear();
    return outcome;
  }
  // async: apply on arrival unless too stale.
  ++stats_.gradients;
  answer_.push_back(worker);
  outcome.answer = answer_;
  if (outcome.staleness > config_.max_staleness) {
    ++stats_.rejected_stale;
    return outcome;
  }
  outcome.accepted = true;
  ++stats_.staleness[std::min<int64_t>(outcome.staleness, kStalenessBins - 1)];
  stats_.max_staleness = std::max(stats_.max_staleness, outcome.staleness);
  apply(scratch_, lr);
  ++applied_per_worker_[static_cast<size_t>(worker)];
  outcome.applied = true;
  return outcome;
}

std::string describe_staleness(const PsServerStats& stats) {
  std::string text;
  int64_t last = -1;  // the last bin with a count
  for (int64_t s = 0; s < kStalenessBins; ++s)
    if (stats.staleness[s] > 0) last = s;
  for (int64_t s = 0; s <= last; ++s) {
    text += fmt::format("{}{}{}: {}", text.empty() ? "" : ", ", s,
                        s == kStalenessBins - 1 ? "+" : "", stats.staleness[s]);
  }
  return fmt::format("{} (max {})", text.empty() ? "none" : text, stats.max_staleness);
}

}  // namespace ringtrain
