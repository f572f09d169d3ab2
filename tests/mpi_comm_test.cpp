// MpiSession and MpiComm under mpirun (registered for 1..5 ranks by tests/CMakeLists.txt).
// Every check compares with a closed-form value built from small integers, so results must be
// exact; a failed check prints the condition with the rank and ends the whole job through
// MPI_Abort, so no rank is left waiting. No Catch2: every rank is its own process and a test
// framework's output from five processes at once reads worse than one line from the failing
// rank.
//
// `--expect-timeout` (2 ranks, RINGTRAIN_COMM_TIMEOUT_S=1): rank 0 waits for a message rank 1
// never sends; wait() must throw an error naming rank 1, cancel the receive, and leave MPI in a
// state that still finalizes cleanly.
//
// `--expect-progress` (2 ranks, RINGTRAIN_COMM_TIMEOUT_S=1): the deadline judges progress, not
// one wait's wall time: rank 0 waits 2.5 s for a message and for a barrier while its board
// records progress (its own, then the job's as a watchdog would note it), and neither throws;
// then, under a real watchdog, it waits 2.5 s in a barrier while rank 1 computes: the watchdog
// must neither end the job nor let the barrier's deadline pass.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "ringtrain/check.h"
#include "ringtrain/mpi_comm.h"
#include "ringtrain/watchdog.h"

namespace {

using ringtrain::CommRequest;
using ringtrain::MpiComm;
using ringtrain::MpiSession;
using ringtrain::ReduceOp;

int g_rank = -1;

[[noreturn]] void check_failed(const char* file, int line, const char* condition) {
  std::fprintf(stderr, "rank %d: %s:%d: CHECK(%s) failed\n", g_rank, file, line, condition);
  MpiSession::abort_job(1);
}

#define CHECK(cond)                                       \
  do {                                                    \
    if (!(cond)) check_failed(__FILE__, __LINE__, #cond); \
  } while (0)

bool contains(std::string_view text, std::string_view part) {
  return text.find(part) != std::string_view::npos;
}

// Runs `call`, which must throw a ringtrain::Error containing every one of `parts`.
template <typename Call>
void check_throws(Call call, std::initializer_list<std::string_view> parts) {
  try {
    call();
  } catch (const ringtrain::Error& error) {
    for (std::string_view part : parts) {
      if (!contains(error.what(), part)) {
        std::fprintf(stderr, "rank %d: error '%s' lacks '%.*s'\n", g_rank, error.what(),
                     static_cast<int>(part.size()), part.data());
        MpiSession::abort_job(1);
      }
    }
    return;
  }
  CHECK(!"the call did not throw");
}

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void check_ranks(MpiComm& comm) {
  int world_size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  CHECK(comm.size() == world_size);
  CHECK(comm.rank() >= 0 && comm.rank() < comm.size());
  CHECK(comm.name() == "mpi");
  // mpirun starts every rank on this one machine.
  CHECK(comm.local_size() == comm.size());
  CHECK(comm.local_rank() == comm.rank());
  const auto ranks = ringtrain::allgather_value(comm, comm.rank());
  for (int r = 0; r < comm.size(); ++r) CHECK(ranks[static_cast<size_t>(r)] == r);
  const auto local = ringtrain::allgather_value(comm, comm.local_rank());
  CHECK(local == ranks);
}

// The most requests this program ever has in flight at once (4 tags, a send and a receive
// each): the slot table must never grow beyond it.
constexpr int kMostInFlight = 8;

float ring_value(int from, int tag, size_t i) {
  return static_cast<float>(1000 * tag + 100 * from + static_cast<int>(i % 97));
}

// Several tags in flight at once, waited in an order unlike the posting order; the message for
// tag t from rank s holds s + t + 1 floats (uneven), or `large` floats when that is set.
void check_ring_exchange(MpiComm& comm, int tags, size_t large) {
  const int r = comm.rank(), n = comm.size();
  const int right = (r + 1) % n, left = (r - 1 + n) % n;
  const auto length = [large](int from, int tag) {
    return large > 0 ? large : static_cast<size_t>(from + tag + 1);
  };
  std::vector<std::vector<float>> send(static_cast<size_t>(tags)), recv(send.size());
  std::vector<CommRequest> sends(send.size()), recvs(send.size());
  const int rounds = large > 0 ? 3 : 200;
  for (int round = 0; round < rounds; ++round) {
    for (int t = 0; t < tags; ++t) {
      auto& buffer = recv[static_cast<size_t>(t)];
      buffer.assign(length(left, t), -1.0f);
      recvs[static_cast<size_t>(t)] = comm.irecv(buffer.data(), buffer.size(), left, t);
    }
    for (int t = tags - 1; t >= 0; --t) {
      auto& buffer = send[static_cast<size_t>(t)];
      buffer.resize(length(r, t));
      for (size_t i = 0; i < buffer.size(); ++i) buffer[i] = ring_value(r, t, i);
      sends[static_cast<size_t>(t)] = comm.isend(buffer.data(), buffer.size(), right, t);
    }
    // The slot table is reused: it never outgrows the most requests ever in flight at once.
    for (const auto& request : sends) CHECK(request.id >= 0 && request.id < kMostInFlight);
    for (const auto& request : recvs) CHECK(request.id >= 0 && request.id < kMostInFlight);
    for (int t = tags - 1; t >= 0; t -= 2) comm.wait(recvs[static_cast<size_t>(t)]);
    for (auto& request : sends) comm.wait(request);
    for (auto& request : recvs) comm.wait(request);  // the rest; waited ones are no-ops
    for (int t = 0; t < tags; ++t) {
      CHECK(!recvs[static_cast<size_t>(t)].active());
      const auto& buffer = recv[static_cast<size_t>(t)];
      for (size_t i = 0; i < buffer.size(); ++i) CHECK(buffer[i] == ring_value(left, t, i));
    }
  }
}

void check_sendrecv(MpiComm& comm) {
  const int r = comm.rank(), n = comm.size();
  const int dst = (r + 2) % n, src = (r - 2 + 2 * n) % n;
  std::vector<float> send(static_cast<size_t>(r + 3)), recv(static_cast<size_t>(src + 3));
  for (size_t i = 0; i < send.size(); ++i) send[i] = ring_value(r, 5, i);
  comm.sendrecv(send.data(), send.size(), dst, recv.data(), recv.size(), src, 5);
  for (size_t i = 0; i < recv.size(); ++i) CHECK(recv[i] == ring_value(src, 5, i));
}

void check_errors(MpiComm& comm) {
  const int r = comm.rank(), n = comm.size();
  const int right = (r + 1) % n, left = (r - 1 + n) % n;
  // A message shorter than the receive: MPI accepts it, wait() must not.
  std::vector<float> send(4, 1.0f), recv(5, 0.0f);
  CommRequest receiving = comm.irecv(recv.data(), recv.size(), left, 77);
  CommRequest sending = comm.isend(send.data(), send.size(), right, 77);
  comm.wait(sending);
  check_throws([&] { comm.wait(receiving); },
               {"received 4 floats from rank", "(tag 77)", "expects 5"});
  // A bad peer comes back as an error (MPI_ERRORS_RETURN), naming the call and the peer.
  check_throws([&] { comm.isend(send.data(), 1, n, 0); }, {"MPI_Isend", "a send to rank"});
  // Waiting on an inactive request is a no-op.
  CommRequest none;
  comm.wait(none);
  // A bad timeout setting is refused by name (before any collective call, on every rank).
  setenv("RINGTRAIN_COMM_TIMEOUT_S", "soon", 1);
  check_throws([] { MpiComm bad; }, {"RINGTRAIN_COMM_TIMEOUT_S='soon'"});
  unsetenv("RINGTRAIN_COMM_TIMEOUT_S");
  comm.barrier();
}

void check_allreduce(MpiComm& comm) {
  const int n = comm.size();
  // (1 << 21) + 5: two 4 MiB pieces and a short one.
  for (size_t count :
       {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{1} << 18, (size_t{1} << 21) + 5}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      // Rank r holds r + (i % 97): the sum is N (i % 97) + N(N - 1)/2, exact in float.
      std::vector<float> data(count);
      for (size_t i = 0; i < count; ++i)
        data[i] = static_cast<float>(comm.rank() + static_cast<int>(i % 97));
      comm.allreduce_library(data.data(), count, op);
      for (size_t i = 0; i < count; ++i) {
        const auto sum = static_cast<float>(n * static_cast<int>(i % 97) + n * (n - 1) / 2);
        const float expected = op == ReduceOp::kAvg ? sum / static_cast<float>(n) : sum;
        CHECK(data[i] == expected);
      }
    }
  }
}

void check_broadcast(MpiComm& comm) {
  for (int root = 0; root < comm.size(); ++root) {
    // (9 << 20) + 13: two 4 MiB pieces and a short one.
    for (size_t bytes :
         {size_t{0}, size_t{1}, size_t{13}, size_t{1} << 20, (size_t{9} << 20) + 13}) {
      const auto pattern = [root](size_t i) {
        return static_cast<unsigned char>((i * 7 + static_cast<size_t>(root)) % 251);
      };
      std::vector<unsigned char> buffer(bytes, 0);
      if (comm.rank() == root)
        for (size_t i = 0; i < bytes; ++i) buffer[i] = pattern(i);
      comm.broadcast(buffer.data(), bytes, root);
      for (size_t i = 0; i < bytes; ++i) CHECK(buffer[i] == pattern(i));
    }
  }
  std::vector<double> values(3, 0.0);
  if (comm.rank() == comm.size() - 1) values = {0.5, -1.5, 2.25};
  ringtrain::broadcast_values(comm, values, comm.size() - 1);
  CHECK(values == (std::vector<double>{0.5, -1.5, 2.25}));
}

void check_allgather(MpiComm& comm) {
  const int r = comm.rank();
  const int send[3] = {r, 10 * r, -r};
  std::vector<int> recv(static_cast<size_t>(3 * comm.size()), -99);
  comm.allgather(send, recv.data(), sizeof(send));
  for (int s = 0; s < comm.size(); ++s) {
    CHECK(recv[static_cast<size_t>(3 * s)] == s);
    CHECK(recv[static_cast<size_t>(3 * s + 1)] == 10 * s);
    CHECK(recv[static_cast<size_t>(3 * s + 2)] == -s);
  }
}

void check_barrier(MpiComm& comm) {
  // Rank 0 arrives late; nobody may leave before it arrived (one machine, one wall clock).
  double arrived = 0;
  if (comm.rank() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    arrived = wall_seconds();
  }
  comm.barrier();
  const double left = wall_seconds();
  const auto arrivals = ringtrain::allgather_value(comm, arrived);
  CHECK(left >= arrivals[0]);
}

// StallDeadline on made-up times: progress, not wall time, and a stopped process's gap (a
// poll that comes seconds after the one before) is not counted.
void check_stall_deadline() {
  constexpr int64_t kS = 1'000'000'000;
  ringtrain::ProgressBoard board;
  const int64_t t0 = ringtrain::ProgressBoard::now_ns();
  ringtrain::StallDeadline deadline(board, 1.0, t0);
  CHECK(!deadline.passed(t0 + kS / 2));
  CHECK(!deadline.passed(t0 + 5 * kS));        // stopped for 4.5 s: 0.5 s without progress so far
  CHECK(!deadline.passed(t0 + 54 * kS / 10));  // 0.9 s
  CHECK(deadline.passed(t0 + 56 * kS / 10));   // 1.1 s
  // The job's progress, as the watchdog notes it, moves the deadline on.
  board.note_job_progress(t0 + 6 * kS);
  CHECK(!deadline.passed(t0 + 65 * kS / 10));
  CHECK(deadline.passed(t0 + 71 * kS / 10));
  // Progress of this rank does too (the board's clock is the real one).
  ringtrain::ProgressBoard other;
  const int64_t t1 = ringtrain::ProgressBoard::now_ns();
  ringtrain::StallDeadline fresh(other, 1.0, t1);
  CHECK(!fresh.passed(t1 + 6 * kS / 10));  // polls less than a second apart: no stop
  CHECK(fresh.passed(t1 + 11 * kS / 10));
  other.progress();
  const int64_t t2 = other.last_progress_ns();  // just after t1, in real time
  CHECK(!fresh.passed(t2 + kS / 2));
  CHECK(fresh.passed(t2 + 12 * kS / 10));
}

int run_all(MpiComm& comm, const MpiSession& session) {
  CHECK(session.provided() >= MPI_THREAD_MULTIPLE);
  {
    // MPI is already running: a second session must neither initialise nor finalize it (the
    // checks below would fail on a finalized MPI).
    MpiSession nested(nullptr, nullptr);
    CHECK(nested.provided() == session.provided());
  }
  check_ranks(comm);
  check_ring_exchange(comm, 4, 0);
  check_ring_exchange(comm, 2, size_t{1} << 20);  // 4 MiB: the rendezvous path
  check_sendrecv(comm);
  check_errors(comm);
  check_allreduce(comm);
  check_broadcast(comm);
  check_allgather(comm);
  check_barrier(comm);
  check_stall_deadline();
  if (comm.rank() == 0) std::printf("mpi_comm_test: %d ranks passed\n", comm.size());
  return 0;
}

int run_expect_timeout(MpiComm& comm) {
  CHECK(comm.size() == 2);
  if (comm.rank() == 0) {
    float value = 0;
    CommRequest never = comm.irecv(&value, 1, 1, 7);
    const double start = wall_seconds();
    bool threw = false;
    try {
      comm.wait(never);
    } catch (const ringtrain::Error& error) {
      threw = true;
      std::printf("expected timeout: %s\n", error.what());
      CHECK(contains(error.what(), "rank 0: no progress for 1 s on a receive from rank 1 (tag 7)"));
      CHECK(contains(error.what(), "RINGTRAIN_COMM_TIMEOUT_S"));
    }
    CHECK(threw);
    CHECK(!never.active());
    const double waited = wall_seconds() - start;
    CHECK(waited >= 0.9 && waited < 30.0);
  }
  // Both ranks go on; the cancelled receive must not stop this or MPI_Finalize. Rank 1 joins
  // the barrier only after rank 0 has given up (1 s): the barrier has a deadline too.
  if (comm.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  comm.barrier();
  return 0;
}

// With a watchdog (timeout 0.25 s: its re-asks leave the 1 s deadline 0.75 s of margin) on both
// ranks: rank 1 computes (posts progress) for 2.5 s while rank 0 waits in a barrier with nothing to
// post. Rank 0's watchdog must find the job moving instead of ending it (exit 4), and note rank 1's
// progress on rank 0's board, which keeps the barrier's own 1 s deadline from passing.
void watched_wait_through_progress(MpiComm& comm) {
  ringtrain::CollectiveWatchdog watchdog(comm, 0.25);
  if (comm.rank() == 1) {
    const double until = wall_seconds() + 2.5;
    while (wall_seconds() < until) {
      comm.board().progress();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  const double start = wall_seconds();
  try {
    comm.barrier();
  } catch (const ringtrain::Error& error) {
    std::fprintf(stderr, "rank %d: %s\n", comm.rank(), error.what());
    CHECK(!"a watched wait with progress elsewhere threw");
  }
  if (comm.rank() == 0) CHECK(wall_seconds() - start >= 2.0);
}

// Rank 0 waits 2.5 s (2.5x the timeout) for a message and then for a barrier; meanwhile a
// thread posts progress on its board: first its own (a layer, say), then the job's, as the
// watchdog notes another rank's. Neither wait may throw.
int run_expect_progress(MpiComm& comm) {
  CHECK(comm.size() == 2);
  constexpr auto kLate = std::chrono::milliseconds(2500);
  float value = 0;
  if (comm.rank() == 1) {
    std::this_thread::sleep_for(kLate);
    value = 42.0f;
    CommRequest sending = comm.isend(&value, 1, 0, 9);
    comm.wait(sending);
    std::this_thread::sleep_for(kLate);
    comm.barrier();
    watched_wait_through_progress(comm);
    return 0;
  }
  for (const bool own : {true, false}) {
    std::atomic<bool> done{false};
    std::thread ticking([&] {
      while (!done.load()) {
        if (own) {
          comm.board().progress();
        } else {
          comm.board().note_job_progress(ringtrain::ProgressBoard::now_ns());
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });
    const double start = wall_seconds();
    try {
      if (own) {
        CommRequest receiving = comm.irecv(&value, 1, 1, 9);
        comm.wait(receiving);
        CHECK(value == 42.0f);
      } else {
        comm.barrier();
      }
    } catch (const ringtrain::Error& error) {
      std::fprintf(stderr, "rank 0: %s\n", error.what());
      CHECK(!"a wait with progress threw");
    }
    done.store(true);
    ticking.join();
    CHECK(wall_seconds() - start >= 2.0);
  }
  watched_wait_through_progress(comm);
  std::printf("expected progress: waits of 2.5 s with progress under a 1 s deadline passed\n");
  return 0;
}

// Rank 1 reaches the barrier 4 s late: rank 0's barrier must give up after 1 s with an error
// that names the collective. The job cannot finish cleanly after that (a collective cannot be
// cancelled), so ctest matches the printed line, not the exit code.
int run_expect_collective_timeout(MpiComm& comm) {
  CHECK(comm.size() == 2);
  if (comm.rank() == 1) {
    std::this_thread::sleep_for(std::chrono::seconds(4));
    comm.barrier();
    return 0;
  }
  const double start = wall_seconds();
  try {
    comm.barrier();
  } catch (const ringtrain::Error& error) {
    const double waited = wall_seconds() - start;
    CHECK(contains(error.what(), "rank 0: no progress for 1 s in a barrier"));
    CHECK(waited >= 0.9 && waited < 3.5);
    std::printf("expected collective timeout: %s\n", error.what());
    std::fflush(stdout);
    MpiSession::abort_job(0);
  }
  std::printf("the barrier did not time out\n");
  MpiSession::abort_job(1);
}

}  // namespace

int main(int argc, char** argv) {
  const bool expect_timeout = argc > 1 && std::strcmp(argv[1], "--expect-timeout") == 0;
  const bool expect_collective_timeout =
      argc > 1 && std::strcmp(argv[1], "--expect-collective-timeout") == 0;
  const bool expect_progress = argc > 1 && std::strcmp(argv[1], "--expect-progress") == 0;
  try {
    MpiSession session(&argc, &argv);
    int code = 0;
    {
      MpiComm comm;
      g_rank = comm.rank();
      code = expect_timeout              ? run_expect_timeout(comm)
             : expect_collective_timeout ? run_expect_collective_timeout(comm)
             : expect_progress           ? run_expect_progress(comm)
                                         : run_all(comm, session);
    }
    return code;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "rank %d: %s\n", g_rank, error.what());
    MpiSession::abort_job(1);
  }
}
