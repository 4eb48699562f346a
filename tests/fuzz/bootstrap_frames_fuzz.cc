// Fuzz target: core::FrameReader (core/bootstrap_wire.h), which cuts what a
// bootstrap peer connection carries after its handshake into frames.
//
// Input: bytes 0-3 seed the choice of piece sizes; the rest is the stream,
// fed to one reader in pieces of 0 to 300 bytes and to another at once.
//
// Invariants (a violation traps):
// - No frame payload exceeds kMaxControlMessageBytes.
// - After feed() returns false, every later feed returns false, adds no
//   frame, and error() says why.
// - How the stream is cut into pieces changes nothing: both readers hand
//   out the same frames and fail alike, and those are the frames (and the
//   failure) of a straightforward reading of the stream: a 24-byte header
//   (magic, pad, tag, bytes) then `bytes` bytes of payload, a bad magic or
//   an oversized length failing the stream.
// - idle() is true exactly when the stream ended between frames.
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/bootstrap_wire.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

using tutti::core::FrameHeader;
using tutti::core::FrameReader;
using tutti::core::kFrameMagic;
using tutti::core::kMaxControlMessageBytes;

struct Expected {
  std::vector<FrameReader::Frame> frames;
  bool failed = false;
  bool betweenFrames = true;
};

Expected reference(const uint8_t* p, size_t n) {
  Expected e;
  size_t at = 0;
  while (at < n) {
    if (n - at < sizeof(FrameHeader)) {
      e.betweenFrames = false;
      return e;
    }
    FrameHeader h;
    std::memcpy(&h, p + at, sizeof(h));
    at += sizeof(h);
    if (h.magic != kFrameMagic || h.bytes > kMaxControlMessageBytes) {
      e.failed = true;
      return e;
    }
    if (n - at < h.bytes) {
      e.betweenFrames = false;
      return e;
    }
    e.frames.push_back({h.tag, std::vector<uint8_t>(p + at, p + at + h.bytes)});
    at += h.bytes;
  }
  return e;
}

bool sameFrames(const std::vector<FrameReader::Frame>& a,
                const std::vector<FrameReader::Frame>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].tag != b[i].tag || a[i].payload != b[i].payload) return false;
  return true;
}

void checkFrames(const std::vector<FrameReader::Frame>& frames) {
  for (const auto& f : frames) FUZZ_CHECK(f.payload.size() <= kMaxControlMessageBytes);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tutti::fuzz::Input in(data, size);
  uint32_t rng = in.value<uint32_t>() | 1;
  size_t n = 0;
  const uint8_t* stream = in.take(in.left(), &n);

  // In pieces.
  FrameReader pieces;
  std::vector<FrameReader::Frame> got;
  bool failed = false;
  size_t at = 0;
  while (at < n) {
    rng ^= rng << 13;  // xorshift32
    rng ^= rng >> 17;
    rng ^= rng << 5;
    size_t len = rng % 301;
    if (len > n - at) len = n - at;
    const size_t before = got.size();
    const bool ok = pieces.feed(stream + at, len, &got);
    at += len;
    if (failed) {
      FUZZ_CHECK(!ok);
      FUZZ_CHECK(got.size() == before);
    }
    if (!ok) {
      failed = true;
      FUZZ_CHECK(!pieces.error().empty());
    }
    checkFrames(got);
  }
  // A failed reader stays failed, whatever comes next.
  if (failed) {
    const size_t before = got.size();
    static const uint8_t kGoodHeader[sizeof(FrameHeader)] = {0x41, 0x52, 0x46, 0x54};
    FUZZ_CHECK(!pieces.feed(kGoodHeader, sizeof(kGoodHeader), &got));
    FUZZ_CHECK(!pieces.feed(stream, 0, &got));
    FUZZ_CHECK(got.size() == before);
  }

  // At once.
  FrameReader whole;
  std::vector<FrameReader::Frame> gotWhole;
  const bool okWhole = whole.feed(stream, n, &gotWhole);
  checkFrames(gotWhole);

  const Expected want = reference(stream, n);
  FUZZ_CHECK(okWhole == !want.failed);
  FUZZ_CHECK(failed == want.failed);
  FUZZ_CHECK(sameFrames(got, want.frames));
  FUZZ_CHECK(sameFrames(gotWhole, want.frames));
  if (!want.failed) {
    FUZZ_CHECK(pieces.idle() == want.betweenFrames);
    FUZZ_CHECK(whole.idle() == want.betweenFrames);
  }
  return 0;
}
