// The wire under the collectives: a small point-to-point interface for ring neighbours plus the
// library's own collectives (kept as baselines and for small, rare messages). The ring
// algorithm (ring.h) is written once against this interface; MPI implements it for host
// memory, NcclComm (nccl_comm.h) for device memory, and the tests implement it over threads.
//
// Every call is collective over the communicator or paired with a matching call on the peer;
// a failure throws ringtrain::Error naming the call, the peer and the library's message.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ringtrain/progress_board.h"

namespace ringtrain {

enum class ReduceOp { kSum, kAvg };
const char* to_string(ReduceOp op);
ReduceOp parse_reduce_op(const std::string& text);  // "sum" | "avg"; throws naming --op

// A handle for a non-blocking transfer; a transport keeps what it needs in `id`.
struct CommRequest {
  int64_t id = -1;
  bool active() const { return id >= 0; }
};

class Comm {
 public:
  virtual ~Comm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Ranks on this node and this rank's index among them (GPU selection, logging).
  virtual int local_rank() const = 0;
  virtual int local_size() const = 0;
  virtual std::string name() const = 0;  // "mpi", "threads"

  // Non-blocking transfers of n floats to / from a peer; `tag` tells concurrent transfers
  // between the same pair apart (the ring uses the segment index). Buffers must stay valid
  // and untouched until wait() returns.
  virtual CommRequest isend(const float* data, size_t n, int peer, int tag) = 0;
  virtual CommRequest irecv(float* data, size_t n, int peer, int tag) = 0;
  // Completes a request (a no-op on an inactive one) and marks it inactive.
  virtual void wait(CommRequest& request) = 0;
  // How long wait() polls without pause before it sleeps between polls: long (the default,
  // lowest latency) for a thread with nothing else to do, short for the overlap engine's
  // communication thread, which shares the cores with computation. Transports that do not
  // poll ignore it.
  virtual void set_spin_before_sleep(std::chrono::microseconds spin) { (void)spin; }
  // Sends to `dst` while receiving from `src`; returns when both are done.
  void sendrecv(const float* send, size_t send_n, int dst, float* recv, size_t recv_n, int src,
                int tag = 0);

  // dst[i] += src[i]; where the data lives decides how (a host loop here, a kernel on GPUs).
  virtual void add_inplace(float* dst, const float* src, size_t n);
  // data[i] /= divisor: the one division of an average (by the rank that owns a finished
  // chunk). A host loop here, exactly what ring.cpp does; a device transport overrides it with
  // a kernel on its stream. Used by the device ring (nccl_comm.h); ring.cpp divides itself.
  virtual void divide_inplace(float* data, size_t n, float divisor) {
    for (size_t i = 0; i < n; ++i) data[i] /= divisor;
  }
  // The library's own allreduce (MPI_Allreduce / ncclAllReduce): the baseline.
  virtual void allreduce_library(float* data, size_t n, ReduceOp op) = 0;
  // Broadcast of raw bytes from `root` to every rank.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // Every rank contributes `bytes` bytes; recv gets size() * bytes, rank-ordered.
  virtual void allgather(const void* send, void* recv, size_t bytes) = 0;
  virtual void barrier() = 0;

  // This rank's progress, for the watchdog; transports post their waits here.
  ProgressBoard& board() { return *board_; }
  // Post on `other`'s board from now on: a communicator split from the watched one (the
  // parameter-server strategy's) reports its waits where the watchdog looks.
  void post_on_board_of(Comm& other) { board_ = &other.board(); }

 private:
  ProgressBoard own_board_;
  ProgressBoard* board_ = &own_board_;
};

// A 64-bit hash of a buffer's bytes (FNV-1a's step over 8-byte words, then the tail bytes),
// for checking that ranks hold the same bits: gather one hash per rank instead of the data.
uint64_t hash_bytes(const void* data, size_t bytes);

// Typed helpers over the byte-level collectives.
template <typename T>
void broadcast_values(Comm& comm, std::vector<T>& values, int root) {
  comm.broadcast(values.data(), values.size() * sizeof(T), root);
}
template <typename T>
std::vector<T> allgather_value(Comm& comm, const T& value) {
  std::vector<T> all(static_cast<size_t>(comm.size()));
  comm.allgather(&value, all.data(), sizeof(T));
  return all;
}

}  // namespace ringtrain
