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

int64_t* RingScratch::integer_slots(size_t elements) {
  if (integers_.size() < elements) integers_.resize(elements);
  return integers_.data();
}

std::vector<CommRequest>& RingScratch::sends(size_t n) {
  if (sends_.size() < n) sends_.resize(n);
  return sends_;
}

std::vector<CommRequest>& RingScratch::recvs(size_t n) {
  if (recvs_.size() < n) recvs_.resize(n);
  return recvs_;
}

void check_ring_options(const RingOptions& options) {
  RINGTRAIN_CHECK(options.segment_elements > 0 && options.window > 0,
                  "ring segments of {} elements with a window of {}: both must be positive",
                  options.segment_elements, options.window);
}

namespace {
// The slots' elements one ring of `count` elements asks for: the largest chunk, capped at
// window x segment. Grows the handles too.
size_t reserve_handles(RingSlots& slots, size_t count, int ranks, const RingOptions& options) {
  RINGTRAIN_CHECK(ranks >= 1, "a ring of {} ranks", ranks);
  check_ring_options(options);
  const size_t window = static_cast<size_t>(options.window);
  slots.sends(window);
  slots.recvs(window);
  return std::min(ring_chunk(count, ranks, 0).size, window * options.segment_elements);
}
}  // namespace

void reserve_ring(RingSlots& slots, size_t count, int ranks, const RingOptions& options) {
  slots.slots(reserve_handles(slots, count, ranks, options));
}

void reserve_ring_sum(RingScratch& slots, size_t count, int ranks, const RingOptions& options) {
  slots.integer_slots(reserve_handles(slots, count, ranks, options));
}

namespace {

int ring_mod(int value, int n) {
  return ((value % n) + n) % n;
}

// MPI guarantees only tags up to 32767; messages between one pair with one tag still match in
// order, so wrapping is safe.
int segment_tag(size_t segment) {
  return static_cast<int>(segment % 32768);
}

// The element types the ring moves: float (the averages) and int64_t (the exact sums of
// exact_sum.h). Both travel as floats: the transports move bits, and an int64 is two of them.
template <class T>
constexpr size_t kFloatsPer = sizeof(T) / sizeof(float);
static_assert(kFloatsPer<int64_t> * sizeof(float) == sizeof(int64_t));

// The receive slots for elements of type T: the transport's slots for floats (host or device
// memory), the host scratch's integer storage for the exact sums.
float* slots_of(RingSlots& scratch, size_t elements, const float*) {
  return scratch.slots(elements);
}
int64_t* slots_of(RingSlots& scratch, size_t elements, const int64_t*) {
  // Only ring_allreduce_sum moves integers, and it takes a RingScratch.
  return static_cast<RingScratch&>(scratch).integer_slots(elements);
}

// Adds a received segment into the buffer: the transport's add for floats (a kernel on a
// device transport), a host loop for integers (exact; only host transports carry them).
void add_segment(Comm& comm, float* dst, const float* src, size_t n) {
  comm.add_inplace(dst, src, n);
}
void add_segment(Comm&, int64_t* dst, const int64_t* src, size_t n) {
  int64_t* __restrict out = dst;
  const int64_t* __restrict in = src;
  for (size_t i = 0; i < n; ++i) out[i] += in[i];
}

// One ring step: send `send_n` elements from `send` to the right neighbour while receiving
// `recv_n` elements from the left one. With `reduce`, received segments go through the slots
// and are added into `recv`; without, they are received straight into `recv`. This exact
// order of calls is what the NCCL transport's grouping relies on (nccl_comm.h).
template <class T>
void ring_step(Comm& comm, const T* send, size_t send_n, T* recv, size_t recv_n, bool reduce,
               RingSlots& scratch, const RingOptions& options) {
  const int right = (comm.rank() + 1) % comm.size();
  const int left = (comm.rank() - 1 + comm.size()) % comm.size();
  const size_t segment = options.segment_elements;
  const auto window = static_cast<size_t>(options.window);
  const size_t send_segments = (send_n + segment - 1) / segment;
  const size_t recv_segments = (recv_n + segment - 1) / segment;
  T* slots = reduce ? slots_of(scratch, std::min(window * segment, recv_n), recv) : nullptr;
  std::vector<CommRequest>& sends = scratch.sends(window);
  std::vector<CommRequest>& recvs = scratch.recvs(window);
  const auto length = [segment](size_t total, size_t k) {
    return std::min(segment, total - k * segment);
  };
  const auto post_recv = [&](size_t k) {
    T* target = reduce ? slots + (k % window) * segment : recv + k * segment;
    recvs[k % window] = comm.irecv(reinterpret_cast<float*>(target),
                                   length(recv_n, k) * kFloatsPer<T>, left, segment_tag(k));
  };
  const auto post_send = [&](size_t k) {
    sends[k % window] = comm.isend(reinterpret_cast<const float*>(send + k * segment),
                                   length(send_n, k) * kFloatsPer<T>, right, segment_tag(k));
  };
  for (size_t k = 0; k < std::min(window, recv_segments); ++k) post_recv(k);
  for (size_t k = 0; k < std::min(window, send_segments); ++k) post_send(k);
  for (size_t k = 0; k < std::max(send_segments, recv_segments); ++k) {
    if (k < recv_segments) {
      comm.wait(recvs[k % window]);
      if (reduce)
        add_segment(comm, recv + k * segment, slots + (k % window) * segment, length(recv_n, k));
      if (k + window < recv_segments) post_recv(k + window);
    }
    if (k < send_segments) {
      comm.wait(sends[k % window]);
      if (k + window < send_segments) post_send(k + window);
    }
  }
}

template <class T>
void reduce_scatter(Comm& comm, T* data, size_t count, RingSlots& slots,
                    const RingOptions& options) {
  check_ring_options(options);
  const int n = comm.size(), r = comm.rank();
  for (int step = 0; step + 1 < n; ++step) {
    const ChunkRange out = ring_chunk(count, n, ring_mod(r - step, n));
    const ChunkRange in = ring_chunk(count, n, ring_mod(r - step - 1, n));
    ring_step(comm, data + out.begin, out.size, data + in.begin, in.size, /*reduce=*/true, slots,
              options);
  }
}

template <class T>
void allgather(Comm& comm, T* data, size_t count, RingSlots& slots, const RingOptions& options) {
  check_ring_options(options);
  const int n = comm.size(), r = comm.rank();
  for (int step = 0; step + 1 < n; ++step) {
    const ChunkRange out = ring_chunk(count, n, ring_mod(r + 1 - step, n));
    const ChunkRange in = ring_chunk(count, n, ring_mod(r - step, n));
    ring_step(comm, data + out.begin, out.size, data + in.begin, in.size, /*reduce=*/false, slots,
              options);
  }
}

}  // namespace

void ring_reduce_scatter(Comm& comm, float* data, size_t count, RingSlots& slots,
                         const RingOptions& options) {
  reduce_scatter(comm, data, count, slots, options);
}

void ring_allgather(Comm& comm, float* data, size_t count, RingSlots& slots,
                    const RingOptions& options) {
  allgather(comm, data, count, slots, options);
}

void ring_allreduce(Comm& comm, float* data, size_t count, ReduceOp op, RingSlots& slots,
                    const RingOptions& options) {
  const int n = comm.size();
  ring_reduce_scatter(comm, data, count, slots, options);
  if (op == ReduceOp::kAvg && n > 1) {
    // Only the owner scales its finished chunk, so the allgather hands out identical bits.
    // divide_inplace is a host loop for host transports and a kernel for device ones.
    const ChunkRange owned = ring_chunk(count, n, (comm.rank() + 1) % n);
    comm.divide_inplace(data + owned.begin, owned.size, static_cast<float>(n));
  }
  ring_allgather(comm, data, count, slots, options);
}

void ring_allreduce_sum(Comm& comm, int64_t* data, size_t count, RingScratch& slots,
                        const RingOptions& options) {
  reduce_scatter(comm, data, count, slots, options);
  allgather(comm, data, count, slots, options);
}

}  // namespace ringtrain
