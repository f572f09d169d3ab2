// The ranks' clock offsets, NTP-style (see clock_sync.h).
#include "ringtrain/clock_sync.h"

#include <array>
#include <chrono>
#include <limits>

#include "ringtrain/check.h"
#include "ringtrain/comm.h"

namespace ringtrain {

namespace {

// Tags inside the ring's segment tags (0..32767) on the same communicator: safe because the
// clocks are measured only before the first step and after the last, when no allreduce is in
// flight (the GradSync's communication thread is idle), and every rank measures at the same
// point of the job.
constexpr int kPingTag = 30011;
constexpr int kReplyTag = 30012;

// A timestamp travels as floats (the transport's only type): three 22-bit pieces (all 64 bits),
// each exact in a float's 24-bit significand, so no bits are lost whatever the transport does with
// them.
using WireTime = std::array<float, 3>;
constexpr int64_t kPieceBits = 22;
constexpr int64_t kPieceMask = (int64_t{1} << kPieceBits) - 1;

WireTime to_wire(int64_t ns) {
  const auto bits = static_cast<uint64_t>(ns);
  WireTime wire{};
  for (size_t i = 0; i < wire.size(); ++i)
    wire[i] = static_cast<float>((bits >> (kPieceBits * static_cast<int64_t>(i))) & kPieceMask);
  return wire;
}

int64_t from_wire(const WireTime& wire) {
  uint64_t bits = 0;
  for (size_t i = 0; i < wire.size(); ++i)
    bits |= static_cast<uint64_t>(wire[i]) << (kPieceBits * static_cast<int64_t>(i));
  return static_cast<int64_t>(bits);
}

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

std::vector<ClockOffset> measure_clock_offsets(Comm& comm, int rounds, const ClockFn& now) {
  RINGTRAIN_CHECK(rounds >= 1, "clock alignment needs at least one round, got {}", rounds);
  const auto clock = [&now] { return now ? now() : steady_ns(); };
  const int rank = comm.rank();
  if (rank != 0) {
    // Answer each ping with this clock's reading at its arrival.
    for (int round = 0; round < rounds; ++round) {
      float ping = 0.0f;
      CommRequest receive = comm.irecv(&ping, 1, 0, kPingTag);
      comm.wait(receive);
      const WireTime arrived = to_wire(clock());
      CommRequest reply = comm.isend(arrived.data(), arrived.size(), 0, kReplyTag);
      comm.wait(reply);
    }
    return {};
  }
  std::vector<ClockOffset> offsets(static_cast<size_t>(comm.size()));
  for (int peer = 1; peer < comm.size(); ++peer) {
    ClockOffset best{0, std::numeric_limits<int64_t>::max()};
    for (int round = 0; round < rounds; ++round) {
      const float ping = static_cast<float>(round);
      WireTime reply{};
      // The reply's receive is posted first, so that it never waits on this rank.
      CommRequest receive = comm.irecv(reply.data(), reply.size(), peer, kReplyTag);
      const int64_t sent = clock();
      CommRequest send = comm.isend(&ping, 1, peer, kPingTag);
      comm.wait(send);
      comm.wait(receive);
      const int64_t returned = clock();
      const int64_t round_trip = returned - sent;
      if (round_trip < best.round_trip_ns) {
        // sent + round_trip / 2 is the midpoint, computed without overflowing the sum.
        best = {from_wire(reply) - (sent + round_trip / 2), round_trip, sent + round_trip / 2};
      }
    }
    offsets[static_cast<size_t>(peer)] = best;
  }
  return offsets;
}

}  // namespace ringtrain
