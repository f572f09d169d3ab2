// The ring allreduce, written once over Comm (see src/ring.cpp for the algorithm).
#pragma once

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

}  // namespace ringtrain
