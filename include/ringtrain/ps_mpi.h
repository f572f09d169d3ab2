// The parameter-server strategy over MPI (ps.h holds the transport-free logic).
//
// Roles live in a job communicator ordered chief first: job ranks 0 .. W-1 are the workers
// (worker 0, the chief, writes checkpoints and reports), W .. W+P-1 the servers. (Under
// mpirun the first P world ranks are the servers; mnist_train reorders them.)
//
// Messages go over a private duplicate of the job communicator, each as a fixed header
// followed, when it carries floats, by a payload message from the same buffer the data lives
// in (MPI keeps the order of messages between one pair with one tag):
//   worker -> server: push (the shard's gradient, its version, the learning rate), done;
//                     an exact push (--reproducible) carries the shard's fixed-point sums
//                     (int64) and then, in a third message, one int32 shift per piece;
//   server -> worker: answer (accepted or not, the version, the shard's parameters);
//   server -> chief:  snapshot (the shard's parameters and optimizer state at a version).
// One round trip per server per step: a push is answered with the parameters to use next.
// Every wait is polled with a deadline and posted on the progress board, so the watchdog
// sees a server waiting for pushes or a worker waiting for answers like any collective. The
// deadline judges progress (StallDeadline, comm.h), not one wait's wall time: a server waits
// through its workers' long compute step while the watchdog confirms they are moving.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "ringtrain/mpi_comm.h"
#include "ringtrain/ps.h"

namespace ringtrain {

// The phase servers and workers post while they exchange gradients and parameters.
inline constexpr const char* kPsPhase = "parameter-server exchange";

struct PsLayout {
  int workers = 1;
  int servers = 1;
  std::vector<ShardRange> shards;  // one per server
  int optimizer_buffers = 0;       // state buffers per shard (0: plain SGD, 1: momentum, 2: Adam)
  // --reproducible: per server, the gradient segments' pieces in its shard (split_segments);
  // empty: pushes are float gradients.
  std::vector<std::vector<SegmentPiece>> exact_pieces;
  int server_rank(int server) const { return workers + server; }
};

// The header of every message; the payload (count floats) follows in a second message.
struct PsHeader {
  int32_t kind = 0;
  int32_t sender = 0;  // worker or server index
  int64_t version = 0;
  int64_t step = 0;             // push: the worker's step; snapshot: the training step
  int64_t count = 0;            // values in the payload message that follows (0: none)
  int64_t optimizer_steps = 0;  // snapshot
  float lr = 0.0f;
  int32_t accepted = 0;
};
static_assert(sizeof(PsHeader) == 48, "docs/strategies.md gives the header's size");

// The private channel: collective over the job communicator (every rank creates it at the
// same point; MPI_Comm_idup polled under the job communicator's deadline).
class PsChannel {
 public:
  PsChannel(MpiComm& job, double timeout_s);
  ~PsChannel();
  PsChannel(const PsChannel&) = delete;
  PsChannel& operator=(const PsChannel&) = delete;
  MPI_Comm handle() const { return comm_; }
  ProgressBoard& board() { return job_.board(); }
  double timeout() const { return timeout_s_; }
  int rank() const { return job_.rank(); }
  // Polls the requests to completion under the deadline (timeout() without progress), posting
  // `what` on the board (peer: the rank waited on, or -1); throws ExitCode::kCommFailure when
  // it passes.
  void wait_all(std::span<MPI_Request> requests, const char* what, int peer);

 private:
  MpiComm& job_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  double timeout_s_;
};

struct PsServeOptions {
  // Send the chief a snapshot every `snapshot_every` versions (0: never) and at the end.
  int64_t snapshot_every = 0;
  bool final_snapshot = false;
  int64_t versions_per_step = 1;  // sync 1; async: workers (each worker's step is an update)
};

// Runs one server until every worker is done: receives pushes, answers them, and when all
// workers have said done, answers each with the final parameters. Returns its statistics.
PsServerStats serve_shard(PsChannel& channel, const PsLayout& layout, int server,
                          ShardServer& shard, const PsServeOptions& options);

// A whole-model snapshot assembled from every server's shard (checkpoints).
struct PsSnapshot {
  int64_t step = 0;
  std::vector<float> params;
  std::vector<std::vector<float>> state;  // layout.optimizer_buffers buffers of the model's size
  int64_t optimizer_steps = 0;
};

class PsClient {
 public:
  PsClient(PsChannel& channel, const PsLayout& layout, int worker);

  // Pushes shard s of grads, computed on parameters of versions[s], to every server with
  // push[s] != 0, and waits for their answers: each writes its shard's current parameters into
  // params, its version into versions[s] and whether it took the gradient into accepted[s].
  // Buffers are the model's flat ones; no copies are made.
  void push_pull(std::span<const float> grads, std::span<float> params, std::span<int64_t> versions,
                 std::span<const uint8_t> push, std::span<uint8_t> accepted, float lr,
                 int64_t step);
  // push_pull for exact servers: shard s of the fixed-point `sums` (over the whole buffer) and
  // the shifts of its pieces, taken from `segment_shifts` (one per gradient segment).
  void push_pull_exact(std::span<const int64_t> sums, std::span<const int> segment_shifts,
                       std::span<float> params, std::span<int64_t> versions,
                       std::span<const uint8_t> push, std::span<uint8_t> accepted, float lr,
                       int64_t step);
  // Tells every server this worker is done; returns when all workers are, with the final
  // parameters in params and the final versions in versions.
  void finish(std::span<float> params, std::span<int64_t> versions);
  // The chief: receives the snapshots the servers have sent so far and returns the complete
  // ones in step order. With wait_for_step >= 0 it waits until that step's set is complete.
  std::vector<PsSnapshot> collect_snapshots(int64_t wait_for_step = -1);

  int64_t bytes_sent() const { return bytes_sent_; }
  int64_t bytes_received() const { return bytes_received_; }

 private:
  // One push (or done) to the servers with push[s] != 0; the payload is `grads` or, when
  // `sums` is not empty, the exact sums and shifts.
  void round(std::span<const float> grads, std::span<const int64_t> sums,
             std::span<const int> segment_shifts, std::span<float> params,
             std::span<int64_t> versions, std::span<const uint8_t> push,
             std::span<uint8_t> accepted, float lr, int64_t step, int32_t kind);
  bool receive_snapshot_part();  // one part if one has arrived

  PsChannel& channel_;
  PsLayout layout_;
  int worker_;
  std::vector<PsHeader> out_, in_;  // per server
  std::vector<MPI_Request> requests_;
  std::vector<std::vector<int32_t>> piece_shifts_;  // exact pushes: per server
  struct Partial {
    PsSnapshot snapshot;
    int parts = 0;
  };
  std::map<int64_t, Partial> partial_snapshots_;  // by step
  int64_t bytes_sent_ = 0, bytes_received_ = 0;
};

}  // namespace ringtrain
