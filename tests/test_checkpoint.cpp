// Checkpoints as files: the round trip of every field, each way a file can be bad (truncated,
// corrupt, another version, trailing bytes, lying lengths, NaN/Inf state), and the directory's
// promises: keep-K rotation that counts and deletes only checkpoints that verify, a name that
// never changes the state it holds, no write through a planted symbolic link (checkpoints,
// --save-params, --metrics-out), the fault points and a writer killed at each of them. Also
// the configuration check and the progress board that the watchdog reads, on thread ranks.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <catch2/catch.hpp>

#include "ringtrain/check.h"
#include "ringtrain/checkpoint.h"
#include "ringtrain/comm.h"
#include "ringtrain/distributed.h"
#include "ringtrain/report.h"
#include "ringtrain/train.h"
#include "support/thread_comm.h"

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
  c.micro_batch = 8;
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

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

std::string read_text(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

void write_bytes(const fs::path& path, const std::vector<uint8_t>& bytes) {
  write_text(path, std::string(bytes.begin(), bytes.end()));
}

// The names in a directory, sorted (dot files included).
std::vector<std::string> names_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) names.push_back(entry.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

// The names in a directory that look like a temporary (".<name>.tmp-XXXXXX").
int temporaries_in(const fs::path& dir) {
  int count = 0;
  for (const std::string& name : names_in(dir))
    count += name.starts_with(".") && name.find(".tmp-") != std::string::npos ? 1 : 0;
  return count;
}

ExitCode code_of(const std::function<void()>& run, std::string& message) {
  try {
    run();
  } catch (const Error& error) {
    message = error.what();
    return error.code();
  }
  message = "(no error)";
  return ExitCode::kOk;
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
  CHECK(d.micro_batch == c.micro_batch);
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

// A version 1 file is a version 2 file without the micro-batch: earlier builds' checkpoints
// still resume, as checkpoints of the default mode.
TEST_CASE("checkpoint: a version 1 file (no micro-batch) is still read", "[checkpoint]") {
  const Checkpoint c = sample_checkpoint();
  std::vector<uint8_t> bytes = encode_checkpoint(c);
  bytes.resize(bytes.size() - sizeof(uint64_t));  // the checksum, recomputed below
  // header, two strings (length + bytes), then seven 8-byte scalars up to and including ranks
  const size_t micro_batch_at = 24 + 8 + c.model.size() + 8 + c.layers.size() + 7 * 8;
  int64_t recorded = 0;
  std::memcpy(&recorded, bytes.data() + micro_batch_at, sizeof(recorded));
  REQUIRE(recorded == c.micro_batch);  // the offset is right
  bytes.erase(bytes.begin() + static_cast<std::ptrdiff_t>(micro_batch_at),
              bytes.begin() + static_cast<std::ptrdiff_t>(micro_batch_at + sizeof(int64_t)));
  const uint32_t version = 1;
  std::memcpy(bytes.data() + 8, &version, sizeof(version));
  const uint64_t payload = bytes.size() - 24;
  std::memcpy(bytes.data() + 16, &payload, sizeof(payload));
  const uint64_t checksum = hash_bytes(bytes.data(), bytes.size());
  const auto* checksum_bytes = reinterpret_cast<const uint8_t*>(&checksum);
  bytes.insert(bytes.end(), checksum_bytes, checksum_bytes + sizeof(checksum));
  const Checkpoint d = decode_checkpoint(bytes, "v1.rtckpt");
  CHECK(d.micro_batch == 0);
  CHECK(d.ranks == c.ranks);
  CHECK(d.schedule.kind == c.schedule.kind);
  CHECK(d.params == c.params);
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
    future[8] = kCheckpointVersion + 1;
    CHECK_THAT(decode_error(future), Contains("format version 3"));
    std::vector<uint8_t> ancient = good;
    ancient[8] = 0;
    CHECK_THAT(decode_error(ancient), Contains("format version 0"));
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

TEST_CASE("checkpoint: NaN or Inf state is never written and never read back", "[checkpoint]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  struct Case {
    const char* buffer;
    std::function<void(Checkpoint&)> poison;
  };
  const std::vector<Case> cases = {
      {"params[3]", [&](Checkpoint& c) { c.params[3] = nan; }},
      {"optimizer_state[1][2]", [&](Checkpoint& c) { c.optimizer_state[1][2] = inf; }},
      {"ema_shadow[4]", [&](Checkpoint& c) { c.ema_shadow[4] = -inf; }},
  };
  for (const Case& bad : cases) {
    Checkpoint c = sample_checkpoint();
    bad.poison(c);
    std::string why;
    CHECK(code_of([&] { encode_checkpoint(c); }, why) == ExitCode::kNonFinite);
    CHECK_THAT(why, Contains(bad.buffer) && Contains("diverged"));

    TempDir temp;
    const CheckpointDir dir(temp.path.string());
    CHECK(code_of([&] { dir.save(c); }, why) == ExitCode::kNonFinite);
    CHECK(names_in(temp.path).empty());  // nothing at all was written, not even a temporary
  }

  // A file holding NaN (behind a valid checksum) is rejected: resume skips it.
  const Checkpoint c = sample_checkpoint();
  std::vector<uint8_t> bytes = encode_checkpoint(c);
  const auto* params = reinterpret_cast<const uint8_t*>(c.params.data());
  const auto at = std::search(bytes.begin(), bytes.end(), params, params + 4 * c.params.size());
  REQUIRE(at != bytes.end());
  std::memcpy(&*at + 4, &nan, sizeof(nan));  // params[1]
  reseal(bytes);
  const std::string why = decode_error(bytes);
  CHECK_THAT(why, Contains("test.rtckpt") && Contains("params[1]") && Contains("diverged"));
}

TEST_CASE("checkpoint directory: rotation counts and deletes only checkpoints that verify",
          "[checkpoint]") {
  TempDir temp;
  const fs::path run = temp.path / "run";
  const CheckpointDir dir(run.string(), /*keep=*/2);
  dir.ensure_writable();
  // Files with checkpoint names that do not verify: newer and older than this run's.
  write_text(dir.path_for(99), "not a checkpoint");
  std::vector<uint8_t> truncated = encode_checkpoint(sample_checkpoint(98));
  truncated.resize(truncated.size() / 2);
  write_bytes(dir.path_for(98), truncated);
  write_bytes(dir.path_for(97), encode_checkpoint(sample_checkpoint(5)));  // holds step 5
  write_text(dir.path_for(1), "damaged");

  for (int64_t step : {10, 20, 30}) dir.save(sample_checkpoint(step));
  CHECK(dir.list() == std::vector<std::string>{dir.path_for(99), dir.path_for(98), dir.path_for(97),
                                               dir.path_for(30), dir.path_for(20),
                                               dir.path_for(1)});
  CHECK(read_text(dir.path_for(99)) == "not a checkpoint");  // left alone, bytes and all
  CHECK(read_text(dir.path_for(1)) == "damaged");

  std::vector<std::string> skipped;
  const auto newest = dir.load_newest_valid(skipped);
  REQUIRE(newest.has_value());
  CHECK(newest->checkpoint.step == 30);
  REQUIRE(skipped.size() == 3);
  CHECK_THAT(skipped[2], Contains("ckpt-0000000097.rtckpt") && Contains("holds step 5"));
}

TEST_CASE("checkpoint directory: a newer valid checkpoint never gets this one deleted",
          "[checkpoint]") {
  TempDir temp;
  const CheckpointDir dir(temp.path.string(), /*keep=*/1);
  write_bytes(dir.path_for(50), encode_checkpoint(sample_checkpoint(50)));  // another run's
  CHECK(dir.save(sample_checkpoint(10)) == dir.path_for(10));
  CHECK(dir.list() == std::vector<std::string>{dir.path_for(50), dir.path_for(10)});
  dir.save(sample_checkpoint(20));
  CHECK(dir.list() == std::vector<std::string>{dir.path_for(50), dir.path_for(20)});
}

TEST_CASE("checkpoint directory: a name never changes the state it holds", "[checkpoint]") {
  TempDir temp;
  const CheckpointDir dir(temp.path.string());
  const std::string path = dir.save(sample_checkpoint(10));
  const std::string written = read_text(path);

  // The same state again (a final checkpoint at a step that already has one): accepted.
  CHECK(dir.save(sample_checkpoint(10)) == path);
  CHECK(read_text(path) == written);
  CHECK(names_in(temp.path) == std::vector<std::string>{"ckpt-0000000010.rtckpt"});

  // Another state for the same step: refused, the file untouched, no temporary left.
  Checkpoint other = sample_checkpoint(10);
  other.params[0] = 7.0f;
  std::string why;
  CHECK(code_of([&] { dir.save(other); }, why) == ExitCode::kBadInput);
  CHECK_THAT(why,
             Contains(path) && Contains("different state for step 10") && Contains("another run"));
  CHECK(read_text(path) == written);
  CHECK(names_in(temp.path) == std::vector<std::string>{"ckpt-0000000010.rtckpt"});

  // A link at the name is not "the same bytes" either, and is not replaced.
  const fs::path outside = temp.path / "outside.txt";
  write_text(outside, "precious");
  fs::create_symlink(outside, dir.path_for(20));
  CHECK(code_of([&] { dir.save(sample_checkpoint(20)); }, why) == ExitCode::kBadInput);
  CHECK(fs::is_symlink(dir.path_for(20)));
  CHECK(read_text(outside) == "precious");
  CHECK(temporaries_in(temp.path) == 0);
}

TEST_CASE(
    "checkpoint directory: later_than lists what a resumed run would collide with, and "
    "set_aside renames it without replacing anything",
    "[checkpoint]") {
  TempDir temp;
  const CheckpointDir dir(temp.path.string());
  dir.save(sample_checkpoint(10));
  write_text(dir.path_for(20), "damaged");
  const fs::path outside = temp.path / "outside.txt";
  write_text(outside, "precious");
  fs::create_symlink(outside, dir.path_for(30));
  fs::create_directory(dir.path_for(40));
  write_text(temp.path / "ckpt-50.rtckpt", "another name for step 50, not ours");
  write_text(dir.path_for(60) + ".damaged", "set aside before");

  CHECK(dir.later_than(10) ==
        std::vector<std::string>{dir.path_for(40), dir.path_for(30), dir.path_for(20)});
  CHECK(dir.later_than(5).size() == 4);
  CHECK(dir.later_than(40).empty());
  CHECK(dir.list() == std::vector<std::string>{dir.path_for(20), dir.path_for(10)});

  CHECK(dir.set_aside(dir.path_for(20)) == dir.path_for(20) + ".damaged");
  CHECK(read_text(dir.path_for(20) + ".damaged") == "damaged");
  CHECK_FALSE(fs::exists(dir.path_for(20)));
  write_text(dir.path_for(20), "damaged again");
  CHECK(dir.set_aside(dir.path_for(20)) == dir.path_for(20) + ".damaged-2");
  CHECK(read_text(dir.path_for(20) + ".damaged") == "damaged");
  CHECK(read_text(dir.path_for(20) + ".damaged-2") == "damaged again");

  // A link is renamed itself; what it points to is not touched.
  CHECK(dir.set_aside(dir.path_for(30)) == dir.path_for(30) + ".damaged");
  CHECK(fs::is_symlink(dir.path_for(30) + ".damaged"));
  CHECK(read_text(outside) == "precious");
  CHECK(dir.list() == std::vector<std::string>{dir.path_for(10)});
  CHECK(dir.later_than(10) == std::vector<std::string>{dir.path_for(40)});
  CHECK_THROWS_WITH(dir.set_aside(dir.path_for(70)), Contains("ckpt-0000000070.rtckpt"));
}

TEST_CASE("checkpoint directory: nothing planted in it is written through or read",
          "[checkpoint]") {
  TempDir temp;
  const fs::path run = temp.path / "run";
  fs::create_directory(run);
  const fs::path outside = temp.path / "outside.txt";
  write_text(outside, "precious");
  const CheckpointDir dir(run.string(), /*keep=*/1);

  // The fixed names the writer once used: links there are not followed.
  fs::create_symlink(outside, run / ".ringtrain-write-probe");
  dir.ensure_writable();
  fs::create_symlink(outside, dir.path_for(10) + ".tmp");
  dir.save(sample_checkpoint(10));
  CHECK(read_text(outside) == "precious");
  CHECK(fs::is_regular_file(fs::symlink_status(dir.path_for(10))));
  CHECK(fs::is_symlink(run / ".ringtrain-write-probe"));
  CHECK(fs::is_symlink(dir.path_for(10) + ".tmp"));

  // A link with a checkpoint name, even to a valid checkpoint, is not a checkpoint here: not
  // listed, not loaded, not deleted by rotation.
  const fs::path elsewhere = temp.path / "elsewhere.rtckpt";
  write_bytes(elsewhere, encode_checkpoint(sample_checkpoint(50)));
  fs::create_symlink(elsewhere, dir.path_for(50));
  CHECK(dir.list() == std::vector<std::string>{dir.path_for(10)});
  std::vector<std::string> skipped;
  const auto newest = dir.load_newest_valid(skipped);
  REQUIRE(newest.has_value());
  CHECK(newest->checkpoint.step == 10);
  dir.save(sample_checkpoint(60));
  CHECK(dir.list() == std::vector<std::string>{dir.path_for(60)});
  CHECK(fs::is_symlink(dir.path_for(50)));
  CHECK(fs::exists(elsewhere));
  CHECK(temporaries_in(run) == 0);
}

TEST_CASE("the parameter file and the metrics file never write through a planted link",
          "[checkpoint]") {
  TempDir temp;
  const fs::path outside = temp.path / "outside.txt";
  write_text(outside, "precious");
  const std::vector<float> values = {1.0f, -2.0f, 3.0f};

  const fs::path params = temp.path / "params.bin";
  fs::create_symlink(outside, params.string() + ".tmp");  // the old fixed temporary name
  save_params(params.string(), values);
  CHECK(load_params(params.string()) == values);
  CHECK(read_text(outside) == "precious");

  // A link at the target itself is replaced by the file, not written through.
  const fs::path linked = temp.path / "linked.bin";
  fs::create_symlink(outside, linked);
  save_params(linked.string(), values);
  CHECK(fs::is_regular_file(fs::symlink_status(linked)));
  CHECK(load_params(linked.string()) == values);
  CHECK(read_text(outside) == "precious");
  CHECK(temporaries_in(temp.path) == 0);

  const fs::path metrics = temp.path / "metrics.jsonl";
  fs::create_symlink(outside, metrics);
  for (bool append : {false, true}) {
    std::string why;
    CHECK(code_of([&] { MetricsWriter writer(metrics.string(), append); }, why) ==
          ExitCode::kBadInput);
    CHECK_THAT(
        why, Contains("--metrics-out") && Contains(metrics.string()) && Contains("symbolic link"));
  }
  CHECK(read_text(outside) == "precious");
  // A regular file is still truncated, or appended to.
  const fs::path real = temp.path / "real.jsonl";
  write_text(real, "old\n");
  { MetricsWriter(real.string()).write("a", {{"step", int64_t{1}}}); }
  { MetricsWriter(real.string(), /*append=*/true).write("b", {}); }
  CHECK(read_text(real) == "{\"event\":\"a\",\"step\":1}\n{\"event\":\"b\"}\n");
}

TEST_CASE("checkpoint directory: remove_stale_temporaries clears only its own leftovers",
          "[checkpoint]") {
  TempDir temp;
  const CheckpointDir dir(temp.path.string());
  dir.save(sample_checkpoint(10));
  const fs::path outside = temp.path / "outside.txt";
  write_text(outside, "precious");
  write_text(temp.path / ".ckpt-0000000020.rtckpt.tmp-Ab3xQ9", "half a checkpoint");
  fs::create_symlink(outside, temp.path / ".ckpt-0000000030.rtckpt.tmp-ZZZZZZ");
  write_text(temp.path / ".ringtrain-write-probe.tmp-abc123", "ok");
  const std::vector<std::string> others = {
      ".ckpt-10.rtckpt.tmp-abcdef",       // not a name this code gives a checkpoint
      ".ckpt-0000000020.rtckpt.tmp-abc",  // not six characters
      ".notes.tmp-abcdef",                // someone else's
      "ckpt-0000000040.rtckpt.tmp"};      // not the unique-name pattern
  for (const std::string& name : others) write_text(temp.path / name, "keep me");

  CHECK(dir.remove_stale_temporaries() ==
        std::vector<std::string>{(temp.path / ".ckpt-0000000020.rtckpt.tmp-Ab3xQ9").string(),
                                 (temp.path / ".ckpt-0000000030.rtckpt.tmp-ZZZZZZ").string(),
                                 (temp.path / ".ringtrain-write-probe.tmp-abc123").string()});
  CHECK(read_text(outside) == "precious");
  std::vector<std::string> expected = others;
  expected.push_back("ckpt-0000000010.rtckpt");
  expected.push_back("outside.txt");
  std::sort(expected.begin(), expected.end());
  CHECK(names_in(temp.path) == expected);
  CHECK(dir.remove_stale_temporaries().empty());
}

TEST_CASE("checkpoint directory: the fault points and the progress calls", "[checkpoint]") {
  TempDir temp;
  CheckpointDir dir(temp.path.string(), /*keep=*/1);
  std::vector<std::string> points;
  int chunks = 0;
  dir.set_fault_hook([&](const char* point) { points.emplace_back(point); });
  dir.set_progress([&] { ++chunks; });

  dir.save(sample_checkpoint(10));
  CHECK(points == std::vector<std::string>{"partial", "written", "placed"});
  CHECK(chunks >= 2);  // each half is at least one chunk
  points.clear();
  dir.save(sample_checkpoint(20));
  CHECK(points == std::vector<std::string>{"partial", "written", "placed", "rotating"});
  points.clear();
  dir.save(sample_checkpoint(20));  // the same bytes: nothing placed, nothing deleted
  CHECK(points == std::vector<std::string>{"partial", "written"});

  // A large write reports every chunk (16 MiB): 36 MB is at least three.
  Checkpoint big = sample_checkpoint(30);
  big.num_params = 9'000'000;
  big.params.assign(static_cast<size_t>(big.num_params), 0.5f);
  big.optimizer_state.clear();
  big.ema_shadow.clear();
  chunks = 0;
  dir.save(big);
  CHECK(chunks >= 3);

  // A hook that throws (a failure at that point) leaves no temporary and no checkpoint.
  for (const char* fail_at : {"partial", "written"}) {
    dir.set_fault_hook([&](const char* point) {
      if (std::strcmp(point, fail_at) == 0) throw Error("injected", ExitCode::kError);
    });
    CHECK_THROWS_WITH(dir.save(sample_checkpoint(40)), "injected");
    CHECK_FALSE(fs::exists(fs::symlink_status(dir.path_for(40))));
    CHECK(temporaries_in(temp.path) == 0);
  }
}

TEST_CASE("checkpoint directory: a writer killed at any fault point leaves a usable directory",
          "[checkpoint]") {
  for (const std::string point : {"partial", "written", "placed", "rotating"}) {
    INFO("killed at " << point);
    TempDir temp;
    CheckpointDir dir(temp.path.string(), /*keep=*/2);
    dir.save(sample_checkpoint(10));
    dir.save(sample_checkpoint(20));
    std::fflush(nullptr);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      dir.set_fault_hook([&](const char* at) {
        if (point == at) ::raise(SIGKILL);
      });
      try {
        dir.save(sample_checkpoint(30));
      } catch (...) {
        ::_exit(4);
      }
      ::_exit(3);  // the point was never reached
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    REQUIRE(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == SIGKILL);

    const bool placed = point == "placed" || point == "rotating";
    std::vector<std::string> skipped;
    const auto newest = dir.load_newest_valid(skipped);
    REQUIRE(newest.has_value());
    CHECK(newest->checkpoint.step == (placed ? 30 : 20));
    CHECK(skipped.empty());
    CHECK(dir.list().size() == (point == "placed" ? 3u : 2u));
    CHECK(dir.remove_stale_temporaries().size() == (placed ? 0u : 1u));
    CHECK(temporaries_in(temp.path) == 0);

    // The next run continues: its next checkpoint rotates as usual.
    dir.save(sample_checkpoint(40));
    CHECK(dir.list() == std::vector<std::string>{dir.path_for(40), dir.path_for(placed ? 30 : 20)});
  }
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
