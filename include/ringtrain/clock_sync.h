// How far each rank's steady clock is from rank 0's, measured NTP-style over the transport
// (steady_clock has an arbitrary epoch per host, so the ranks of a multi-host job under
// scripts/ringrun disagree by hours; on one host they agree).
//
// Rank 0 pings rank r `rounds` times: t0 (rank 0 sends), t1 (rank r's clock when the ping
// arrived; sent back), t2 (rank 0 gets the reply). If rank r's clock is rank 0's plus offset,
// then t0 <= t1 - offset <= t2, so offset = t1 - (t0 + t2) / 2 is off by at most
// (t2 - t0) / 2, the round trip halved. The round with the shortest round trip is kept: its
// bound is the tightest. No timing assumption beyond causality is made, so the bound holds on
// any machine, however loaded.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace ringtrain {

class Comm;

struct ClockOffset {
  int64_t offset_ns = 0;      // this rank's clock minus rank 0's
  int64_t round_trip_ns = 0;  // of the kept round: |error| <= round_trip_ns / 2
  int64_t at_ns = 0;          // when it was measured, on rank 0's clock
};

// This rank's clock, in nanoseconds (steady_clock by default; tests inject offsets).
using ClockFn = std::function<int64_t()>;

// Ping-pongs per rank of the trainer's measurements (before and after training): the shortest
// round trip's offset is kept.
inline constexpr int kClockSyncRounds = 8;

// Collective. Rank 0 gets every rank's offset (entry 0 is {0, 0}); the others get an empty
// vector. rounds >= 1.
std::vector<ClockOffset> measure_clock_offsets(Comm& comm, int rounds, const ClockFn& now = {});

}  // namespace ringtrain
