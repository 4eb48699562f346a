// What the bootstrap's connections carry after their handshake (base/auth.h),
// and the incremental reader of it.
//
// Contract
// - A peer connection carries frames: FrameHeader, then `bytes` bytes of
//   payload, keyed by `tag`. A frame longer than kMaxControlMessageBytes is a
//   protocol violation: nothing the bootstrap's users send comes close (the
//   largest are all-gather blocks of a few hundred bytes per rank).
// - FrameReader takes bytes as they arrive and hands out whole frames. It
//   never allocates ahead of the bytes that arrived (a header that announces
//   a gigabyte costs nothing until the gigabyte is sent), and it fails on the
//   first malformed header instead of reading on.
// - Pure: no I/O, no state shared between readers; fuzzed by
//   tests/fuzz/bootstrap_frames_fuzz.cc.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace tutti::core {

constexpr uint32_t kFrameMagic = 0x54465241;
constexpr size_t kMaxControlMessageBytes = size_t{1} << 20;

struct FrameHeader {
  uint32_t magic;
  uint32_t pad;
  uint64_t tag;
  uint64_t bytes;
};
static_assert(sizeof(FrameHeader) == 24 && std::is_trivially_copyable_v<FrameHeader>);

class FrameReader {
 public:
  struct Frame {
    uint64_t tag = 0;
    std::vector<uint8_t> payload;
  };
  // Consumes all of [data, data + n). Appends every frame completed to
  // `done`. Returns false (and stops for good) on a malformed header; error()
  // says why.
  bool feed(const uint8_t* data, size_t n, std::vector<Frame>* done);
  const std::string& error() const { return error_; }
  // True between frames (nothing partial held).
  bool idle() const { return headerGot_ == 0 && !inPayload_; }

 private:
  FrameHeader header_{};
  size_t headerGot_ = 0;
  bool inPayload_ = false;
  Frame frame_;
  bool failed_ = false;
  std::string error_;
};

}  // namespace tutti::core
