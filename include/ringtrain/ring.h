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
  // Elements per pipelined segment: each chunk moves as segments, so that sending segment k+1,
  // receiving segment k+2 and adding segment k overlap. 0 chooses a default.
  size_t segment_elements = 0;
};

// Reusable scratch for the ring: one chunk plus nothing else, allocated on first use and
// kept, so repeated allreduces of the same size never allocate.
class RingScratch {
 public:
  float* get(size_t elements);
  size_t capacity() const { return buffer_.size(); }

 private:
  std::vector<float> buffer_;
};

// After it, rank r's buffer holds the full sum of chunk (r + 1) % N in place (other chunks
// hold partial sums).
void ring_reduce_scatter(Comm& comm, float* data, size_t count, RingScratch& scratch,
                         const RingOptions& options = {});
// Given rank r owning chunk (r + 1) % N, gives every rank every chunk (copied, bit for bit).
void ring_allgather(Comm& comm, float* data, size_t count, const RingOptions& options = {});
// Sum or average over all ranks, in place; every rank ends with the same bits.
void ring_allreduce(Comm& comm, float* data, size_t count, ReduceOp op, RingScratch& scratch,
                    const RingOptions& options = {});

}  // namespace ringtrain
