// Checkpoints as files: the round trip of every field, each way a file can be bad (truncated,
// corrupt, another version, trailing bytes, lying lengths), the directory's keep-K rotation and
// its fallback past a corrupt newest file. Also the configuration check and the progress board
// that the watchdog reads, on thread ranks.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "ringtrain/check.h"
#include "ringtrain/checkpoint.h"
#include "ringtrain/comm.h"
#include "ringtrain/distributed.h"
#include "thread_comm.h"

namespace {

namespace fs = std::filesystem;
using Catch::Matchers::Contains;
using namespace ringtrain;

Checkpoint sample_checkpoint(int64_t step = 42) {
  Checkpoint c;
  c.model = "mlp";
  c.layers = "[28,28,1] flatten dense(784->3)";
  c.num_params = 5;
  c.step = step;
  c.epoch = 1;
  c.step_in_epoch = 7;
  c.seed = 0xdeadbeefcafeULL;
  c.global_batch = 64;
  c.ranks = 2;
  c.schedule.kind = "exponential";
  c.schedule.base_lr = 0.05f;
  c.schedule.decay_rate = 0.9f;
  c.schedule.decay_steps = 12.5;
  c.schedule.staircase = true;
  c.schedule.warmup_steps = 3;
  c.schedule.global_batch = 64;
  c.schedule.reference_batch = 32;
  c.params = {1.0f, -2.0f, 3.5f, 0.0f, -0.0f};
  c.optimizer = "adam";
  c.optimizer_steps = 17;
  c.optimizer_state = {{0.1f, 0.2f, 0.3f, 0.4f, 0.5f}, {1e-9f, 2e-9f, 3e-9f, 4e-9f, 5e-9f}};
  c.ema_decay = 0.99f;
  c.ema_updates = 16;
  c.ema_shadow = {0.9f, -1.9f, 3.4f, 0.1f, 0.2f};
  return c;
}

// A fresh, empty directory under the system's temporary folder.
struct TempDir {
  fs::path path;
  TempDir() {
    char pattern[] = "/tmp/ringtrain-ckpt-test-XXXXXX";
    path = ::mkdtemp(pattern);
  }
  ~TempDir() { fs::remove_all(path); }
};

std::string decode_error(const std::vector<uint8_t>& bytes) {
  try {
    decode_checkpoint(bytes, "test.rtckpt");
  } catch (const Error& error) {
    CHECK(error.code() == ExitCode::kBadInput);
    return error.what();
  }
  return "(no error)";
}

// Rewrites the trailing checksum so that a deliberately edited payload passes it, to reach the
// checks behind it.
void reseal(std::vector<uint8_t>& bytes) {
  const uint64_t checksum = hash_bytes(bytes.data(), bytes.size() - 8);
  std::memcpy(bytes.data() + bytes.size() - 8, &checksum, 8);
}

}  // namespace

TEST_CASE("checkpoint: every field survives encode and decode bit for bit", "[checkpoint]") {
  const Checkpoint c = sample_checkpoint();
  const Checkpoint d = decode_checkpoint(encode_checkpoint(c), "memory");
  CHECK(d.model == c.model);
  CHECK(d.layers == c.layers);
  CHECK(d.num_params == c.num_params);
  CHECK(d.step == c.step);
  CHECK(d.epoch == c.epoch);
  CHECK(d.step_in_epoch == c.step_in_epoch);
  CHECK(d.seed == c.seed);
  CHECK(d.global_batch == c.global_batch);
  CHECK(d.ranks == c.ranks);
  CHECK(d.schedule.kind == c.schedule.kind);
  CHECK(d.schedule.base_lr == c.schedule.base_lr);
  CHECK(d.schedule.decay_rate == c.schedule.decay_rate);
  CHECK(d.schedule.decay_steps == c.schedule.decay_steps);
  CHECK(d.schedule.staircase == c.schedule.staircase);
  CHECK(d.schedule.warmup_steps == c.schedule.warmup_steps);
  CHECK(d.schedule.global_batch == c.schedule.global_batch);
  CHECK(d.schedule.reference_batch == c.schedule.reference_batch);
  CHECK(std::memcmp(d.params.data(), c.params.data(), c.params.size() * 4) == 0);  // -0.0f too
  CHECK(d.optimizer == c.optimizer);
  CHECK(d.optimizer_steps == c.optimizer_steps);
  CHECK(d.optimizer_state == c.optimizer_state);
  CHECK(d.ema_decay == c.ema_decay);
  CHECK(d.ema_updates == c.ema_updates);
  CHECK(d.ema_shadow == c.ema_shadow);
}

TEST_CASE("checkpoint: a bad file is refused with a message that says what is wrong",
          "[checkpoint]") {
  const std::vector<uint8_t> good = encode_checkpoint(sample_checkpoint());

  SECTION("empty and short files") {
    CHECK_THAT(decode_error({}), Contains("truncated"));
    CHECK_THAT(decode_error(std::vector<uint8_t>(good.begin(), good.begin() + 20)),
               Contains("truncated"));
  }
  SECTION("truncated anywhere") {
    for (size_t keep : {size_t{40}, good.size() / 2, good.size() - 1}) {
      const std::string why = decode_error(std::vector<uint8_t>(good.begin(), good.begin() + keep));
      CHECK_THAT(why, Contains("test.rtckpt"));
      CHECK_THAT(why, Contains("truncated"));
    }
  }
  SECTION("trailing bytes") {
    std::vector<uint8_t> longer = good;
    longer.push_back(0);
    CHECK_THAT(decode_error(longer), Contains("trailing bytes"));
  }
  SECTION("another file type") {
    std::vector<uint8_t> other = good;
    std::memcpy(other.data(), "RTPARAMS", 8);
    CHECK_THAT(decode_error(other), Contains("not a ringtrain checkpoint"));
  }
  SECTION("another format version") {
    std::vector<uint8_t> future = good;
    future[8] = 2;
    CHECK_THAT(decode_error(future), Contains("format version 2"));
  }
  SECTION("one flipped bit anywhere in the payload fails the checksum") {
    for (size_t at : {size_t{24}, size_t{100}, good.size() / 2, good.size() - 9}) {
      std::vector<uint8_t> corrupt = good;
      corrupt[at] ^= 0x10;
      CHECK_THAT(decode_error(corrupt), Contains("checksum mismatch"));
    }
  }
  SECTION("a lying length behind a valid checksum is caught before any allocation") {
    // The model string's length is the first payload field (offset 24).
    std::vector<uint8_t> lying = good;
    const uint64_t huge = uint64_t{1} << 60;
    std::memcpy(lying.data() + 24, &huge, 8);
    reseal(lying);
    CHECK_THAT(decode_error(lying), Contains("runs past the end"));
  }
  SECTION("sizes that disagree with the parameter count") {
    Checkpoint c = sample_checkpoint();
    c.optimizer_state[1].pop_back();
    CHECK_THAT(decode_error(encode_checkpoint(c)), Contains("optimizer buffer holds 4 values"));
    c = sample_checkpoint();
    c.num_params = 6;
    CHECK_THAT(decode_error(encode_checkpoint(c)), Contains("declares 6"));
  }
}

TEST_CASE("checkpoint directory: keeps the newest K, falls back past a corrupt one",
          "[checkpoint]") {
  TempDir temp;
  const CheckpointDir dir((temp.path / "run").string(), /*keep=*/2);
  dir.ensure_writable();
  for (int64_t step : {10, 20, 30}) dir.save(sample_checkpoint(step));
  const std::vector<std::string> files = dir.list();
  REQUIRE(files.size() == 2);
  CHECK(files[0] == dir.path_for(30));
  CHECK(files[1] == dir.path_for(20));
  for (const auto& entry : fs::directory_iterator(temp.path / "run"))
    CHECK(entry.path().extension() == ".rtckpt");  // no temporary files left behind

  std::vector<std::string> skipped;
  auto newest = dir.load_newest_valid(skipped);
  REQUIRE(newest.has_value());
  CHECK(newest->checkpoint.step == 30);
  CHECK(skipped.empty());

  // Corrupt the newest in place: the one before is used, and the reason is reported.
  {
    std::fstream file(dir.path_for(30), std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(200);
    file.put('\x7f');
  }
  newest = dir.load_newest_valid(skipped);
  REQUIRE(newest.has_value());
  CHECK(newest->checkpoint.step == 20);
  REQUIRE(skipped.size() == 1);
  CHECK_THAT(skipped[0], Contains("ckpt-0000000030.rtckpt"));
  CHECK_THAT(skipped[0], Contains("checksum"));

  // A truncated one (a crash while copying) is skipped the same way.
  fs::resize_file(dir.path_for(20), 100);
  skipped.clear();
  CHECK_FALSE(dir.load_newest_valid(skipped).has_value());
  CHECK(skipped.size() == 2);
}

TEST_CASE("checkpoint directory: one that cannot be written is refused naming it", "[checkpoint]") {
  TempDir temp;
  const fs::path file = temp.path / "a-file";
  std::ofstream(file) << "x";
  try {
    CheckpointDir((file / "sub").string()).ensure_writable();
    FAIL("no error for a directory below a file");
  } catch (const Error& error) {
    CHECK(error.code() == ExitCode::kBadInput);
    CHECK_THAT(error.what(), Contains("--checkpoint-dir"));
    CHECK_THAT(error.what(), Contains("a-file"));
  }
  CHECK_THROWS_WITH(CheckpointDir(temp.path.string(), 0), Contains("--keep-checkpoints"));
}

TEST_CASE("configuration check: equal settings pass, a difference is named on every rank",
          "[checkpoint][config]") {
  SECTION("all equal") {
    ThreadWorld world(3);
    std::vector<std::string> errors(3);
    run_ranks(world, [&](Comm& comm) {
      check_config_consistency(comm, {{"model", "mlp"}, {"--batch-size", "32"}});
    });
  }
  SECTION("one rank differs in one field") {
    ThreadWorld world(3);
    std::vector<std::string> errors(3);
    std::vector<int> codes(3, -1);
    run_ranks(world, [&](Comm& comm) {
      const auto r = static_cast<size_t>(comm.rank());
      try {
        check_config_consistency(
            comm, {{"model", "mlp"}, {"--batch-size", comm.rank() == 2 ? "16" : "32"}});
      } catch (const Error& error) {
        errors[r] = error.what();
        codes[r] = static_cast<int>(error.code()) + (error.on_every_rank() ? 100 : 0);
      }
    });
    for (size_t r = 0; r < 3; ++r) {
      CHECK_THAT(errors[r], Contains("--batch-size: rank 0 has '32'; rank 2 has '16'"));
      CHECK_FALSE(errors[r].find("model:") != std::string::npos);
      CHECK(codes[r] == 100 + static_cast<int>(ExitCode::kBadInput));
    }
    CHECK(errors[0] == errors[1]);
    CHECK(errors[1] == errors[2]);
  }
  SECTION("a rank with another list of fields runs another version") {
    ThreadWorld world(2);
    std::vector<std::string> errors(2);
    run_ranks(world, [&](Comm& comm) {
      std::vector<ConfigField> fields = {{"model", "mlp"}};
      if (comm.rank() == 1) fields.push_back({"new-flag", "1"});
      try {
        check_config_consistency(comm, fields);
      } catch (const Error& error) {
        errors[static_cast<size_t>(comm.rank())] = error.what();
      }
    });
    CHECK_THAT(errors[0], Contains("another version"));
    CHECK_THAT(errors[1], Contains("rank(s) 1"));
  }
}

TEST_CASE("progress board: the step, phase and current wait as the watchdog sees them",
          "[watchdog]") {
  ProgressBoard board;
  CHECK(board.snapshot().step == -1);
  CHECK_FALSE(board.snapshot().waiting);
  board.set_step(7);
  {
    const PhaseScope phase(board, "gradient allreduce");
    board.enter_wait("a receive from", 3);
    const auto s = board.snapshot();
    CHECK(s.step == 7);
    CHECK(std::string(s.phase) == "gradient allreduce");
    CHECK(s.waiting);
    CHECK(s.peer == 3);
    CHECK(std::string(s.waiting_on) == "a receive from");
    CHECK(s.waiting_s >= 0.0);
    board.leave_wait();
  }
  const auto after = board.snapshot();
  CHECK_FALSE(after.waiting);
  CHECK(std::string(after.phase) == "starting");  // the scope restored the previous phase
}
