// The bootstrap's frame reader (core/bootstrap_wire.h): frames split at any
// byte come out whole; a header announcing more than the protocol allows is
// refused before anything is allocated; a bad header stops the reader for good.
#include "core/bootstrap_wire.h"

#include <gtest/gtest.h>

#include <cstring>
#include <vector>

namespace tutti::core {
namespace {

std::vector<uint8_t> frame(uint64_t tag, const std::vector<uint8_t>& payload) {
  FrameHeader h{kFrameMagic, 0, tag, payload.size()};
  std::vector<uint8_t> out(sizeof(h) + payload.size());
  memcpy(out.data(), &h, sizeof(h));
  if (!payload.empty()) memcpy(out.data() + sizeof(h), payload.data(), payload.size());
  return out;
}

TEST(BootstrapWire, FramesSplitAtEveryByteComeOutWhole) {
  std::vector<uint8_t> stream;
  for (uint64_t t = 0; t < 4; ++t) {
    auto f = frame(100 + t, std::vector<uint8_t>(t * 7, static_cast<uint8_t>(t)));
    stream.insert(stream.end(), f.begin(), f.end());
  }
  for (size_t piece : {size_t{1}, size_t{5}, size_t{24}, stream.size()}) {
    FrameReader r;
    std::vector<FrameReader::Frame> got;
    for (size_t off = 0; off < stream.size(); off += piece)
      ASSERT_TRUE(r.feed(stream.data() + off, std::min(piece, stream.size() - off), &got));
    ASSERT_EQ(got.size(), 4u) << "piece " << piece;
    for (uint64_t t = 0; t < 4; ++t) {
      EXPECT_EQ(got[t].tag, 100 + t);
      EXPECT_EQ(got[t].payload, std::vector<uint8_t>(t * 7, static_cast<uint8_t>(t)));
    }
    EXPECT_TRUE(r.idle());
  }
}

TEST(BootstrapWire, AHugeLengthIsRefusedBeforeAnyAllocation) {
  FrameHeader h{kFrameMagic, 0, 1, uint64_t{1} << 30};
  FrameReader r;
  std::vector<FrameReader::Frame> got;
  EXPECT_FALSE(r.feed(reinterpret_cast<const uint8_t*>(&h), sizeof(h), &got));
  EXPECT_NE(r.error().find("1073741824 bytes"), std::string::npos) << r.error();
  // Stopped for good: a valid frame afterwards is not taken.
  auto ok = frame(2, {1, 2, 3});
  EXPECT_FALSE(r.feed(ok.data(), ok.size(), &got));
  EXPECT_TRUE(got.empty());
  // The largest allowed frame is fine.
  FrameReader r2;
  auto big = frame(3, std::vector<uint8_t>(kMaxControlMessageBytes, 9));
  EXPECT_TRUE(r2.feed(big.data(), big.size(), &got));
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].payload.size(), kMaxControlMessageBytes);
}

TEST(BootstrapWire, ABadMagicStopsTheReader) {
  auto f = frame(1, {4, 5});
  f[0] ^= 0xff;
  FrameReader r;
  std::vector<FrameReader::Frame> got;
  EXPECT_FALSE(r.feed(f.data(), f.size(), &got));
  EXPECT_NE(r.error().find("bad frame magic"), std::string::npos);
  EXPECT_TRUE(got.empty());
}

}  // namespace
}  // namespace tutti::core
