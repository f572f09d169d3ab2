// Tests for the transport layer: the thread transport (thread_comm.h) that the ring tests run
// on, checked against what MPI promises (FIFO per pair and tag, exact sizes, collectives with
// closed-form results, bit-identical on every rank), plus its failure modes: a rank that throws
// or a receive nobody sends to must end the test with an error, never hang it. Rank bodies
// record what they saw; Catch2 checks it afterwards on the main thread (Catch2 v2 is not
// thread-safe).
#include <atomic>
#include <chrono>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <catch2/catch.hpp>

#include "ringtrain/check.h"
#include "ringtrain/comm.h"
#include "support/thread_comm.h"

namespace {

using Catch::Matchers::Contains;
using ringtrain::Comm;
using ringtrain::CommRequest;
using ringtrain::ReduceOp;
using ringtrain::run_ranks;
using ringtrain::ThreadWorld;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

TEST_CASE("comm: reduce op names and add_inplace", "[comm]") {
  CHECK(ringtrain::parse_reduce_op("sum") == ReduceOp::kSum);
  CHECK(ringtrain::parse_reduce_op("avg") == ReduceOp::kAvg);
  CHECK(std::string(ringtrain::to_string(ReduceOp::kSum)) == "sum");
  CHECK(std::string(ringtrain::to_string(ReduceOp::kAvg)) == "avg");
  CHECK_THROWS_WITH(ringtrain::parse_reduce_op("mean"),
                    Contains("--op") && Contains("mean") && Contains("sum or avg"));

  // Odd lengths cover the vector loop's scalar tail.
  for (size_t n : {0, 1, 7, 33, 1001}) {
    std::vector<float> dst(n), src(n);
    for (size_t i = 0; i < n; ++i) {
      dst[i] = static_cast<float>(i);
      src[i] = static_cast<float>(2 * i + 1);
    }
    ringtrain::ThreadWorld world(1);
    ringtrain::ThreadComm comm(world, 0);
    comm.add_inplace(dst.data(), src.data(), n);
    for (size_t i = 0; i < n; ++i) REQUIRE(dst[i] == static_cast<float>(3 * i + 1));
  }
}

TEST_CASE("thread comm: point-to-point is FIFO per pair and tag", "[comm]") {
  // Rank 0 sends three messages on tag 0 and two on tag 1. Rank 1 takes them tag 1 first, then
  // tag 0; within a tag they must arrive in the order sent. Phase 1 posts the receives before
  // the sends exist, phase 2 after they are queued.
  std::vector<std::vector<float>> got;
  run_ranks(2, [&](Comm& comm) {
    const std::vector<std::vector<float>> sent = {{1}, {2, 2}, {3, 3, 3}, {10}, {20, 20}};
    const std::vector<int> tags = {0, 0, 0, 1, 1};
    const std::vector<size_t> receive_order = {3, 4, 0, 1, 2};
    for (int phase = 0; phase < 2; ++phase) {
      if (comm.rank() == 0) {
        std::vector<CommRequest> sends;
        if (phase == 1) comm.barrier();
        for (size_t m = 0; m < sent.size(); ++m)
          sends.push_back(comm.isend(sent[m].data(), sent[m].size(), 1, tags[m]));
        if (phase == 0) comm.barrier();
        for (auto& request : sends) comm.wait(request);
      } else {
        std::vector<std::vector<float>> into(sent.size());
        std::vector<CommRequest> receives;
        if (phase == 1) comm.barrier();
        for (size_t m : receive_order) {
          into[m].resize(sent[m].size());
          receives.push_back(comm.irecv(into[m].data(), into[m].size(), 0, tags[m]));
        }
        if (phase == 0) comm.barrier();
        for (auto& request : receives) comm.wait(request);
        got.insert(got.end(), into.begin(), into.end());
      }
    }
  });
  const std::vector<std::vector<float>> once = {{1}, {2, 2}, {3, 3, 3}, {10}, {20, 20}};
  REQUIRE(got.size() == 10);
  for (size_t m = 0; m < got.size(); ++m) CHECK(got[m] == once[m % once.size()]);
}

TEST_CASE("thread comm: sendrecv around a ring of 1..8 ranks", "[comm]") {
  for (int size = 1; size <= 8; ++size) {
    // Rank r sends r + 1 floats (uneven on purpose) to the right, three rounds, one tag each.
    std::vector<std::vector<float>> got(static_cast<size_t>(size));
    run_ranks(size, [&](Comm& comm) {
      const int r = comm.rank(), n = comm.size();
      const int right = (r + 1) % n, left = (r - 1 + n) % n;
      auto& mine = got[static_cast<size_t>(r)];
      for (int round = 0; round < 3; ++round) {
        std::vector<float> send(static_cast<size_t>(r + 1));
        for (size_t i = 0; i < send.size(); ++i)
          send[i] = static_cast<float>(1000 * round + 100 * r + static_cast<int>(i));
        std::vector<float> recv(static_cast<size_t>(left + 1));
        comm.sendrecv(send.data(), send.size(), right, recv.data(), recv.size(), left, round);
        mine.insert(mine.end(), recv.begin(), recv.end());
      }
    });
    for (int r = 0; r < size; ++r) {
      const int left = (r - 1 + size) % size;
      std::vector<float> expected;
      for (int round = 0; round < 3; ++round)
        for (int i = 0; i <= left; ++i)
          expected.push_back(static_cast<float>(1000 * round + 100 * left + i));
      INFO("size " << size << " rank " << r);
      CHECK(got[static_cast<size_t>(r)] == expected);
    }
  }
}

TEST_CASE("thread comm: broadcast from every root", "[comm]") {
  for (int size = 1; size <= 5; ++size) {
    for (int root = 0; root < size; ++root) {
      for (size_t bytes : {0, 1, 13, 4096}) {
        std::vector<std::vector<unsigned char>> got(static_cast<size_t>(size));
        run_ranks(size, [&](Comm& comm) {
          std::vector<unsigned char> buffer(bytes, 0);
          if (comm.rank() == root)
            for (size_t i = 0; i < bytes; ++i)
              buffer[i] = static_cast<unsigned char>((i * 7 + static_cast<size_t>(root)) % 251);
          comm.broadcast(buffer.data(), bytes, root);
          got[static_cast<size_t>(comm.rank())] = buffer;
        });
        std::vector<unsigned char> expected(bytes);
        for (size_t i = 0; i < bytes; ++i)
          expected[i] = static_cast<unsigned char>((i * 7 + static_cast<size_t>(root)) % 251);
        INFO("size " << size << " root " << root << " bytes " << bytes);
        for (const auto& buffer : got) CHECK(buffer == expected);
      }
    }
  }
}

TEST_CASE("thread comm: allgather and the typed helpers", "[comm]") {
  for (int size = 1; size <= 6; ++size) {
    std::vector<std::vector<int>> gathered(static_cast<size_t>(size));
    std::vector<std::vector<double>> broadcast(static_cast<size_t>(size));
    run_ranks(size, [&](Comm& comm) {
      const int r = comm.rank();
      // Three ints per rank through the byte-level call.
      const int send[3] = {r, 10 * r, -r};
      std::vector<int> recv(static_cast<size_t>(3 * comm.size()), -99);
      comm.allgather(send, recv.data(), sizeof(send));
      comm.allgather(nullptr, nullptr, 0);  // an empty one is legal and a no-op
      const auto ranks = ringtrain::allgather_value(comm, r * r);
      recv.insert(recv.end(), ranks.begin(), ranks.end());
      gathered[static_cast<size_t>(r)] = recv;
      std::vector<double> values(3, -1.0);
      if (r == comm.size() - 1) values = {0.5, 1.5, 2.5};
      ringtrain::broadcast_values(comm, values, comm.size() - 1);
      broadcast[static_cast<size_t>(r)] = values;
    });
    std::vector<int> expected;
    for (int r = 0; r < size; ++r) expected.insert(expected.end(), {r, 10 * r, -r});
    for (int r = 0; r < size; ++r) expected.push_back(r * r);
    for (int r = 0; r < size; ++r) {
      INFO("size " << size << " rank " << r);
      CHECK(gathered[static_cast<size_t>(r)] == expected);
      CHECK(broadcast[static_cast<size_t>(r)] == std::vector<double>{0.5, 1.5, 2.5});
    }
  }
}

TEST_CASE("thread comm: nobody leaves a barrier before everyone arrived", "[comm]") {
  constexpr int kSize = 6, kRounds = 50;
  std::atomic<int> arrivals{0};
  std::atomic<int> early{0};
  run_ranks(kSize, [&](Comm& comm) {
    for (int round = 0; round < kRounds; ++round) {
      arrivals.fetch_add(1);
      comm.barrier();
      // Ranks may already be arriving for the next round, never still missing from this one.
      if (arrivals.load() < (round + 1) * kSize) early.fetch_add(1);
    }
  });
  CHECK(arrivals.load() == kSize * kRounds);
  CHECK(early.load() == 0);
}

TEST_CASE("thread comm: allreduce_library sum and avg", "[comm]") {
  for (int size = 1; size <= 8; ++size) {
    for (size_t count : {0, 1, 7, 1000}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
        std::vector<std::vector<float>> got(static_cast<size_t>(size));
        run_ranks(size, [&](Comm& comm) {
          // Rank r holds r + i: the sum is N i + N(N - 1)/2, exact in float.
          std::vector<float> data(count);
          for (size_t i = 0; i < count; ++i)
            data[i] = static_cast<float>(comm.rank()) + static_cast<float>(i);
          comm.allreduce_library(data.data(), count, op);
          got[static_cast<size_t>(comm.rank())] = data;
        });
        std::vector<float> expected(count);
        for (size_t i = 0; i < count; ++i) {
          const double sum =
              static_cast<double>(size) * static_cast<double>(i) + size * (size - 1) / 2.0;
          expected[i] = static_cast<float>(op == ReduceOp::kAvg ? sum / size : sum);
        }
        INFO("size " << size << " count " << count << " op " << ringtrain::to_string(op));
        for (const auto& data : got) {
          REQUIRE(data.size() == count);
          // Bit-identical on every rank and to the closed form.
          CHECK(std::memcmp(data.data(), expected.data(), count * sizeof(float)) == 0);
        }
      }
    }
  }
}

TEST_CASE("thread comm: a size mismatch throws naming both ranks", "[comm]") {
  const auto body = [](Comm& comm) {
    std::vector<float> buffer(4, 1.0f);
    if (comm.rank() == 0) {
      CommRequest send = comm.isend(buffer.data(), 3, 1, 9);
      comm.wait(send);
    } else {
      CommRequest recv = comm.irecv(buffer.data(), 4, 0, 9);
      comm.wait(recv);
    }
  };
  CHECK_THROWS_WITH(run_ranks(2, body), Contains("rank 1: received 3 floats from rank 0 (tag 9)") &&
                                            Contains("expects 4"));
}

TEST_CASE("thread comm: a rank that throws releases the others at once", "[comm]") {
  // The default 30 s timeout: the others must be released by the failure, not by the clock.
  const auto start = Clock::now();
  const auto body = [](Comm& comm) {
    float value = 0;
    switch (comm.rank()) {
      case 2:
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
        throw std::runtime_error("rank 2 broke");
      case 3:
        comm.barrier();
        break;
      default: {
        CommRequest recv = comm.irecv(&value, 1, 2, 0);
        comm.wait(recv);
      }
    }
  };
  CHECK_THROWS_WITH(run_ranks(4, body), "rank 2 broke");
  CHECK(seconds_since(start) < 5.0);
}

TEST_CASE("thread comm: a receive with no sender times out naming the peer", "[comm]") {
  ThreadWorld world(3, std::chrono::milliseconds(200));
  const auto start = Clock::now();
  const auto body = [](Comm& comm) {
    if (comm.rank() != 0) return;
    float value = 0;
    CommRequest recv = comm.irecv(&value, 1, 2, 5);
    comm.wait(recv);
  };
  CHECK_THROWS_WITH(run_ranks(world, body),
                    Contains("rank 0: no progress for 0.2 s on a receive from rank 2 (tag 5)"));
  CHECK(seconds_since(start) < 5.0);
}

TEST_CASE("thread comm: a send completes only at the matching receive", "[comm]") {
  // Waiting for a send before the peer posts its receive is a deadlock under MPI once messages
  // are large; here it is one at every size.
  ThreadWorld world(2, std::chrono::milliseconds(200));
  const auto body = [](Comm& comm) {
    float value = 1;
    const int peer = 1 - comm.rank();
    CommRequest send = comm.isend(&value, 1, peer, 0);
    comm.wait(send);
    CommRequest recv = comm.irecv(&value, 1, peer, 0);
    comm.wait(recv);
  };
  CHECK_THROWS_WITH(run_ranks(world, body), Contains("no progress") && Contains("on a send to"));
}

TEST_CASE("thread comm: requests left in flight and mismatched collectives fail", "[comm]") {
  const auto forgets = [](Comm& comm) {
    static float value = 1;  // outlives the rank, so only the bookkeeping is under test
    if (comm.rank() == 0) comm.isend(&value, 1, 1, 0);
  };
  CHECK_THROWS_WITH(run_ranks(2, forgets),
                    Contains("rank 0 returned with 1 request(s) it never waited for") &&
                        Contains("a send to rank 1 (tag 0)"));

  const auto mismatched = [](Comm& comm) {
    if (comm.rank() == 0) {
      comm.barrier();
    } else {
      float value = 0;
      comm.allreduce_library(&value, 1, ReduceOp::kSum);
    }
  };
  CHECK_THROWS_WITH(run_ranks(2, mismatched), Contains("collective mismatch"));

  const auto bad_peer = [](Comm& comm) {
    float value = 0;
    comm.isend(&value, 1, comm.size(), 0);
  };
  CHECK_THROWS_WITH(run_ranks(2, bad_peer), Contains("bad peer"));
}
