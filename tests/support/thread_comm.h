// Ranks as threads in one process: a Comm for tests that need no MPI. Every collective built on
// Comm (the ring first of all) can be swept over world sizes in one test binary.
//
// The one idea: this transport is as strict as MPI is allowed to be, so that a ring that only
// works by luck fails here rather than on a cluster.
//  - A send completes only once the matching receive is posted (MPI_Ssend semantics): a ring
//    that waits for a send before posting the receive that matches its neighbour's send
//    deadlocks, as it would under MPI for large messages, and then times out.
//  - Messages between one pair with one tag match in FIFO order, like MPI.
//  - Sizes must match exactly (MPI would accept a shorter message).
//  - Every blocking wait times out (30 s by default) with an error naming ranks and tag, and a
//    rank that throws releases every other rank, so a broken ring fails a test, never hangs it.
//  - A rank may not return with requests it never waited for.
// Data is copied into the world at isend and out of it in the receiver's wait(), so no thread
// ever touches another thread's buffers (a failing rank can unwind its stack safely).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "ringtrain/check.h"  // what every failure here throws: ringtrain::Error
#include "ringtrain/comm.h"

namespace ringtrain {

// The state the ranks of one run share. A world runs once (run_ranks).
class ThreadWorld {
 public:
  static constexpr std::chrono::milliseconds kDefaultTimeout{30'000};
  explicit ThreadWorld(int size, std::chrono::milliseconds timeout = kDefaultTimeout);
  ThreadWorld(const ThreadWorld&) = delete;
  ThreadWorld& operator=(const ThreadWorld&) = delete;

  int size() const { return size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  friend class ThreadComm;
  friend void run_ranks(ThreadWorld& world, const std::function<void(Comm&)>& body);

  using Key = std::tuple<int, int, int>;  // (source, destination, tag)
  struct Message {
    std::vector<float> data;
    int64_t send_id = -1;  // completed when a receive takes this message
  };
  struct Request {
    int owner = -1;
    bool send = false;
    int peer = -1;
    int tag = -1;
    size_t count = 0;
    float* recv_data = nullptr;
    bool matched = false;
    std::vector<float> payload;  // a matched receive's message
  };
  enum class Kind { kAllreduce, kBroadcast, kAllgather, kBarrier };
  // One rank's part in the current collective, copied in so that nobody reads another rank's
  // memory.
  struct Contribution {
    Kind kind = Kind::kBarrier;
    size_t count = 0;  // floats (allreduce) or bytes (broadcast, allgather)
    int root = -1;
    ReduceOp op = ReduceOp::kSum;
    std::vector<float> floats;
    std::vector<unsigned char> bytes;
  };

  // Blocks (lock held) until done() or the timeout; throws naming `what()` on timeout and when
  // another rank has failed.
  template <typename Done, typename What>
  void block(std::unique_lock<std::mutex>& lock, int rank, Done done, What what);
  void check_alive(int rank, const char* call) const;  // lock held
  // The generation-counted barrier every collective goes through (lock held).
  void barrier_locked(std::unique_lock<std::mutex>& lock, int rank, const char* call);
  void fail(std::exception_ptr error);
  void check_finished(int rank);  // no requests left behind
  void check_drained();           // after the run: no message left unreceived

  const int size_;
  const std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable changed_;
  bool aborted_ = false;
  std::exception_ptr first_failure_;

  std::map<Key, std::deque<Message>> messages_;  // sent, not yet received
  std::map<Key, std::deque<int64_t>> posted_;    // receives posted, not yet matched
  std::unordered_map<int64_t, Request> requests_;
  int64_t next_id_ = 0;

  std::vector<Contribution> contributions_;  // [size]
  int arrived_ = 0;
  uint64_t generation_ = 0;
};

// Rank `rank` of a ThreadWorld.
class ThreadComm final : public Comm {
 public:
  ThreadComm(ThreadWorld& world, int rank);

  int rank() const override { return rank_; }
  int size() const override { return world_.size(); }
  int local_rank() const override { return rank_; }
  int local_size() const override { return world_.size(); }
  std::string name() const override { return "threads"; }
  CommRequest isend(const float* data, size_t n, int peer, int tag) override;
  CommRequest irecv(float* data, size_t n, int peer, int tag) override;
  void wait(CommRequest& request) override;
  // Sums in double, in rank order 0..N-1, rounded to float once (avg divides the double sum by
  // N first): every rank gets the same bits, and the result is the exact sum whenever that
  // fits a float.
  void allreduce_library(float* data, size_t n, ReduceOp op) override;
  void broadcast(void* data, size_t bytes, int root) override;
  void allgather(const void* send, void* recv, size_t bytes) override;
  void barrier() override;

 private:
  // Publishes this rank's contribution and waits for every rank's; the caller then reads
  // world_.contributions_ and calls finish_collective().
  void start_collective(ThreadWorld::Contribution contribution, const char* call);
  void finish_collective(const char* call);

  ThreadWorld& world_;
  const int rank_;
};

// Runs body on `size` ranks, one thread each, and rethrows the first exception any rank threw
// once every thread has ended (the others are released, not left blocked). Use no Catch2
// assertions inside body (Catch2 v2 is not thread-safe): record results, check them after.
void run_ranks(ThreadWorld& world, const std::function<void(Comm&)>& body);
void run_ranks(int size, const std::function<void(Comm&)>& body);

}  // namespace ringtrain
