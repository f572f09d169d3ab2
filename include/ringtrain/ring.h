// The ring allreduce, written once over Comm (see src/ring.cpp for the algorithm and its
// schedule). Where the receive slots live is behind RingSlots, so that the device ring over
// NCCL (nccl_comm.h: DeviceRingScratch, slots in GPU memory) runs this same code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ringtrain/comm.h"
#include "ringtrain/wire.h"

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
// Throws unless both are positive.
void check_ring_options(const RingOptions& options);

// Where the ring keeps the receive slots of the segments in flight (window x segment, at most
// one chunk) and the request handles: host memory (RingScratch) or device memory
// (DeviceRingScratch). Each call returns storage of at least the size asked for, in the
// memory the Comm's transfers use.
class RingSlots {
 public:
  virtual ~RingSlots() = default;
  virtual float* slots(size_t elements) = 0;
  virtual std::vector<CommRequest>& sends(size_t n) = 0;
  virtual std::vector<CommRequest>& recvs(size_t n) = 0;
};

// Host slots, grown on first use and kept, so that repeated allreduces of the same size never
// allocate.
class RingScratch final : public RingSlots {
 public:
  float* slots(size_t elements) override;
  std::vector<CommRequest>& sends(size_t n) override;
  std::vector<CommRequest>& recvs(size_t n) override;
  size_t capacity() const { return buffer_.size(); }
  // The slots of ring_allreduce_exact: integers, in storage of their own.
  int64_t* integer_slots(size_t elements);
  // The slots of ring_allreduce_wire: 16-bit values, send and receive, in storage of their own.
  uint16_t* wire_slots(size_t elements);

 private:
  std::vector<float> buffer_;
  std::vector<int64_t> integers_;
  std::vector<uint16_t> wire_;
  std::vector<CommRequest> sends_, recvs_;
};

// Grows `slots` to what ring_allreduce of `count` elements over `ranks` asks for (the largest
// chunk, capped at window x segment, and the handles), so that no call of that size grows it.
void reserve_ring(RingSlots& slots, size_t count, int ranks, const RingOptions& options = {});
// The same for ring_allreduce_wire of `count` floats.
void reserve_ring_wire(RingScratch& slots, size_t count, int ranks,
                       const RingOptions& options = {});
// The elements rank `rank` sends in one ring allreduce of `count` elements over `ranks`: one
// chunk per step, 2 (N - 1) steps, so 2 (N - 1) / N * count give or take an element per step.
size_t ring_elements_sent(size_t count, int ranks, int rank);

// After it, rank r's buffer holds the full sum of chunk (r + 1) % N in place (other chunks
// hold partial sums).
void ring_reduce_scatter(Comm& comm, float* data, size_t count, RingSlots& slots,
                         const RingOptions& options = {});
// Given rank r owning chunk (r + 1) % N, gives every rank every chunk (copied, bit for bit).
void ring_allgather(Comm& comm, float* data, size_t count, RingSlots& slots,
                    const RingOptions& options = {});
// Sum or average over all ranks, in place; every rank ends with the same bits.
void ring_allreduce(Comm& comm, float* data, size_t count, ReduceOp op, RingSlots& slots,
                    const RingOptions& options = {});

// What ring_allreduce_exact asks of the exact sum it moves (exact_sum.h): this rank's
// fixed-point terms of a range, and the float result of a range's finished integer sums.
// Offsets count from the start of the ring's buffer.
class ExactTerms {
 public:
  virtual ~ExactTerms() = default;
  // out[i] = this rank's integer term of element first + i, plus received[i] when given.
  virtual void terms(size_t first, size_t n, const int64_t* received, int64_t* out) = 0;
  // result[first + i] = the float of the finished sum: this rank's term of element first + i
  // plus received[i] (none on one rank). A range's terms are read before its results are
  // written, so `result` may be where the terms are computed from.
  virtual void finish(size_t first, size_t n, const int64_t* received, float* result) = 0;
};

// The exact sum's ring: the integer sum of every rank's terms, converted to floats. Integer
// addition is associative, so the sums are exact whatever the rank count and the ring's order.
// The scatter-reduce computes the terms as it sends (the first step) and as
// it receives, adding the received integers into them, so that this rank's integer sums are
// never written out whole; the owner of a finished chunk converts it (finish), and the
// allgather moves the floats: 4 bytes an element instead of 8, and the conversion done once
// per element in the job instead of once per rank. `partial`: `count` integers for the sums
// in passage (read only beyond 2 ranks); `result`: `count` floats, which every rank ends with
// bit for bit. Host transports and host slots. Returns the bytes this rank sent.
size_t ring_allreduce_exact(Comm& comm, size_t count, ExactTerms& terms, int64_t* partial,
                            float* result, RingScratch& slots, const RingOptions& options = {});
// Grows `slots` to what ring_allreduce_exact of `count` elements over `ranks` asks for.
void reserve_ring_exact(RingScratch& slots, size_t count, int ranks,
                        const RingOptions& options = {});

// The ring over a 16-bit wire (wire.h: `wire` is kBf16 or kFp16, `exponents` its scales, which
// must fit): float32 data, float32 partial sums. Each scatter-reduce hop sends the sender's
// float32 partial sum rounded once to 16 bits (at 2^exponents.reduce) and the receiver adds it
// into its float32 copy; the owner of a finished chunk divides it (kAvg) in float32 and rounds
// it to 16 bits (at 2^exponents.gather); the allgather moves those 16-bit values, and every
// rank, the owner included, holds exactly their float32 value: the same bits everywhere. Host
// transports and host slots only (the conversions are host loops). A segment is
// options.segment_elements values, half a float segment's bytes. Returns the bytes this rank
// sent (ring_elements_sent x 2, plus one 2-byte pad per odd-length segment).
size_t ring_allreduce_wire(Comm& comm, float* data, size_t count, ReduceOp op, GradWire wire,
                           const WireExponents& exponents, RingScratch& slots,
                           const RingOptions& options = {});

}  // namespace ringtrain
