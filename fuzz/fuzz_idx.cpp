// libFuzzer target for the IDX reader (src/idx.cpp): decode_maybe_gz and parse_idx, the
// in-memory code that load_idx and read_maybe_gz run on every data file (plain or gzip
// detection, chunked inflation with its caps and concatenated members, the image header, the
// label header, the payload sizes, the image/label cross-checks, the label range).
//
// Input layout (fuzz/make_seeds.cpp writes its seeds in it):
//   byte 0      mode; mode % 4 selects what runs:
//                 0, 1  an image/label pair through decode_maybe_gz and parse_idx
//                 2     one blob through decode_maybe_gz alone, with a small cap
//                 3     a pair as 0, with num_classes = byte 1 + (byte 0 >> 7), so 0..256
//               and the other bits say what the harness gzips itself before decoding (mutated
//               gzip data nearly always fails its CRC, so this is what reaches the inflation
//               loop's edges with valid streams of any length):
//                 bit 2  the image file (pair) or the blob (blob)
//                 bit 3  the label file (pair)
//                 bits 4-5  blob: the number of gzip members - 1 (the content split evenly)
//                 bits 6-7  blob: the compression level, 0 (stored blocks), 1, 6 or 9
//   byte 1      aux: the cap in mode 2 (64 * aux bytes; 0 means 1 MiB), num_classes in mode 3
//   bytes 2-5   L, little-endian (modes 0, 1, 3): the image file's length, clamped to what is
//               there; then the image file (L bytes) and the label file (the rest). In mode 2
//               the blob starts at byte 2.
//
// Expected rejections are ringtrain::Error; each must name the file it is about. Anything else
// is a finding: another exception type (uncaught, so libFuzzer reports it), a sanitizer
// report, a huge allocation (-malloc_limit_mb), or a data set that passed the checks but
// breaks the invariants load_idx promises (checked below, reported by __builtin_trap).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include <zlib.h>

#include "ringtrain/check.h"
#include "ringtrain/data.h"

namespace {

const std::string kImages = "fuzz-images";
const std::string kLabels = "fuzz-labels";
// Larger than any inflation a fuzzer-sized input can produce (deflate's ratio is ~1000:1), so
// only the small caps of mode 2 are ever reached.
constexpr uint64_t kPairCap = uint64_t{64} << 20;

[[noreturn]] void finding(const char* what) {
  std::fprintf(stderr, "fuzz_idx: invariant broken: %s\n", what);
  std::fflush(stderr);
  __builtin_trap();
}

void expect(bool ok, const char* what) {
  if (!ok) finding(what);
}

// `plain` as `members` concatenated gzip members (split evenly), at compression `level`.
std::vector<uint8_t> gzip(std::span<const uint8_t> plain, int members, int level) {
  std::vector<uint8_t> out;
  size_t at = 0;
  for (int m = 0; m < members; ++m) {
    const size_t end = plain.size() * static_cast<size_t>(m + 1) / static_cast<size_t>(members);
    z_stream zs{};
    if (deflateInit2(&zs, level, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK)
      finding("deflateInit2 failed (harness)");
    std::vector<uint8_t> member(deflateBound(&zs, static_cast<uLong>(end - at)) + 64);
    zs.next_in = const_cast<Bytef*>(plain.data() + at);
    zs.avail_in = static_cast<uInt>(end - at);
    zs.next_out = member.data();
    zs.avail_out = static_cast<uInt>(member.size());
    if (deflate(&zs, Z_FINISH) != Z_STREAM_END) finding("deflate failed (harness)");
    out.insert(out.end(), member.begin(), member.begin() + static_cast<ptrdiff_t>(zs.total_out));
    deflateEnd(&zs);
    at = end;
  }
  return out;
}

bool names(const ringtrain::Error& e, const std::string& source) {
  return std::string(e.what()).find(source) != std::string::npos;
}

void check_dataset(const ringtrain::Dataset& d, std::span<const uint8_t> images,
                   std::span<const uint8_t> labels, int num_classes) {
  expect(d.count >= 1 && d.rows >= 1 && d.cols >= 1, "non-positive count or image side");
  expect(d.rows * d.cols <= (int64_t{1} << 20), "image larger than 2^20 pixels accepted");
  expect(d.images.size() == static_cast<uint64_t>(d.count * d.image_size()),
         "images.size() != count * rows * cols");
  expect(d.labels.size() == static_cast<uint64_t>(d.count), "labels.size() != count");
  expect(images.size() == 16 + d.images.size() &&
             std::equal(d.images.begin(), d.images.end(), images.begin() + 16),
         "images are not the file's pixels");
  expect(labels.size() == 8 + d.labels.size() &&
             std::equal(d.labels.begin(), d.labels.end(), labels.begin() + 8),
         "labels are not the file's labels");
  for (uint8_t label : d.labels) expect(label < num_classes, "label >= num_classes accepted");
}

void fuzz_pair(std::span<const uint8_t> rest, int num_classes, bool gzip_images,
               bool gzip_labels) {
  if (rest.size() < 4) return;
  uint64_t length = uint64_t{rest[0]} | uint64_t{rest[1]} << 8 | uint64_t{rest[2]} << 16 |
                    uint64_t{rest[3]} << 24;
  rest = rest.subspan(4);
  length = std::min<uint64_t>(length, rest.size());
  std::span<const uint8_t> image_file = rest.first(static_cast<size_t>(length));
  std::span<const uint8_t> label_file = rest.subspan(static_cast<size_t>(length));
  std::vector<uint8_t> image_gz, label_gz;
  if (gzip_images) image_file = image_gz = gzip(image_file, 1, 6);
  if (gzip_labels) label_file = label_gz = gzip(label_file, 1, 6);

  std::vector<uint8_t> images, labels;
  try {
    images = ringtrain::decode_maybe_gz(image_file, kImages, kPairCap);
  } catch (const ringtrain::Error& e) {
    expect(!gzip_images, "a gzip stream made by zlib was rejected");
    expect(names(e, kImages), "gzip error does not name the image file");
    return;
  }
  try {
    labels = ringtrain::decode_maybe_gz(label_file, kLabels, kPairCap);
  } catch (const ringtrain::Error& e) {
    expect(!gzip_labels, "a gzip stream made by zlib was rejected");
    expect(names(e, kLabels), "gzip error does not name the label file");
    return;
  }
  try {
    ringtrain::Dataset d = ringtrain::parse_idx(images, labels, kImages, kLabels, num_classes);
    expect(num_classes >= 1 && num_classes <= 256, "num_classes outside [1, 256] accepted");
    check_dataset(d, images, labels, num_classes);
  } catch (const ringtrain::Error& e) {
    if (num_classes >= 1 && num_classes <= 256) {
      expect(names(e, kImages) || names(e, kLabels), "IDX error names neither file");
    }
  }
}

void fuzz_blob(std::span<const uint8_t> blob, uint8_t mode, uint8_t aux) {
  const uint64_t cap = aux == 0 ? uint64_t{1} << 20 : uint64_t{64} * aux;
  const bool harness_gzip = (mode & 4) != 0;
  std::vector<uint8_t> gz;
  if (harness_gzip) {
    constexpr int kLevels[4] = {0, 1, 6, 9};
    gz = gzip(blob, 1 + ((mode >> 4) & 3), kLevels[(mode >> 6) & 3]);
  }
  const std::span<const uint8_t> input = harness_gzip ? std::span<const uint8_t>(gz) : blob;
  try {
    std::vector<uint8_t> out = ringtrain::decode_maybe_gz(input, "fuzz-blob", cap);
    expect(out.size() <= cap, "decode_maybe_gz returned more than max_bytes");
    const bool gz_magic = input.size() >= 2 && input[0] == 0x1f && input[1] == 0x8b;
    // What zlib compressed (or plain bytes) must come back as they were.
    if (harness_gzip || !gz_magic) {
      expect(std::equal(out.begin(), out.end(), blob.begin(), blob.end()),
             "decoded bytes differ from the original");
    }
  } catch (const ringtrain::Error& e) {
    expect(names(e, "fuzz-blob"), "gzip error does not name the blob");
    // A stream zlib made can only be refused for its size.
    if (harness_gzip || !(input.size() >= 2 && input[0] == 0x1f && input[1] == 0x8b)) {
      expect(blob.size() > cap, "valid content within the cap was rejected");
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint8_t mode = data[0];
  const uint8_t aux = data[1];
  std::span<const uint8_t> rest(data + 2, size - 2);
  const bool gzip_images = (mode & 4) != 0, gzip_labels = (mode & 8) != 0;
  switch (mode % 4) {
    case 2:
      fuzz_blob(rest, mode, aux);
      break;
    case 3:
      fuzz_pair(rest, static_cast<int>(aux) + (mode >> 7), gzip_images, gzip_labels);
      break;
    default:
      fuzz_pair(rest, 10, gzip_images, gzip_labels);
      break;
  }
  return 0;
}
