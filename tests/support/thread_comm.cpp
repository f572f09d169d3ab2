// The thread transport (see thread_comm.h for the semantics it guarantees). One mutex and one
// condition variable per world: simple beats fast in a test transport, and a notify_all per
// change is cheap for the 1..16 ranks the tests run.
#include "thread_comm.h"

#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "ringtrain/check.h"

namespace ringtrain {

namespace {

const char* kind_name(int kind) {
  static const char* const names[] = {"allreduce_library", "broadcast", "allgather", "barrier"};
  return names[kind];
}

std::string transfer_name(bool send, int peer, int tag) {
  return fmt::format("{} rank {} (tag {})", send ? "a send to" : "a receive from", peer, tag);
}

}  // namespace

// ---- world ----

ThreadWorld::ThreadWorld(int size, std::chrono::milliseconds timeout)
    : size_(size), timeout_(timeout) {
  RINGTRAIN_CHECK(size >= 1, "a thread world needs at least one rank, not {}", size);
  contributions_.resize(static_cast<size_t>(size));
}

template <typename Done, typename What>
void ThreadWorld::block(std::unique_lock<std::mutex>& lock, int rank, Done done, What what) {
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  while (!done()) {
    if (aborted_) {
      throw Error(
          fmt::format("rank {}: released from {} because another rank failed", rank, what()));
    }
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout && !done() && !aborted_) {
      throw Error(fmt::format(
          "rank {}: no progress for {:g} s {} (thread transport timeout; a deadlock or a "
          "missing call on another rank?)",
          rank, std::chrono::duration<double>(timeout_).count(), what()));
    }
  }
}

void ThreadWorld::check_alive(int rank, const char* call) const {
  if (aborted_) {
    throw Error(fmt::format("rank {}: {} refused because another rank failed", rank, call));
  }
}

void ThreadWorld::barrier_locked(std::unique_lock<std::mutex>& lock, int rank, const char* call) {
  const uint64_t generation = generation_;
  if (++arrived_ == size_) {
    arrived_ = 0;
    ++generation_;
    changed_.notify_all();
    return;
  }
  block(
      lock, rank, [&] { return generation_ != generation; },
      [&] { return fmt::format("in {} ({} of {} ranks arrived)", call, arrived_, size_); });
}

void ThreadWorld::fail(std::exception_ptr error) {
  std::lock_guard lock(mutex_);
  if (!first_failure_) first_failure_ = error;
  aborted_ = true;
  changed_.notify_all();
}

void ThreadWorld::check_finished(int rank) {
  std::lock_guard lock(mutex_);
  int left = 0;
  std::string example;
  for (const auto& [id, request] : requests_) {
    if (request.owner != rank) continue;
    if (left++ == 0) example = transfer_name(request.send, request.peer, request.tag);
  }
  RINGTRAIN_CHECK(left == 0, "rank {} returned with {} request(s) it never waited for, e.g. {}",
                  rank, left, example);
}

void ThreadWorld::check_drained() {
  std::lock_guard lock(mutex_);
  for (const auto& [key, queue] : messages_) {
    if (queue.empty()) continue;
    const auto [src, dst, tag] = key;
    RINGTRAIN_FAIL("rank {} sent {} message(s) to rank {} (tag {}) that no receive took", src,
                   queue.size(), dst, tag);
  }
}

// ---- one rank ----

ThreadComm::ThreadComm(ThreadWorld& world, int rank) : world_(world), rank_(rank) {
  RINGTRAIN_CHECK(rank >= 0 && rank < world.size(), "rank {} in a thread world of {} ranks", rank,
                  world.size());
}

CommRequest ThreadComm::isend(const float* data, size_t n, int peer, int tag) {
  RINGTRAIN_CHECK(peer >= 0 && peer < size() && tag >= 0 && (data != nullptr || n == 0),
                  "rank {}: isend of {} floats to rank {} (tag {}): bad peer, tag or buffer", rank_,
                  n, peer, tag);
  std::vector<float> copy(data, data + n);  // before the lock: the copy may be large
  std::lock_guard lock(world_.mutex_);
  world_.check_alive(rank_, "isend");
  const int64_t id = world_.next_id_++;
  ThreadWorld::Request& request = world_.requests_[id];
  request.owner = rank_;
  request.send = true;
  request.peer = peer;
  request.tag = tag;
  request.count = n;
  const ThreadWorld::Key key{rank_, peer, tag};
  auto posted = world_.posted_.find(key);
  if (posted != world_.posted_.end() && !posted->second.empty()) {
    ThreadWorld::Request& receive = world_.requests_.at(posted->second.front());
    posted->second.pop_front();
    receive.payload = std::move(copy);
    receive.matched = true;
    request.matched = true;
    world_.changed_.notify_all();
  } else {
    world_.messages_[key].push_back({std::move(copy), id});
  }
  return CommRequest{id};
}

CommRequest ThreadComm::irecv(float* data, size_t n, int peer, int tag) {
  RINGTRAIN_CHECK(peer >= 0 && peer < size() && tag >= 0 && (data != nullptr || n == 0),
                  "rank {}: irecv of {} floats from rank {} (tag {}): bad peer, tag or buffer",
                  rank_, n, peer, tag);
  std::lock_guard lock(world_.mutex_);
  world_.check_alive(rank_, "irecv");
  const int64_t id = world_.next_id_++;
  ThreadWorld::Request& request = world_.requests_[id];
  request.owner = rank_;
  request.send = false;
  request.peer = peer;
  request.tag = tag;
  request.count = n;
  request.recv_data = data;
  const ThreadWorld::Key key{peer, rank_, tag};
  auto queued = world_.messages_.find(key);
  if (queued != world_.messages_.end() && !queued->second.empty()) {
    ThreadWorld::Message& message = queued->second.front();
    request.payload = std::move(message.data);
    request.matched = true;
    world_.requests_.at(message.send_id).matched = true;
    queued->second.pop_front();
    world_.changed_.notify_all();
  } else {
    world_.posted_[key].push_back(id);
  }
  return CommRequest{id};
}

void ThreadComm::wait(CommRequest& request) {
  if (!request.active()) return;
  const int64_t id = request.id;
  request.id = -1;  // spent, whatever happens below
  std::unique_lock lock(world_.mutex_);
  auto found = world_.requests_.find(id);
  RINGTRAIN_CHECK(found != world_.requests_.end() && found->second.owner == rank_,
                  "rank {}: wait() on request {}, which is not one of this rank's in flight", rank_,
                  id);
  // unordered_map keeps references stable while other ranks insert.
  ThreadWorld::Request& pending = found->second;
  world_.block(
      lock, rank_, [&] { return pending.matched; },
      [&] { return "on " + transfer_name(pending.send, pending.peer, pending.tag); });
  const ThreadWorld::Request done = std::move(pending);
  world_.requests_.erase(id);
  lock.unlock();

  if (done.send) return;
  RINGTRAIN_CHECK(done.payload.size() == done.count,
                  "rank {}: received {} floats from rank {} (tag {}) but the receive expects {}",
                  rank_, done.payload.size(), done.peer, done.tag, done.count);
  if (done.count > 0) std::memcpy(done.recv_data, done.payload.data(), done.count * sizeof(float));
}

void ThreadComm::start_collective(ThreadWorld::Contribution contribution, const char* call) {
  std::unique_lock lock(world_.mutex_);
  world_.check_alive(rank_, call);
  world_.contributions_[static_cast<size_t>(rank_)] = std::move(contribution);
  world_.barrier_locked(lock, rank_, call);
  // Every rank sees the same contributions, so a mismatch throws on all of them alike.
  const auto& mine = world_.contributions_[static_cast<size_t>(rank_)];
  for (int r = 0; r < size(); ++r) {
    const auto& theirs = world_.contributions_[static_cast<size_t>(r)];
    RINGTRAIN_CHECK(theirs.kind == mine.kind && theirs.count == mine.count &&
                        theirs.root == mine.root && theirs.op == mine.op,
                    "rank {}: collective mismatch: this rank called {} (count {}, root {}, op "
                    "{}) but rank {} called {} (count {}, root {}, op {})",
                    rank_, kind_name(static_cast<int>(mine.kind)), mine.count, mine.root,
                    to_string(mine.op), r, kind_name(static_cast<int>(theirs.kind)), theirs.count,
                    theirs.root, to_string(theirs.op));
  }
}

void ThreadComm::finish_collective(const char* call) {
  // Nobody may publish the next contribution until every rank has read this one.
  std::unique_lock lock(world_.mutex_);
  world_.barrier_locked(lock, rank_, call);
}

void ThreadComm::allreduce_library(float* data, size_t n, ReduceOp op) {
  ThreadWorld::Contribution mine{.kind = ThreadWorld::Kind::kAllreduce, .count = n, .op = op};
  mine.floats.assign(data, data + n);
  start_collective(std::move(mine), "allreduce_library");
  const auto& all = world_.contributions_;
  const double ranks = size();
  for (size_t i = 0; i < n; ++i) {
    double sum = 0;
    for (const auto& part : all) sum += part.floats[i];
    data[i] = static_cast<float>(op == ReduceOp::kAvg ? sum / ranks : sum);
  }
  finish_collective("allreduce_library");
}

void ThreadComm::broadcast(void* data, size_t bytes, int root) {
  RINGTRAIN_CHECK(root >= 0 && root < size(), "rank {}: broadcast from rank {} in a world of {}",
                  rank_, root, size());
  ThreadWorld::Contribution mine{
      .kind = ThreadWorld::Kind::kBroadcast, .count = bytes, .root = root};
  const auto* base = static_cast<const unsigned char*>(data);
  if (rank_ == root) mine.bytes.assign(base, base + bytes);
  start_collective(std::move(mine), "broadcast");
  if (rank_ != root && bytes > 0) {
    std::memcpy(data, world_.contributions_[static_cast<size_t>(root)].bytes.data(), bytes);
  }
  finish_collective("broadcast");
}

void ThreadComm::allgather(const void* send, void* recv, size_t bytes) {
  ThreadWorld::Contribution mine{.kind = ThreadWorld::Kind::kAllgather, .count = bytes};
  const auto* base = static_cast<const unsigned char*>(send);
  mine.bytes.assign(base, base + bytes);
  start_collective(std::move(mine), "allgather");
  auto* out = static_cast<unsigned char*>(recv);
  if (bytes > 0) {
    for (size_t r = 0; r < static_cast<size_t>(size()); ++r) {
      std::memcpy(out + r * bytes, world_.contributions_[r].bytes.data(), bytes);
    }
  }
  finish_collective("allgather");
}

void ThreadComm::barrier() {
  start_collective({.kind = ThreadWorld::Kind::kBarrier}, "barrier");
  finish_collective("barrier");
}

// ---- running ranks ----

void run_ranks(ThreadWorld& world, const std::function<void(Comm&)>& body) {
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(world.size()));
  try {
    for (int r = 0; r < world.size(); ++r) {
      threads.emplace_back([&world, &body, r] {
        try {
          ThreadComm comm(world, r);
          body(comm);
          world.check_finished(r);
        } catch (...) {
          world.fail(std::current_exception());
        }
      });
    }
  } catch (...) {
    // Could not start a thread: release the ones already running before rethrowing.
    world.fail(std::current_exception());
  }
  for (auto& thread : threads) thread.join();
  if (world.first_failure_) std::rethrow_exception(world.first_failure_);
  world.check_drained();
}

void run_ranks(int size, const std::function<void(Comm&)>& body) {
  ThreadWorld world(size);
  run_ranks(world, body);
}

}  // namespace ringtrain
