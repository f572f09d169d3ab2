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
//
// What travels is a codec's choice (DirectWire, SixteenBitWire, ExactWire below): the buffer's
// own elements; for --grad-wire, each float32 partial sum rounded to 16 bits as it is sent and
// added back into float32 as it lands (ring_allreduce_wire; docs/ring.md); for --reproducible,
// int64 fixed-point terms in the scatter-reduce, 2 floats each, so a segment of
// segment_elements integers is twice a float segment's bytes (ring_allreduce_exact).
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

uint16_t* RingScratch::wire_slots(size_t elements) {
  if (wire_.size() < elements) wire_.resize(elements);
  return wire_.data();
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
int ring_mod(int value, int n) {
  return ((value % n) + n) % n;
}
}  // namespace

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

size_t ring_elements_sent(size_t count, int ranks, int rank) {
  RINGTRAIN_CHECK(ranks >= 1 && rank >= 0 && rank < ranks, "rank {} of a {}-rank ring", rank,
                  ranks);
  // Scatter-reduce step s sends chunk (r - s) mod N, allgather step s chunk (r + 1 - s) mod N.
  size_t sent = 0;
  for (int step = 0; step + 1 < ranks; ++step) {
    sent += ring_chunk(count, ranks, ring_mod(rank - step, ranks)).size;
    sent += ring_chunk(count, ranks, ring_mod(rank + 1 - step, ranks)).size;
  }
  return sent;
}

namespace {

// MPI guarantees only tags up to 32767; messages between one pair with one tag still match in
// order, so wrapping is safe.
int segment_tag(size_t segment) {
  return static_cast<int>(segment % 32768);
}

// The exact sums of exact_sum.h travel as floats too: the transports move bits, and an int64
// is two floats.
constexpr size_t kFloatsPerInteger = sizeof(int64_t) / sizeof(float);
static_assert(kFloatsPerInteger * sizeof(float) == sizeof(int64_t));

// How ring_step moves a buffer's elements as the transport's floats: where the floats of send
// segment [first, first + n) come from, where a received segment lands, and what is done once
// it has landed. `slot` is k % window for segment k: a send slot is free again once the send
// of segment k - window completed, a receive slot once segment k - window was handled.
//
// DirectWire: the floats travel as themselves; sends read the buffer, the scatter-reduce
// receives into the slots and adds (the transport's add: a kernel on a device transport), the
// allgather receives straight into place.
class DirectWire {
 public:
  DirectWire(Comm& comm, float* data, RingSlots& scratch, const RingOptions& options)
      : comm_(comm),
        data_(data),
        scratch_(scratch),
        segment_(options.segment_elements),
        window_(static_cast<size_t>(options.window)) {}
  void begin_step(size_t recv_n, bool reduce) {
    slots_ = reduce ? scratch_.slots(std::min(window_ * segment_, recv_n)) : nullptr;
  }
  const float* send(size_t first, size_t, size_t, bool) { return data_ + first; }
  static size_t floats(size_t n) { return n; }
  float* landing(size_t first, size_t slot, bool reduce) {
    return reduce ? slots_ + slot * segment_ : data_ + first;
  }
  void landed(size_t first, size_t n, size_t slot, bool reduce) {
    if (reduce) comm_.add_inplace(data_ + first, slots_ + slot * segment_, n);
  }

 private:
  Comm& comm_;
  float* data_;
  RingSlots& scratch_;
  size_t segment_, window_;
  float* slots_ = nullptr;
};

// SixteenBitWire: float32 buffer, 16-bit wire (wire.h). A send encodes the segment of the
// buffer (its float32 partial sum, or the finished chunk) into a send slot, at 2^reduce in
// the scatter-reduce and 2^gather in the allgather; every receive lands in a receive slot and
// is added into the buffer (scatter-reduce) or decoded over it (allgather). The transport
// moves floats: a segment of n 16-bit values travels as ceil(n / 2) floats, the odd one's pad
// a zero. Slots are `stride` (the segment, rounded up to even) 16-bit values apart.
class SixteenBitWire {
 public:
  SixteenBitWire(GradWire wire, const WireExponents& exponents, float* data, uint16_t* slots,
                 size_t stride, size_t window)
      : wire_(wire),
        exponents_(exponents),
        data_(data),
        send_slots_(slots),
        recv_slots_(slots + window * stride),
        stride_(stride) {}
  void begin_step(size_t, bool) {}
  const float* send(size_t first, size_t n, size_t slot, bool reduce) {
    uint16_t* out = send_slots_ + slot * stride_;
    encode_wire(wire_, data_ + first, n, reduce ? exponents_.reduce : exponents_.gather, out);
    if (n % 2 != 0) out[n] = 0;
    bytes_sent_ += floats(n) * sizeof(float);
    return reinterpret_cast<const float*>(out);
  }
  static size_t floats(size_t n) { return (n + 1) / 2; }
  float* landing(size_t, size_t slot, bool) {
    return reinterpret_cast<float*>(recv_slots_ + slot * stride_);
  }
  void landed(size_t first, size_t n, size_t slot, bool reduce) {
    const uint16_t* in = recv_slots_ + slot * stride_;
    if (reduce) {
      add_from_wire(wire_, in, n, exponents_.reduce, data_ + first);
    } else {
      decode_wire(wire_, in, n, exponents_.gather, data_ + first);
    }
  }
  size_t bytes_sent() const { return bytes_sent_; }

 private:
  GradWire wire_;
  WireExponents exponents_;
  float* data_;
  uint16_t* send_slots_;
  uint16_t* recv_slots_;
  size_t stride_;
  size_t bytes_sent_ = 0;
};

// ExactWire: the exact sum's scatter-reduce (ring_allreduce_exact). Its first step sends this
// rank's terms, computed into a send slot as each segment goes; later steps send the partial
// sums that earlier steps left in `partial`. A received segment lands in a receive slot and
// is added to this rank's terms into `partial`, or, on the last step, where the chunk is
// finished, converted into `result`. Slots are `stride` integers apart, receives first.
class ExactWire {
 public:
  ExactWire(ExactTerms& terms, int64_t* partial, float* result, int64_t* slots, size_t stride,
            size_t window)
      : terms_(terms),
        partial_(partial),
        result_(result),
        recv_slots_(slots),
        send_slots_(slots + window * stride),
        stride_(stride) {}
  // Which scatter-reduce step the next ring_step is, of `steps`.
  void set_step(int step, int steps) {
    first_step_ = step == 0;
    last_step_ = step + 1 == steps;
  }
  void begin_step(size_t, bool) {}
  const float* send(size_t first, size_t n, size_t slot, bool) {
    bytes_sent_ += n * sizeof(int64_t);
    if (!first_step_) return reinterpret_cast<const float*>(partial_ + first);
    int64_t* out = send_slots_ + slot * stride_;
    terms_.terms(first, n, nullptr, out);
    return reinterpret_cast<const float*>(out);
  }
  static size_t floats(size_t n) { return n * kFloatsPerInteger; }
  float* landing(size_t, size_t slot, bool) {
    return reinterpret_cast<float*>(recv_slots_ + slot * stride_);
  }
  void landed(size_t first, size_t n, size_t slot, bool) {
    const int64_t* in = recv_slots_ + slot * stride_;
    if (last_step_) {
      terms_.finish(first, n, in, result_);
    } else {
      terms_.terms(first, n, in, partial_ + first);
    }
  }
  size_t bytes_sent() const { return bytes_sent_; }

 private:
  ExactTerms& terms_;
  int64_t* partial_;
  float* result_;
  int64_t* recv_slots_;
  int64_t* send_slots_;
  size_t stride_;
  bool first_step_ = true, last_step_ = false;
  size_t bytes_sent_ = 0;
};

// The integer slots of ring_allreduce_exact: one segment (at most the largest chunk) apart.
size_t exact_slot_stride(size_t count, int ranks, const RingOptions& options) {
  return std::min(ring_chunk(count, ranks, 0).size, options.segment_elements);
}

// The 16-bit slots one ring of `count` elements asks for: window send and window receive
// slots of one segment (at most the largest chunk), rounded up to an even count.
size_t wire_slot_stride(size_t count, int ranks, const RingOptions& options) {
  const size_t segment = std::min(ring_chunk(count, ranks, 0).size, options.segment_elements);
  return segment + segment % 2;
}

// One ring step: send `send_n` elements from `send_first` to the right neighbour while
// receiving `recv_n` elements at `recv_first` from the left one; with `reduce`, received
// segments are added into the buffer, without, they replace it (through the codec). This
// exact order of calls is what the NCCL transport's grouping relies on (nccl_comm.h).
template <class Codec>
void ring_step(Comm& comm, Codec& codec, size_t send_first, size_t send_n, size_t recv_first,
               size_t recv_n, bool reduce, RingSlots& scratch, const RingOptions& options) {
  const int right = (comm.rank() + 1) % comm.size();
  const int left = (comm.rank() - 1 + comm.size()) % comm.size();
  const size_t segment = options.segment_elements;
  const auto window = static_cast<size_t>(options.window);
  const size_t send_segments = (send_n + segment - 1) / segment;
  const size_t recv_segments = (recv_n + segment - 1) / segment;
  codec.begin_step(recv_n, reduce);
  std::vector<CommRequest>& sends = scratch.sends(window);
  std::vector<CommRequest>& recvs = scratch.recvs(window);
  const auto length = [segment](size_t total, size_t k) {
    return std::min(segment, total - k * segment);
  };
  const auto post_recv = [&](size_t k) {
    const size_t n = length(recv_n, k);
    recvs[k % window] = comm.irecv(codec.landing(recv_first + k * segment, k % window, reduce),
                                   codec.floats(n), left, segment_tag(k));
  };
  const auto post_send = [&](size_t k) {
    const size_t n = length(send_n, k);
    sends[k % window] = comm.isend(codec.send(send_first + k * segment, n, k % window, reduce),
                                   codec.floats(n), right, segment_tag(k));
  };
  for (size_t k = 0; k < std::min(window, recv_segments); ++k) post_recv(k);
  for (size_t k = 0; k < std::min(window, send_segments); ++k) post_send(k);
  for (size_t k = 0; k < std::max(send_segments, recv_segments); ++k) {
    if (k < recv_segments) {
      comm.wait(recvs[k % window]);
      codec.landed(recv_first + k * segment, length(recv_n, k), k % window, reduce);
      if (k + window < recv_segments) post_recv(k + window);
    }
    if (k < send_segments) {
      comm.wait(sends[k % window]);
      if (k + window < send_segments) post_send(k + window);
    }
  }
}

template <class Codec>
void reduce_scatter_through(Comm& comm, Codec& codec, size_t count, RingSlots& slots,
                            const RingOptions& options) {
  check_ring_options(options);
  const int n = comm.size(), r = comm.rank();
  for (int step = 0; step + 1 < n; ++step) {
    const ChunkRange out = ring_chunk(count, n, ring_mod(r - step, n));
    const ChunkRange in = ring_chunk(count, n, ring_mod(r - step - 1, n));
    ring_step(comm, codec, out.begin, out.size, in.begin, in.size, /*reduce=*/true, slots, options);
  }
}

template <class Codec>
void allgather_through(Comm& comm, Codec& codec, size_t count, RingSlots& slots,
                       const RingOptions& options) {
  check_ring_options(options);
  const int n = comm.size(), r = comm.rank();
  for (int step = 0; step + 1 < n; ++step) {
    const ChunkRange out = ring_chunk(count, n, ring_mod(r + 1 - step, n));
    const ChunkRange in = ring_chunk(count, n, ring_mod(r - step, n));
    ring_step(comm, codec, out.begin, out.size, in.begin, in.size, /*reduce=*/false, slots,
              options);
  }
}

}  // namespace

void ring_reduce_scatter(Comm& comm, float* data, size_t count, RingSlots& slots,
                         const RingOptions& options) {
  DirectWire codec(comm, data, slots, options);
  reduce_scatter_through(comm, codec, count, slots, options);
}

void ring_allgather(Comm& comm, float* data, size_t count, RingSlots& slots,
                    const RingOptions& options) {
  DirectWire codec(comm, data, slots, options);
  allgather_through(comm, codec, count, slots, options);
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

void reserve_ring_exact(RingScratch& slots, size_t count, int ranks, const RingOptions& options) {
  reserve_handles(slots, count, ranks, options);
  slots.integer_slots(2 * static_cast<size_t>(options.window) *
                      exact_slot_stride(count, ranks, options));
}

size_t ring_allreduce_exact(Comm& comm, size_t count, ExactTerms& terms, int64_t* partial,
                            float* result, RingScratch& slots, const RingOptions& options) {
  check_ring_options(options);
  const int n = comm.size(), r = comm.rank();
  if (n == 1) {
    terms.finish(0, count, nullptr, result);
    return 0;
  }
  const size_t window = static_cast<size_t>(options.window);
  const size_t stride = exact_slot_stride(count, n, options);
  ExactWire codec(terms, partial, result, slots.integer_slots(2 * window * stride), stride, window);
  for (int step = 0; step + 1 < n; ++step) {  // reduce_scatter_through, telling the codec the step
    const ChunkRange out = ring_chunk(count, n, ring_mod(r - step, n));
    const ChunkRange in = ring_chunk(count, n, ring_mod(r - step - 1, n));
    codec.set_step(step, n - 1);
    ring_step(comm, codec, out.begin, out.size, in.begin, in.size, /*reduce=*/true, slots, options);
  }
  ring_allgather(comm, result, count, slots, options);
  size_t gathered = 0;
  for (int step = 0; step + 1 < n; ++step)
    gathered += ring_chunk(count, n, ring_mod(r + 1 - step, n)).size;
  return codec.bytes_sent() + gathered * sizeof(float);
}

void reserve_ring_wire(RingScratch& slots, size_t count, int ranks, const RingOptions& options) {
  reserve_handles(slots, count, ranks, options);
  slots.wire_slots(2 * static_cast<size_t>(options.window) *
                   wire_slot_stride(count, ranks, options));
}

size_t ring_allreduce_wire(Comm& comm, float* data, size_t count, ReduceOp op, GradWire wire,
                           const WireExponents& exponents, RingScratch& slots,
                           const RingOptions& options) {
  RINGTRAIN_CHECK(wire != GradWire::kFp32 && exponents.fits,
                  "ring_allreduce_wire moves 16-bit values that fit their scale ({} wire)",
                  to_string(wire));
  check_ring_options(options);
  const int n = comm.size();
  if (n == 1) return 0;  // nothing moves, nothing is rounded
  const size_t window = static_cast<size_t>(options.window);
  const size_t stride = wire_slot_stride(count, n, options);
  SixteenBitWire codec(wire, exponents, data, slots.wire_slots(2 * window * stride), stride,
                       window);
  reduce_scatter_through(comm, codec, count, slots, options);
  // The owner of a finished chunk averages it in float32 and rounds it to what the wire will
  // carry, so that it holds exactly the bits every other rank decodes.
  const ChunkRange owned = ring_chunk(count, n, (comm.rank() + 1) % n);
  if (op == ReduceOp::kAvg)
    comm.divide_inplace(data + owned.begin, owned.size, static_cast<float>(n));
  round_through_wire(wire, data + owned.begin, owned.size, exponents.gather);
  allgather_through(comm, codec, count, slots, options);
  return codec.bytes_sent();
}

}  // namespace ringtrain
