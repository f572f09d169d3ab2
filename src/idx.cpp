// Reading IDX data sets (MNIST, Fashion-MNIST) from disk, plain or gzipped.
//
// The one idea: nothing is ever sized from what a file *claims*. Bytes are read (or inflated)
// in chunks and the buffer grows only by what actually arrived, capped at a fixed bound; only
// then is the IDX header compared with the real byte count. A header that lies, a truncated
// download or a gzip bomb therefore ends in an error naming the file, never in a huge
// allocation, a crash or a partially loaded data set.
//
// The parsing itself works on bytes in memory (decode_maybe_gz, parse_idx), so the fuzzers in
// fuzz/ drive the same code that load_idx runs on files.
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <system_error>

#include <zlib.h>

#include "ringtrain/check.h"
#include "ringtrain/data.h"

namespace ringtrain {

namespace {

constexpr const char* kFetchHint =
    "download the MNIST files with scripts/download_mnist.sh or pass --data-dir";
// All of MNIST is 55 MB uncompressed; a GiB leaves room for bigger IDX sets while a bogus
// file still cannot take the machine's memory.
constexpr uint64_t kMaxIdxBytes = uint64_t{1} << 30;
constexpr size_t kChunk = size_t{1} << 16;
constexpr uint64_t kMaxImageSize = uint64_t{1} << 20;

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

std::string errno_text(int err) {
  return std::error_code(err, std::generic_category()).message();
}

// Grows `out` so that at least one more byte fits, doubling (amortised O(1) per byte) but
// never past `cap`. Returns false when `out` is already at the cap.
bool grow(std::vector<uint8_t>& out, uint64_t cap) {
  if (out.size() >= cap) return false;
  uint64_t want = std::max<uint64_t>(kChunk, 2 * static_cast<uint64_t>(out.size()));
  out.resize(static_cast<size_t>(std::min(want, cap)));
  return true;
}

// Reads the rest of a plain file after the `head` bytes already read into `out`.
void read_plain(std::FILE* f, const std::string& path, uint64_t max_bytes, size_t head,
                std::vector<uint8_t>& out) {
  // The size on disk is a fact (not a claim), so it may size the buffer; the loop below still
  // trusts only what fread returns, since the file can change under us.
  uint64_t cap = max_bytes == UINT64_MAX ? max_bytes : max_bytes + 1;
  struct stat st {};
  if (fstat(fileno(f), &st) == 0 && st.st_size > 0) {
    uint64_t on_disk = static_cast<uint64_t>(st.st_size);
    RINGTRAIN_CHECK(on_disk <= max_bytes, "{} is {} bytes, more than the {} accepted", path,
                    on_disk, max_bytes);
    // One byte more than the file so that reaching end-of-file needs no further growth.
    out.resize(std::max<size_t>(head, static_cast<size_t>(std::min(on_disk + 1, cap))));
  }
  size_t used = head;
  for (;;) {
    if (used == out.size() && !grow(out, cap)) break;
    size_t n = std::fread(out.data() + used, 1, out.size() - used, f);
    used += n;
    if (n == 0) break;
  }
  RINGTRAIN_CHECK(!std::ferror(f), "error reading {}: {}", path, errno_text(errno));
  RINGTRAIN_CHECK(used <= max_bytes, "{} holds more than the {} bytes accepted", path, max_bytes);
  out.resize(used);
}

// Inflates a gzip stream whose first `head` bytes are already in `in`; refill(dst, capacity)
// supplies the next compressed bytes (0 at the end; it throws on a read error). Concatenated
// gzip members (what `cat a.gz b.gz` makes) are read one after the other, as gunzip does.
template <typename Refill>
std::vector<uint8_t> inflate_gzip(Refill&& refill, const std::string& path, uint64_t max_bytes,
                                  std::vector<uint8_t> in, size_t head) {
  z_stream zs{};
  // 15 + 32: the largest window, and let zlib parse the gzip header itself.
  RINGTRAIN_CHECK(inflateInit2(&zs, 15 + 32) == Z_OK, "zlib cannot start inflating {}: {}", path,
                  zs.msg ? zs.msg : "out of memory");
  std::unique_ptr<z_stream, int (*)(z_stream*)> guard(&zs, inflateEnd);

  std::vector<uint8_t> out;
  uint64_t cap = max_bytes == UINT64_MAX ? max_bytes : max_bytes + 1;
  size_t produced = 0;
  uint64_t consumed = 0;  // compressed bytes handed to zlib, for the error messages
  bool member_ended = false;
  zs.next_in = in.data();
  zs.avail_in = static_cast<uInt>(head);
  for (;;) {
    if (zs.avail_in == 0) {
      size_t n = refill(in.data(), in.size());
      if (n == 0) break;
      zs.next_in = in.data();
      zs.avail_in = static_cast<uInt>(n);
    }
    if (member_ended) {
      // More bytes after a complete member: they must be another gzip member.
      RINGTRAIN_CHECK(inflateReset(&zs) == Z_OK, "zlib cannot restart on {}", path);
      member_ended = false;
    }
    if (produced == out.size()) {
      RINGTRAIN_CHECK(grow(out, cap), "{} inflates to more than the {} bytes accepted", path,
                      max_bytes);
    }
    zs.next_out = out.data() + produced;
    zs.avail_out = static_cast<uInt>(std::min<size_t>(out.size() - produced, UINT32_MAX));
    uInt in_before = zs.avail_in;
    int ret = inflate(&zs, Z_NO_FLUSH);
    consumed += in_before - zs.avail_in;
    produced = static_cast<size_t>(zs.next_out - out.data());
    RINGTRAIN_CHECK(produced <= max_bytes, "{} inflates to more than the {} bytes accepted", path,
                    max_bytes);
    if (ret == Z_STREAM_END) {
      member_ended = true;
    } else if (ret != Z_OK && ret != Z_BUF_ERROR) {
      // Z_BUF_ERROR only means "no progress this call": the loop refills input or grows the
      // output. Anything else is a damaged stream.
      RINGTRAIN_FAIL(
          "{} is not a valid gzip file: zlib says '{}' after {} compressed bytes (a corrupt "
          "or partial download?); delete it and {}",
          path, zs.msg ? zs.msg : zError(ret), consumed, kFetchHint);
    }
  }
  RINGTRAIN_CHECK(member_ended,
                  "{} is truncated: its gzip stream ends early, after {} compressed bytes ({} "
                  "inflated); delete it and {}",
                  path, consumed, produced, kFetchHint);
  out.resize(produced);
  return out;
}

bool is_gzip(std::span<const uint8_t> head) {
  return head.size() >= 2 && head[0] == 0x1f && head[1] == 0x8b;
}

// Checks the magic number of one IDX file's bytes: `magic` is 0x00000800 | ndims for unsigned
// bytes. `dims` receives the header's dimensions.
void check_idx_header(std::span<const uint8_t> bytes, const std::string& path, uint32_t magic,
                      uint32_t* dims) {
  const int ndims = static_cast<int>(magic & 0xff);
  const size_t header = 4 + 4 * static_cast<size_t>(ndims);
  const char* kind = ndims == 3 ? "image" : "label";
  RINGTRAIN_CHECK(bytes.size() >= 4, "{} holds {} bytes, too few for an IDX {} file; {}", path,
                  bytes.size(), kind, kFetchHint);
  auto be32 = [&](size_t at) {
    return (static_cast<uint32_t>(bytes[at]) << 24) | (static_cast<uint32_t>(bytes[at + 1]) << 16) |
           (static_cast<uint32_t>(bytes[at + 2]) << 8) | static_cast<uint32_t>(bytes[at + 3]);
  };
  const uint32_t found = be32(0);
  if (found != magic) {
    std::string guess;
    if (found == 0x00000801 || found == 0x00000803) {
      guess = fmt::format(
          "; this looks like an IDX {} file: are the image and label paths "
          "swapped?",
          found == 0x00000801 ? "label" : "image");
    } else if ((found >> 16) != 0) {
      guess = "; this is not an IDX file at all";
    } else if (((found >> 8) & 0xff) != 0x08) {
      guess =
          fmt::format("; its data type 0x{:02x} is not unsigned byte (0x08)", (found >> 8) & 0xff);
    }
    RINGTRAIN_FAIL("{}: wrong magic number 0x{:08x}, expected 0x{:08x} (an IDX {} file){}; {}",
                   path, found, magic, kind, guess, kFetchHint);
  }
  RINGTRAIN_CHECK(bytes.size() >= header,
                  "{} is shorter than its IDX header: {} bytes, the header alone is {}; {}", path,
                  bytes.size(), header, kFetchHint);
  for (int i = 0; i < ndims; ++i) dims[i] = be32(4 + 4 * static_cast<size_t>(i));
}

// Compares the payload a header claims with what the file holds.
void check_payload(const std::string& path, const char* what, uint64_t count, uint64_t bytes_each,
                   uint64_t header, uint64_t actual) {
  const uint64_t claimed = count * bytes_each;  // <= 2^32 * 2^20: cannot overflow
  const uint64_t held = actual - header;
  RINGTRAIN_CHECK(held >= claimed,
                  "{} is truncated: its header claims {} {} = {} bytes after the header, but the "
                  "file holds {}; delete it and {}",
                  path, count, what, claimed, held, kFetchHint);
  RINGTRAIN_CHECK(held == claimed,
                  "{} has trailing data: its header claims {} {} = {} bytes after the header, "
                  "but the file holds {} ({} more), so it is not a clean IDX file; {}",
                  path, count, what, claimed, held, held - claimed, kFetchHint);
}

struct ImageHeader {
  uint64_t count = 0, rows = 0, cols = 0;
};

void check_num_classes(int num_classes) {
  RINGTRAIN_CHECK(num_classes >= 1 && num_classes <= 256,
                  "num_classes must be in [1, 256] for byte labels, got {}", num_classes);
}

// The image file: magic, 3 dimensions, a plausible image size, exactly the pixels it claims.
ImageHeader check_images(std::span<const uint8_t> bytes, const std::string& path) {
  uint32_t dims[3] = {};
  check_idx_header(bytes, path, 0x00000803, dims);
  const uint64_t count = dims[0], rows = dims[1], cols = dims[2];
  RINGTRAIN_CHECK(count > 0, "{}: its header says it holds 0 images; {}", path, kFetchHint);
  // Each side is below 2^32, so rows * cols cannot overflow 64 bits.
  RINGTRAIN_CHECK(rows > 0 && cols > 0 && rows * cols <= kMaxImageSize,
                  "{}: its header gives the image size {}x{}, which is not a plausible image "
                  "(each side > 0, at most {} pixels); {}",
                  path, rows, cols, kMaxImageSize, kFetchHint);
  check_payload(path, "images", count, rows * cols, 16, bytes.size());
  return {count, rows, cols};
}

// The label file: magic, 1 dimension, exactly the labels it claims, as many as there are
// images, each below num_classes.
void check_labels(std::span<const uint8_t> bytes, const std::string& path, uint64_t count,
                  const std::string& images_path, int num_classes) {
  uint32_t dims[1] = {};
  check_idx_header(bytes, path, 0x00000801, dims);
  check_payload(path, "labels", dims[0], 1, 8, bytes.size());
  RINGTRAIN_CHECK(dims[0] == count,
                  "image/label count mismatch: {} holds {} images but {} holds {} labels; the "
                  "two files are not a pair, {}",
                  images_path, count, path, dims[0], kFetchHint);
  for (size_t i = 8; i < bytes.size(); ++i) {
    RINGTRAIN_CHECK(bytes[i] < num_classes,
                    "{}: label {} at index {} is out of range (>= num_classes = {})", path,
                    bytes[i], i - 8, num_classes);
  }
}

// Exact-size copies of the checked files' contents (read buffers grew by doubling and may be
// twice as large).
Dataset make_dataset(std::span<const uint8_t> image_bytes, std::span<const uint8_t> label_bytes,
                     const ImageHeader& h) {
  Dataset d;
  d.images.assign(image_bytes.begin() + 16, image_bytes.end());
  d.labels.assign(label_bytes.begin() + 8, label_bytes.end());
  d.count = static_cast<int64_t>(h.count);
  d.rows = static_cast<int64_t>(h.rows);
  d.cols = static_cast<int64_t>(h.cols);
  return d;
}

}  // namespace

std::vector<uint8_t> read_maybe_gz(const std::string& path, uint64_t max_bytes) {
  File f(std::fopen(path.c_str(), "rb"));
  if (!f) {
    RINGTRAIN_FAIL("cannot open {}: {} (check the path; {})", path, errno_text(errno), kFetchHint);
  }
  // The first bytes decide: gzip files start with 1f 8b, whatever they are called.
  std::vector<uint8_t> head(kChunk);
  size_t n = std::fread(head.data(), 1, head.size(), f.get());
  RINGTRAIN_CHECK(!std::ferror(f.get()), "error reading {}: {}", path, errno_text(errno));
  if (is_gzip(std::span<const uint8_t>(head.data(), n))) {
    auto refill = [&](uint8_t* dst, size_t capacity) {
      size_t got = std::fread(dst, 1, capacity, f.get());
      RINGTRAIN_CHECK(!std::ferror(f.get()), "error reading {}: {}", path, errno_text(errno));
      return got;
    };
    return inflate_gzip(refill, path, max_bytes, std::move(head), n);
  }
  head.resize(n);
  read_plain(f.get(), path, max_bytes, n, head);
  return head;
}

std::vector<uint8_t> decode_maybe_gz(std::span<const uint8_t> bytes, const std::string& source,
                                     uint64_t max_bytes) {
  if (is_gzip(bytes)) {
    // The same chunked inflation as for a file, fed from memory.
    std::vector<uint8_t> head(kChunk);
    size_t offset = 0;
    auto refill = [&](uint8_t* dst, size_t capacity) {
      size_t got = std::min(capacity, bytes.size() - offset);
      std::copy_n(bytes.begin() + static_cast<std::ptrdiff_t>(offset), got, dst);
      offset += got;
      return got;
    };
    size_t n = refill(head.data(), head.size());
    return inflate_gzip(refill, source, max_bytes, std::move(head), n);
  }
  RINGTRAIN_CHECK(bytes.size() <= max_bytes, "{} is {} bytes, more than the {} accepted", source,
                  bytes.size(), max_bytes);
  return std::vector<uint8_t>(bytes.begin(), bytes.end());
}

Dataset parse_idx(std::span<const uint8_t> image_bytes, std::span<const uint8_t> label_bytes,
                  const std::string& images_source, const std::string& labels_source,
                  int num_classes) {
  check_num_classes(num_classes);
  const ImageHeader h = check_images(image_bytes, images_source);
  check_labels(label_bytes, labels_source, h.count, images_source, num_classes);
  return make_dataset(image_bytes, label_bytes, h);
}

Dataset load_idx(const std::string& images_path, const std::string& labels_path, int num_classes) {
  // parse_idx's steps, with each file read just before it is checked: a bad image file is
  // reported without reading the labels.
  check_num_classes(num_classes);
  const std::vector<uint8_t> ibytes = read_maybe_gz(images_path, kMaxIdxBytes);
  const ImageHeader h = check_images(ibytes, images_path);
  const std::vector<uint8_t> lbytes = read_maybe_gz(labels_path, kMaxIdxBytes);
  check_labels(lbytes, labels_path, h.count, images_path, num_classes);
  return make_dataset(ibytes, lbytes, h);
}

namespace {

constexpr const char* kMnistFiles[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                        "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};

// The path of `name` in `dir`, .gz preferred; empty when neither exists.
std::string find_idx(const std::filesystem::path& dir, const std::string& name) {
  std::error_code ec;
  for (const std::string& candidate : {name + ".gz", name}) {
    std::filesystem::path p = dir / candidate;
    if (std::filesystem::is_regular_file(p, ec)) return p.string();
  }
  return {};
}

}  // namespace

MnistData load_mnist_dir(const std::string& dir) {
  std::error_code ec;
  RINGTRAIN_CHECK(std::filesystem::is_directory(dir, ec),
                  "data directory {} does not exist or is not a directory; {}", dir, kFetchHint);
  std::string paths[4];
  for (int i = 0; i < 4; ++i) {
    paths[i] = find_idx(dir, kMnistFiles[i]);
    RINGTRAIN_CHECK(!paths[i].empty(), "data directory {} has no {} (looked for {}.gz and {}); {}",
                    dir, kMnistFiles[i], kMnistFiles[i], kMnistFiles[i], kFetchHint);
  }
  MnistData m;
  m.train = load_idx(paths[0], paths[1]);
  m.test = load_idx(paths[2], paths[3]);
  RINGTRAIN_CHECK(m.train.rows == m.test.rows && m.train.cols == m.test.cols,
                  "in {}: the training images are {}x{} but the test images are {}x{}; the "
                  "files come from different data sets",
                  dir, m.train.rows, m.train.cols, m.test.rows, m.test.cols);
  return m;
}

std::string default_data_dir() {
  if (const char* env = std::getenv("RINGTRAIN_DATA"); env != nullptr && env[0] != '\0') {
    return env;
  }
  // Relative on purpose: "data/mnist" is where scripts/download_mnist.sh puts the files when
  // run from the repository root, the usual place to start a run.
  for (const char* name : kMnistFiles) {
    if (find_idx("data/mnist", name).empty()) return "/usr/share/datasets/fashion-mnist";
  }
  return "data/mnist";
}

}  // namespace ringtrain
