// The parameter-server strategy over MPI (see ps_mpi.h for the protocol).
#include "ringtrain/ps_mpi.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <list>
#include <thread>

#include "ringtrain/check.h"

namespace ringtrain {
namespace {

using Clock = std::chrono::steady_clock;

enum Kind : int32_t { kPush = 1, kDone = 2, kAnswer = 3, kSnapshot = 4 };
enum Tag : int {
  kTagToServer = 11,
  kTagToServerPayload = 12,
  kTagAnswer = 13,
  kTagAnswerPayload = 14,
  kTagSnapshot = 15,
  kTagSnapshotPayload = 16,
  kTagToServerShifts = 17,
};

// Polls without pause this long, then sleeps between polls: servers and workers often share a
// node's cores, where a spinning waiter takes cycles from the computation it waits for.
constexpr auto kSpin = std::chrono::microseconds(200);
constexpr auto kBackoff = std::chrono::microseconds(50);

int as_count(int64_t floats) {
  RINGTRAIN_CHECK(floats >= 0 && floats <= INT_MAX,
                  "a message of {} floats is over MPI's int count", floats);
  return static_cast<int>(floats);
}

}  // namespace

PsChannel::PsChannel(MpiComm& job, double timeout_s) : job_(job), timeout_s_(timeout_s) {
  comm_ = job.duplicate("the parameter-server channel's MPI_Comm_idup");
}

PsChannel::~PsChannel() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (comm_ != MPI_COMM_NULL && !finalized) MPI_Comm_free(&comm_);
}

void PsChannel::wait_all(std::span<MPI_Request> requests, const char* what, int peer) {
  const WaitScope post(board(), what, peer);
  const auto start = Clock::now();
  // Progress, not this wait's wall time: a server waits through its workers' compute, and the
  // watchdog notes on the board that they are moving.
  StallDeadline deadline(board(), timeout_s_);
  for (;;) {
    int done = 0;
    RINGTRAIN_CHECK_MPI(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done,
                                    MPI_STATUSES_IGNORE));
    if (done) return;
    const auto now = Clock::now();
    if (deadline.passed()) {
      throw Error(fmt::format("job rank {}: no progress for {:g} s waiting for {}{}: did a "
                              "server or a worker die or stall? (--collective-timeout)",
                              job_.rank(), timeout_s_, what,
                              peer >= 0 ? fmt::format(" (job rank {})", peer) : std::string()),
                  ExitCode::kCommFailure);
    }
    if (now - start >= kSpin) std::this_thread::sleep_for(kBackoff);
  }
}

PsServerStats serve_shard(PsChannel& channel, const PsLayout& layout, int server,
                          ShardServer& shard, const PsServeOptions& options) {
  const MPI_Comm comm = channel.handle();
  const int workers = layout.workers;
  const ShardRange range = layout.shards[static_cast<size_t>(server)];
  const int size = as_count(range.size());
  PsServerStats& stats = shard.stats();
  constexpr auto kHeaderBytes = static_cast<int>(sizeof(PsHeader));

  // One answer in flight per worker at most (a worker waits for it before pushing again).
  std::vector<PsHeader> answers(static_cast<size_t>(workers));
  std::vector<MPI_Request> answer_requests(2 * static_cast<size_t>(workers), MPI_REQUEST_NULL);
  const auto answer = [&](int worker, bool accepted) {
    PsHeader& header = answers[static_cast<size_t>(worker)];
    header = PsHeader{.kind = kAnswer,
                      .sender = server,
                      .version = shard.version(),
                      .count = size,
                      .accepted = accepted ? 1 : 0};
    // The parameters go straight from the shard: no update runs until this send completes.
    RINGTRAIN_CHECK_MPI(MPI_Isend(&header, kHeaderBytes, MPI_BYTE, worker, kTagAnswer, comm,
                                  &answer_requests[2 * static_cast<size_t>(worker)]));
    RINGTRAIN_CHECK_MPI(MPI_Isend(const_cast<float*>(shard.params().data()), size, MPI_FLOAT,
                                  worker, kTagAnswerPayload, comm,
                                  &answer_requests[2 * static_cast<size_t>(worker) + 1]));
    stats.bytes_sent += kHeaderBytes + static_cast<int64_t>(size) * 4;
  };
  const auto complete_answers = [&] {
    channel.wait_all(answer_requests, "workers receiving parameters", -1);
  };

  // Snapshots for the chief's checkpoints: copied, so that training goes on while they travel.
  struct Outgoing {
    PsHeader header;
    std::vector<float> data;
    MPI_Request requests[2] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  };
  std::list<Outgoing> snapshots;
  int64_t last_snapshot_step = -1;
  const auto send_snapshot = [&] {
    // Finished sends are freed first (MPI_Testall sets them to MPI_REQUEST_NULL).
    snapshots.remove_if([](Outgoing& o) {
      int done = 0;
      MPI_Testall(2, o.requests, &done, MPI_STATUSES_IGNORE);
      return done != 0;
    });
    Outgoing& out = snapshots.emplace_back();
    const auto state = shard.optimizer().state();
    out.data.assign(shard.params().begin(), shard.params().end());
    for (const std::span<float> buffer : state)
      out.data.insert(out.data.end(), buffer.begin(), buffer.end());
    out.header = PsHeader{.kind = kSnapshot,
                          .sender = server,
                          .version = shard.version(),
                          .step = shard.version() / options.versions_per_step,
                          .count = static_cast<int64_t>(out.data.size()),
                          .optimizer_steps = shard.optimizer().steps_taken()};
    RINGTRAIN_CHECK_MPI(
        MPI_Isend(&out.header, kHeaderBytes, MPI_BYTE, 0, kTagSnapshot, comm, &out.requests[0]));
    RINGTRAIN_CHECK_MPI(MPI_Isend(out.data.data(), as_count(out.header.count), MPI_FLOAT, 0,
                                  kTagSnapshotPayload, comm, &out.requests[1]));
    stats.bytes_sent += kHeaderBytes + out.header.count * 4;
    last_snapshot_step = out.header.step;
  };
  const int64_t snapshot_period = options.snapshot_every * options.versions_per_step;

  // The same phase as the workers' pushes: for the watchdog, one exchange that some ranks
  // have not reached.
  channel.board().set_phase(kPsPhase);
  channel.board().set_step(shard.version() / options.versions_per_step);
  std::vector<uint8_t> done(static_cast<size_t>(workers), 0);
  int done_count = 0;
  PsHeader in;
  MPI_Request requests[1];
  while (done_count < workers) {
    RINGTRAIN_CHECK_MPI(
        MPI_Irecv(&in, kHeaderBytes, MPI_BYTE, MPI_ANY_SOURCE, kTagToServer, comm, &requests[0]));
    channel.wait_all(requests, "a push from any worker", -1);
    stats.bytes_received += kHeaderBytes;
    const int worker = in.sender;
    RINGTRAIN_CHECK(worker >= 0 && worker < workers && !done[static_cast<size_t>(worker)],
                    "parameter server {}: a message from worker {}, which is unknown or done",
                    server, worker);
    if (in.kind == kDone) {
      done[static_cast<size_t>(worker)] = 1;
      ++done_count;
      continue;
    }
    RINGTRAIN_CHECK(in.kind == kPush && in.count == size,
                    "parameter server {}: worker {} sent message kind {} with {} floats; expected "
                    "a push of {}",
                    server, worker, in.kind, in.count, size);
    complete_answers();  // the parameters must not change under an answer in flight
    if (shard.exact()) {
      const ShardServer::ExactPush push = shard.exact_buffer(worker, in.version);
      MPI_Request exact_requests[2];
      RINGTRAIN_CHECK_MPI(MPI_Irecv(push.sums.data(), size, MPI_INT64_T, worker,
                                    kTagToServerPayload, comm, &exact_requests[0]));
      RINGTRAIN_CHECK_MPI(MPI_Irecv(push.shifts.data(), as_count(std::ssize(push.shifts)),
                                    MPI_INT32_T, worker, kTagToServerShifts, comm,
                                    &exact_requests[1]));
      channel.wait_all(exact_requests, "a pushed fixed-point gradient sum", worker);
      stats.bytes_received += static_cast<int64_t>(size) * 8 + std::ssize(push.shifts) * 4;
    } else {
      const std::span<float> gradient = shard.gradient_buffer(worker, in.version);
      RINGTRAIN_CHECK_MPI(MPI_Irecv(gradient.data(), size, MPI_FLOAT, worker, kTagToServerPayload,
                                    comm, &requests[0]));
      channel.wait_all(requests, "a pushed gradient", worker);
      stats.bytes_received += static_cast<int64_t>(size) * 4;
    }
    const ShardServer::PushOutcome outcome = shard.push(worker, in.version, in.lr);
    channel.board().set_step(shard.version() / options.versions_per_step);
    for (const int w : outcome.answer) answer(w, w != worker || outcome.accepted);
    if (outcome.applied && snapshot_period > 0 && shard.version() % snapshot_period == 0)
      send_snapshot();
  }
  // Every worker is done: each gets the final parameters.
  complete_answers();
  for (int w = 0; w < workers; ++w) answer(w, true);
  // One snapshot per step: async pushes in flight at the end may add up to workers - 1 updates
  // after the one that completed the last step, which the chief has as that step's already.
  if (options.final_snapshot && last_snapshot_step != shard.version() / options.versions_per_step)
    send_snapshot();
  complete_answers();
  for (Outgoing& o : snapshots) channel.wait_all(o.requests, "the chief receiving a snapshot", 0);
  return stats;
}

PsClient::PsClient(PsChannel& channel, const PsLayout& layout, int worker)
    : channel_(channel),
      layout_(layout),
      worker_(worker),
      out_(static_cast<size_t>(layout.servers)),
      in_(static_cast<size_t>(layout.servers)),
      requests_(5 * static_cast<size_t>(layout.servers), MPI_REQUEST_NULL) {
  for (const std::vector<SegmentPiece>& pieces : layout.exact_pieces)
    piece_shifts_.emplace_back(pieces.size());
}

void PsClient::round(std::span<const float> grads, std::span<const int64_t> sums,
                     std::span<const int> segment_shifts, std::span<float> params,
                     std::span<int64_t> versions, std::span<const uint8_t> push,
                     std::span<uint8_t> accepted, float lr, int64_t step, int32_t kind) {
  const MPI_Comm comm = channel_.handle();
  constexpr auto kHeaderBytes = static_cast<int>(sizeof(PsHeader));
  std::fill(requests_.begin(), requests_.end(), MPI_REQUEST_NULL);
  for (int s = 0; s < layout_.servers; ++s) {
    const auto si = static_cast<size_t>(s);
    if (!push[si]) continue;
    const int rank = layout_.server_rank(s);
    const ShardRange& range = layout_.shards[si];
    const int size = as_count(range.size());
    // The answer's receives are posted before the push leaves, so a server never waits on them.
    RINGTRAIN_CHECK_MPI(
        MPI_Irecv(&in_[si], kHeaderBytes, MPI_BYTE, rank, kTagAnswer, comm, &requests_[5 * si]));
    RINGTRAIN_CHECK_MPI(MPI_Irecv(params.data() + range.begin, size, MPI_FLOAT, rank,
                                  kTagAnswerPayload, comm, &requests_[5 * si + 1]));
    out_[si] = PsHeader{.kind = kind,
                        .sender = worker_,
                        .version = versions[si],
                        .step = step,
                        .count = kind == kPush ? size : 0,
                        .lr = lr};
    RINGTRAIN_CHECK_MPI(MPI_Isend(&out_[si], kHeaderBytes, MPI_BYTE, rank, kTagToServer, comm,
                                  &requests_[5 * si + 2]));
    bytes_sent_ += kHeaderBytes;
    if (kind == kPush && !sums.empty()) {
      std::vector<int32_t>& shifts = piece_shifts_[si];
      const std::vector<SegmentPiece>& pieces = layout_.exact_pieces[si];
      for (size_t p = 0; p < pieces.size(); ++p) shifts[p] = segment_shifts[pieces[p].segment];
      RINGTRAIN_CHECK_MPI(MPI_Isend(sums.data() + range.begin, size, MPI_INT64_T, rank,
                                    kTagToServerPayload, comm, &requests_[5 * si + 3]));
      RINGTRAIN_CHECK_MPI(MPI_Isend(shifts.data(), as_count(std::ssize(shifts)), MPI_INT32_T, rank,
                                    kTagToServerShifts, comm, &requests_[5 * si + 4]));
      bytes_sent_ += static_cast<int64_t>(size) * 8 + std::ssize(shifts) * 4;
    } else if (kind == kPush) {
      RINGTRAIN_CHECK_MPI(MPI_Isend(grads.data() + range.begin, size, MPI_FLOAT, rank,
                                    kTagToServerPayload, comm, &requests_[5 * si + 3]));
      bytes_sent_ += static_cast<int64_t>(size) * 4;
    }
  }
  channel_.wait_all(
      requests_,
      kind == kPush ? "the parameter servers' answers" : "the parameter servers' final parameters",
      -1);
  for (int s = 0; s < layout_.servers; ++s) {
    const auto si = static_cast<size_t>(s);
    if (!push[si]) continue;
    RINGTRAIN_CHECK(in_[si].kind == kAnswer && in_[si].count == layout_.shards[si].size(),
                    "worker {}: server {} answered with kind {} and {} floats (a bug)", worker_, s,
                    in_[si].kind, in_[si].count);
    versions[si] = in_[si].version;
    accepted[si] = static_cast<uint8_t>(in_[si].accepted);
    bytes_received_ += kHeaderBytes + in_[si].count * 4;
  }
}

void PsClient::push_pull(std::span<const float> grads, std::span<float> params,
                         std::span<int64_t> versions, std::span<const uint8_t> push,
                         std::span<uint8_t> accepted, float lr, int64_t step) {
  RINGTRAIN_CHECK(layout_.exact_pieces.empty(), "exact servers take push_pull_exact()");
  round(grads, {}, {}, params, versions, push, accepted, lr, step, kPush);
}

void PsClient::push_pull_exact(std::span<const int64_t> sums, std::span<const int> segment_shifts,
                               std::span<float> params, std::span<int64_t> versions,
                               std::span<const uint8_t> push, std::span<uint8_t> accepted, float lr,
                               int64_t step) {
  RINGTRAIN_CHECK(!layout_.exact_pieces.empty() && !sums.empty(),
                  "push_pull_exact() needs exact servers and sums");
  round({}, sums, segment_shifts, params, versions, push, accepted, lr, step, kPush);
}

void PsClient::finish(std::span<float> params, std::span<int64_t> versions) {
  const std::vector<uint8_t> all(static_cast<size_t>(layout_.servers), 1);
  std::vector<uint8_t> accepted(all.size());
  round({}, {}, {}, params, versions, all, accepted, 0.0f, -1, kDone);
}

bool PsClient::receive_snapshot_part() {
  const MPI_Comm comm = channel_.handle();
  int arrived = 0;
  MPI_Status status;
  RINGTRAIN_CHECK_MPI(MPI_Iprobe(MPI_ANY_SOURCE, kTagSnapshot, comm, &arrived, &status));
  if (!arrived) return false;
  PsHeader header;
  MPI_Request requests[1];
  RINGTRAIN_CHECK_MPI(MPI_Irecv(&header, sizeof(header), MPI_BYTE, status.MPI_SOURCE, kTagSnapshot,
                                comm, &requests[0]));
  channel_.wait_all(requests, "a snapshot header", status.MPI_SOURCE);
  const int server = header.sender;
  RINGTRAIN_CHECK(
      server >= 0 && server < layout_.servers && status.MPI_SOURCE == layout_.server_rank(server),
      "the chief got a snapshot from job rank {} claiming to be server {}", status.MPI_SOURCE,
      server);
  const ShardRange& range = layout_.shards[static_cast<size_t>(server)];
  const int64_t buffers = layout_.optimizer_buffers;
  RINGTRAIN_CHECK(header.count == range.size() * (1 + buffers),
                  "server {} sent a snapshot of {} floats, expected {}", server, header.count,
                  range.size() * (1 + buffers));
  std::vector<float> data(static_cast<size_t>(header.count));
  RINGTRAIN_CHECK_MPI(MPI_Irecv(data.data(), as_count(header.count), MPI_FLOAT, status.MPI_SOURCE,
                                kTagSnapshotPayload, comm, &requests[0]));
  channel_.wait_all(requests, "a snapshot", status.MPI_SOURCE);
  bytes_received_ += static_cast<int64_t>(sizeof(header)) + header.count * 4;

  Partial& partial = partial_snapshots_[header.step];
  PsSnapshot& snapshot = partial.snapshot;
  if (partial.parts == 0) {
    const auto total = static_cast<size_t>(layout_.shards.back().end);
    snapshot.step = header.step;
    snapshot.params.assign(total, 0.0f);
    snapshot.state.assign(static_cast<size_t>(buffers), std::vector<float>(total, 0.0f));
    snapshot.optimizer_steps = header.optimizer_steps;
  }
  RINGTRAIN_CHECK(snapshot.optimizer_steps == header.optimizer_steps,
                  "the servers' snapshots of step {} disagree on the optimizer's step count ({} "
                  "and {})",
                  header.step, snapshot.optimizer_steps, header.optimizer_steps);
  const auto size = static_cast<size_t>(range.size());
  const auto begin = static_cast<size_t>(range.begin);
  std::copy_n(data.begin(), size, snapshot.params.begin() + static_cast<ptrdiff_t>(begin));
  for (size_t b = 0; b < static_cast<size_t>(buffers); ++b) {
    std::copy_n(data.begin() + static_cast<ptrdiff_t>((b + 1) * size), size,
                snapshot.state[b].begin() + static_cast<ptrdiff_t>(begin));
  }
  ++partial.parts;
  return true;
}

std::vector<PsSnapshot> PsClient::collect_snapshots(int64_t wait_for_step) {
  while (receive_snapshot_part()) {
  }
  if (wait_for_step >= 0) {
    const WaitScope post(channel_.board(), "the servers' last snapshot", -1);
    StallDeadline deadline(channel_.board(), channel_.timeout());
    while (partial_snapshots_[wait_for_step].parts < layout_.servers) {
      if (!receive_snapshot_part()) {
        RINGTRAIN_CHECK(!deadline.passed(),
                        "the chief waited {:g} s without progress for the servers' snapshots of "
                        "step {} ({} of {} arrived)",
                        channel_.timeout(), wait_for_step, partial_snapshots_[wait_for_step].parts,
                        layout_.servers);
        std::this_thread::sleep_for(kBackoff);
      }
    }
  }
  std::vector<PsSnapshot> complete;
  for (auto it = partial_snapshots_.begin(); it != partial_snapshots_.end();) {
    if (it->second.parts == layout_.servers) {
      complete.push_back(std::move(it->second.snapshot));
      it = partial_snapshots_.erase(it);
    } else {
      ++it;
    }
  }
  return complete;
}

}  // namespace ringtrain
