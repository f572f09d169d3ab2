// The ring allreduce: scatter-reduce, then allgather, each rank talking only to its neighbours.
//
//        +--------> rank 1 ---------+          N ranks in a ring. Rank r sends to
//        |                          |          right = (r + 1) % N and receives from
//     rank 0                     rank 2        left = (r - 1 + N) % N, always.
//        |                          |
//        +--------- rank 3 <--------+
//
// The buffer of `count` elements is cut into N chunks as equal as possible: chunk c has
// count / N elements, plus one for the first count % N chunks (so chunks may be empty when
// count < N, and no rank handles more than one element beyond its share).
//
// Scatter-reduce, steps s = 0 .. N-2: rank r sends chunk (r - s) mod N and receives chunk
// (r - s - 1) mod N, adding what it receives into its own copy. A chunk starts at its owner
// c, gathers one more rank's contribution per step, and after N-1 steps rank r holds the
// full sum of chunk (r + 1) mod N. (For an average, that rank divides its chunk by N now,
// once, so every rank later receives the same bits.)
//
// Allgather, steps s = 0 .. N-2: rank r sends chunk (r + 1 - s) mod N and receives chunk
// (r - s) mod N, overwriting its copy. Every finished chunk travels the ring once; every rank
// ends with the same bits, because each element's sum was computed on exactly one rank and
// then only copied.
//
// Why it is bandwidth-optimal: in each of the 2(N-1) steps a rank sends and receives one
// chunk, count / N elements, so it moves 2 (N-1) / N * count elements in all. That is below
// 2 * count for any N, the same for 2 ranks or 2,000, and no rank (no parameter server) is a
// hot spot: every link carries the same load.
//
// Pipelining: a chunk moves as segments, with up to `window` segments in flight each way.
// While segment k is being added, segments k+1 .. k+window-1 are on the wire. Received
// segments land in a small ring of slots (window x segment) that stays in cache for the add,
// so the reduction reads the incoming data from cache, not memory. The allgather receives
// straight into place.
#include "ringtrain/ring.h"

#include <algorithm>

#include "ringtrain/check.h"

namespace ringtrain {

ChunkRange ring_chunk(size_t count, int ranks, int chunk) {
  RINGTRAIN_CHECK(ranks >= 1 && chunk >= 0 && chunk < ranks, "chunk {} of a {}-rank ring", chunk,
                  ranks);
  const auto n = static_cast<size_t>(ranks), c = static_cast<size_t>(chunk);
  const size_t base = count / n, extra = count % n;
  return {c * base + std::min(c, extra), base + (c < extra ? 1 : 0)};
}

float* RingScratch::slots(size_t elements) {
  if (buffer_.size() < elements) buffer_.resize(elements);
  return buffer_.data();
}

std::vector<CommRequest>& RingScratch::sends(size_t n) {
  if (sends_.size() < n) sends_.resize(n);
  return sends_;
}

std::vector<CommRequest>& RingScratch::recvs(size_t n) {
  if (recvs_.size() < n) recvs_.resize(n);
  return recvs_;
}

namespace detail {

void check_ring_options(const RingOptions& options) {
  RINGTRAIN_CHECK(options.segment_elements > 0 && options.window > 0,
                  "ring segments of {} elements with a window of {}: both must be positive",
                  options.segment_elements, options.window);
}

}  // namespace detail

void ring_reduce_scatter(Comm& comm, float* data, size_t count, RingScratch& scratch,
                         const RingOptions& options) {
  detail::ring_reduce_scatter(comm, data, count, scratch, options);
}

void ring_allgather(Comm& comm, float* data, size_t count, RingScratch& scratch,
                    const RingOptions& options) {
  detail::ring_allgather(comm, data, count, scratch, options);
}

void ring_allreduce(Comm& comm, float* data, size_t count, ReduceOp op, RingScratch& scratch,
                    const RingOptions& options) {
  detail::ring_allreduce(comm, data, count, op, scratch, options);
}

}  // namespace ringtrain
