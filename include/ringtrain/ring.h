// The ring allreduce, written once over Comm (see src/ring.cpp for the algorithm). The schedule
// itself is a template over where the receive slots live (detail:: below), so that the device
// ring over NCCL (nccl_comm.h) runs this same code with slots in GPU memory.
#pragma once

#include <algorithm>
#include <cstddef>
#include <vector>

#include "ringtrain/comm.h"

namespace ringtrain {

// Chunk c of a buffer of `count` elements split over `ranks`: the first count % ranks chunks
// hold one element more. Chunks may be empty (count < ranks).
struct ChunkRange {
  size_t begin = 0;
  size_t size = 0;
};
ChunkRange ring_chunk(size_t count, int ranks, int chunk);

struct RingOptions {
  // Each chunk moves as segments of this many elements, with up to `window` segments in
  // flight each way, so that sends, receives and the reduction of earlier segments overlap.
  size_t segment_elements = 256 * 1024;  // 1 MiB of float32: measured best on np=2 here
  int window = 4;
};

// Reusable state of the ring: the receive slots of the segments in flight (window x segment,
// at most one chunk) and the request handles. Grown on first use and kept, so repeated
// allreduces of the same size never allocate.
class RingScratch {
 public:
  float* slots(size_t elements);
  std::vector<CommRequest>& sends(size_t n);
  std::vector<CommRequest>& recvs(size_t n);
  size_t capacity() const { return buffer_.size(); }

 private:
  std::vector<float> buffer_;
  std::vector<CommRequest> sends_, recvs_;
};

// After it, rank r's buffer holds the full sum of chunk (r + 1) % N in place (other chunks
// hold partial sums).
void ring_reduce_scatter(Comm& comm, float* data, size_t count, RingScratch& scratch,
                         const RingOptions& options = {});
// Given rank r owning chunk (r + 1) % N, gives every rank every chunk (copied, bit for bit).
void ring_allgather(Comm& comm, float* data, size_t count, RingScratch& scratch,
                    const RingOptions& options = {});
// Sum or average over all ranks, in place; every rank ends with the same bits.
void ring_allreduce(Comm& comm, float* data, size_t count, ReduceOp op, RingScratch& scratch,
                    const RingOptions& options = {});

namespace detail {

// Throws unless both are positive.
void check_ring_options(const RingOptions& options);

inline int ring_mod(int value, int n) {
  return ((value % n) + n) % n;
}

// MPI guarantees only tags up to 32767; messages between one pair with one tag still match in
// order, so wrapping is safe.
inline int segment_tag(size_t segment) {
  return static_cast<int>(segment % 32768);
}

// One ring step: send `send_n` elements from `send` to the right neighbour while receiving
// `recv_n` elements from the left one. With `reduce`, received segments go through the slots
// and are added into `recv`; without, they are received straight into `recv`. Scratch gives
// slots(n) (float*), sends(n) and recvs(n) (std::vector<CommRequest>&). This exact order of
// calls is what the NCCL transport's grouping relies on (nccl_comm.h).
template <typename Scratch>
void ring_step(Comm& comm, const float* send, size_t send_n, float* recv, size_t recv_n,
               bool reduce, Scratch& scratch, const RingOptions& options) {
  const int right = (comm.rank() + 1) % comm.size();
  const int left = (comm.rank() - 1 + comm.size()) % comm.size();
  const size_t segment = options.segment_elements;
  const auto window = static_cast<size_t>(options.window);
  const size_t send_segments = (send_n + segment - 1) / segment;
  const size_t recv_segments = (recv_n + segment - 1) / segment;
  float* slots = reduce ? scratch.slots(std::min(window * segment, recv_n)) : nullptr;
  auto& sends = scratch.sends(window);
  auto& recvs = scratch.recvs(window);

  const auto length = [segment](size_t total, size_t k) {
    return std::min(segment, total - k * segment);
  };
  const auto post_recv = [&](size_t k) {
    float* target = reduce ? slots + (k % window) * segment : recv + k * segment;
    recvs[k % window] = comm.irecv(target, length(recv_n, k), left, segment_tag(k));
  };
  const auto post_send = [&](size_t k) {
    sends[k % window] = comm.isend(send + k * segment, length(send_n, k), right, segment_tag(k));
  };

  for (size_t k = 0; k < std::min(window, recv_segments); ++k) post_recv(k);
  for (size_t k = 0; k < std::min(window, send_segments); ++k) post_send(k);
  for (size_t k = 0; k < std::max(send_segments, recv_segments); ++k) {
    if (k < recv_segments) {
      comm.wait(recvs[k % window]);
      if (reduce)
        comm.add_inplace(recv + k * segment, slots + (k % window) * segment, length(recv_n, k));
      if (k + window < recv_segments) post_recv(k + window);
    }
    if (k < send_segments) {
      comm.wait(sends[k % window]);
      if (k + window < send_segments) post_send(k + window);
    }
  }
}

template <typename Scratch>
void ring_reduce_scatter(Comm& comm, float* data, size_t count, Scratch& scratch,
                         const RingOptions& options) {
  check_ring_options(options);
  const int n = comm.size(), r = comm.rank();
  for (int step = 0; step + 1 < n; ++step) {
    const ChunkRange out = ring_chunk(count, n, ring_mod(r - step, n));
    const ChunkRange in = ring_chunk(count, n, ring_mod(r - step - 1, n));
    ring_step(comm, data + out.begin, out.size, data + in.begin, in.size, /*reduce=*/true, scratch,
              options);
  }
}

template <typename Scratch>
void ring_allgather(Comm& comm, float* data, size_t count, Scratch& scratch,
                    const RingOptions& options) {
  check_ring_options(options);
  const int n = comm.size(), r = comm.rank();
  for (int step = 0; step + 1 < n; ++step) {
    const ChunkRange out = ring_chunk(count, n, ring_mod(r + 1 - step, n));
    const ChunkRange in = ring_chunk(count, n, ring_mod(r - step, n));
    ring_step(comm, data + out.begin, out.size, data + in.begin, in.size, /*reduce=*/false, scratch,
              options);
  }
}

template <typename Scratch>
void ring_allreduce(Comm& comm, float* data, size_t count, ReduceOp op, Scratch& scratch,
                    const RingOptions& options) {
  const int n = comm.size();
  ring_reduce_scatter(comm, data, count, scratch, options);
  if (op == ReduceOp::kAvg && n > 1) {
    // Only the owner scales its finished chunk, so the allgather hands out identical bits.
    // divide_inplace is a host loop for host transports and a kernel for device ones.
    const ChunkRange owned = ring_chunk(count, n, (comm.rank() + 1) % n);
    comm.divide_inplace(data + owned.begin, owned.size, static_cast<float>(n));
  }
  ring_allgather(comm, data, count, scratch, options);
}

}  // namespace detail

}  // namespace ringtrain
