// libFuzzer target for the checkpoint decoder: decode_checkpoint (src/checkpoint.cpp).
//
// A checkpoint ends in a checksum over everything before it, so mutated files almost all stop
// there. Two of the three modes therefore repair the file before decoding it, which takes the
// fuzzer past the checksum into the field parser and the consistency checks:
//   byte 0 % 3 == 0   the rest of the input is the whole file, decoded as it is
//   byte 0 % 3 == 1   the rest is header + payload: the harness writes the payload length
//                     (bytes 16-23) to match and appends the correct checksum
//   byte 0 % 3 == 2   the rest is the payload alone: the harness prepends a valid header
//                     (magic, version, reserved, length) and appends the checksum
//
// Expected rejections are ringtrain::Error naming the source. Anything else is a finding:
// another exception type (uncaught: libFuzzer reports it), a sanitizer report, a huge
// allocation (-malloc_limit_mb), or a checkpoint that decodes but breaks what the decoder
// promises: sizes that agree with num_params, no negative counts, and a re-encoding that
// decodes again to the same bytes (checked below, reported by __builtin_trap).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "ringtrain/check.h"
#include "ringtrain/checkpoint.h"
#include "ringtrain/comm.h"

namespace {

const std::string kSource = "fuzz-checkpoint";
constexpr size_t kHeaderBytes = 24;
constexpr char kMagic[8] = {'R', 'T', 'C', 'K', 'P', 'T', '\r', '\n'};

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "fuzz_checkpoint: invariant broken: %s\n", what);
  std::fflush(stderr);
  __builtin_trap();
}

void expect(bool ok, const char* what) {
  if (!ok) finding(what);
}

void append_checksum(std::vector<uint8_t>& file) {
  const uint64_t checksum = ringtrain::hash_bytes(file.data(), file.size());
  uint8_t raw[8];
  std::memcpy(raw, &checksum, sizeof(raw));
  file.insert(file.end(), raw, raw + sizeof(raw));
}

void patch_payload_length(std::vector<uint8_t>& file) {
  const uint64_t payload = file.size() - kHeaderBytes;
  std::memcpy(file.data() + 16, &payload, sizeof(payload));
}

void check_decoded(const ringtrain::Checkpoint& c) {
  expect(c.num_params >= 0, "negative num_params accepted");
  const auto n = static_cast<uint64_t>(c.num_params);
  expect(c.params.size() == n, "params.size() != num_params");
  for (const auto& buffer : c.optimizer_state)
    expect(buffer.size() == n, "optimizer buffer size != num_params");
  expect(c.ema_shadow.empty() || c.ema_shadow.size() == n, "EMA shadow size != num_params");
  expect(c.step >= 0 && c.epoch >= 0 && c.step_in_epoch >= 0 && c.global_batch > 0 &&
             c.ranks > 0 && c.optimizer_steps >= 0 && c.ema_updates >= 0,
         "negative count accepted");
  // What was decoded must encode to a file that decodes again, to the same bytes.
  const std::vector<uint8_t> once = ringtrain::encode_checkpoint(c);
  ringtrain::Checkpoint again;
  try {
    again = ringtrain::decode_checkpoint(once, "re-encoded");
  } catch (const ringtrain::Error&) {
    finding("a decoded checkpoint re-encodes to a file that does not decode");
  }
  expect(ringtrain::encode_checkpoint(again) == once, "encode/decode round trip differs");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int mode = data[0] % 3;
  std::vector<uint8_t> file;
  if (mode == 2) {
    file.insert(file.end(), std::begin(kMagic), std::end(kMagic));
    const uint32_t version = ringtrain::kCheckpointVersion, reserved = 0;
    const uint64_t length = 0;  // patched below
    const auto* v = reinterpret_cast<const uint8_t*>(&version);
    const auto* r = reinterpret_cast<const uint8_t*>(&reserved);
    const auto* l = reinterpret_cast<const uint8_t*>(&length);
    file.insert(file.end(), v, v + 4);
    file.insert(file.end(), r, r + 4);
    file.insert(file.end(), l, l + 8);
  }
  file.insert(file.end(), data + 1, data + size);
  if (mode != 0) {
    if (file.size() >= kHeaderBytes) patch_payload_length(file);
    append_checksum(file);
  }
  try {
    const ringtrain::Checkpoint c = ringtrain::decode_checkpoint(file, kSource);
    check_decoded(c);
  } catch (const ringtrain::Error& e) {
    expect(std::string(e.what()).find(kSource) != std::string::npos,
           "checkpoint error does not name the source");
  }
  return 0;
}
