// Behaviour every transport shares, run against shm and tcp: real sockets and
// real shared memory, two threads acting as ranks 0 and 1.
#include <gtest/gtest.h>

#include <string>
#include <thread>

#include "transport_test_util.h"
#include "transports/transport.h"

namespace tutti::transport {
namespace {

using namespace std::chrono_literals;
using testing::connectBoth;
using testing::ConnResult;
using testing::Pair;
using testing::pump;

std::unique_ptr<Transport> make(const std::string& kind) {
  return kind == "shm" ? makeShmTransport() : makeTcpTransport();
}

class TransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<Transport> t0_ = make(GetParam());
  std::unique_ptr<Transport> t1_ = make(GetParam());
};

double msSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

TEST_P(TransportTest, HandshakeAndLargeTransfer) {
  Pair p;
  auto [r0, r1] = connectBoth(*t0_, *t1_, p.ctx(0), p.ctx(1));
  ASSERT_TRUE(r0.isOk()) << r0.status().message();
  ASSERT_TRUE(r1.isOk()) << r1.status().message();
  EXPECT_STREQ(r0.value()->name(), r1.value()->name());
  const uint64_t total = 64ull << 20;
  Status s1;
  std::thread rx([&] { s1 = pump(*r1.value(), 0, 0, total, 7, 1 << 20, 2); });
  Status s0 = pump(*r0.value(), total, 7, 0, 0, 1 << 20, 1);
  rx.join();
  EXPECT_TRUE(s0.isOk()) << s0.message();
  EXPECT_TRUE(s1.isOk()) << s1.message();
}

// Both sides push more than the buffer before their first read.
TEST_P(TransportTest, BothDirectionsAtOnce) {
  Pair p;
  auto [r0, r1] = connectBoth(*t0_, *t1_, p.ctx(0, 0, 10s, 64 << 10), p.ctx(1, 0, 10s, 64 << 10));
  ASSERT_TRUE(r0.isOk()) << r0.status().message();
  ASSERT_TRUE(r1.isOk()) << r1.status().message();
  const uint64_t total = 16ull << 20;
  Status s1;
  std::thread th([&] {
    s1 = pump(*r1.value(), total, 11, total, 10, 256 << 10, 4, 30s, true, /*fillFirst=*/true);
  });
  Status s0 = pump(*r0.value(), total, 10, total, 11, 256 << 10, 3, 30s, true, true);
  th.join();
  EXPECT_TRUE(s0.isOk()) << s0.message();
  EXPECT_TRUE(s1.isOk()) << s1.message();
}

TEST_P(TransportTest, ConcurrentChannelsDoNotMix) {
  Pair p;
  constexpr int kChannels = 4;
  std::vector<ConnResult> c0, c1;
  for (int ch = 0; ch < kChannels; ++ch) {
    c0.emplace_back(Status(Code::kInternalError, "not run"));
    c1.emplace_back(Status(Code::kInternalError, "not run"));
  }
  std::vector<std::thread> ths;
  for (int ch = 0; ch < kChannels; ++ch) {
    ths.emplace_back([&, ch] { c0[ch] = t0_->connect(p.ctx(0, ch)); });
    ths.emplace_back([&, ch] { c1[ch] = t1_->connect(p.ctx(1, ch)); });
  }
  for (auto& t : ths) t.join();
  for (int ch = 0; ch < kChannels; ++ch) {
    ASSERT_TRUE(c0[ch].isOk()) << c0[ch].status().message();
    ASSERT_TRUE(c1[ch].isOk()) << c1[ch].status().message();
  }
  // Each channel carries its own pattern; a crossed pair would mismatch.
  for (int ch = 0; ch < kChannels; ++ch) {
    Status s1;
    std::thread th(
        [&] { s1 = pump(*c1[ch].value(), 1 << 20, 200 + ch, 1 << 20, 100 + ch, 4096, 9); });
    Status s0 = pump(*c0[ch].value(), 1 << 20, 100 + ch, 1 << 20, 200 + ch, 4096, 8);
    th.join();
    EXPECT_TRUE(s0.isOk()) << "channel " << ch << ": " << s0.message();
    EXPECT_TRUE(s1.isOk()) << "channel " << ch << ": " << s1.message();
  }
}

TEST_P(TransportTest, DeadlineWhenPeerAbsent) {
  for (int rank : {0, 1}) {
    Pair p;
    auto t = Clock::now();
    auto& tr = rank == 0 ? *t0_ : *t1_;
    auto r = tr.connect(p.ctx(rank, 0, 300ms));
    double ms = msSince(t);
    ASSERT_FALSE(r.isOk()) << "rank " << rank;
    EXPECT_GE(ms, 250) << "rank " << rank;
    EXPECT_LE(ms, 800) << "rank " << rank;
    const std::string peer = "rank " + std::to_string(1 - rank);
    EXPECT_NE(r.status().message().find(peer), std::string::npos) << r.status().message();
  }
}

TEST_P(TransportTest, AbortFlagStopsConnect) {
  for (int rank : {0, 1}) {
    Pair p;
    auto& tr = rank == 0 ? *t0_ : *t1_;
    auto t = Clock::now();
    std::thread aborter([&] {
      std::this_thread::sleep_for(100ms);
      p.abort.store(true);
    });
    auto r = tr.connect(p.ctx(rank, 0, 20s));
    double ms = msSince(t);
    aborter.join();
    ASSERT_FALSE(r.isOk());
    EXPECT_LE(ms, 600) << "rank " << rank;
    EXPECT_NE(r.status().message().find("abort"), std::string::npos) << r.status().message();
  }
}

// Data sent before a close still arrives; then the reader gets an error that
// names the peer rather than a hang.
TEST_P(TransportTest, PeerCloseIsAnErrorNotAHang) {
  Pair p;
  auto [r0, r1] = connectBoth(*t0_, *t1_, p.ctx(0), p.ctx(1));
  ASSERT_TRUE(r0.isOk()) << r0.status().message();
  ASSERT_TRUE(r1.isOk()) << r1.status().message();
  std::vector<uint8_t> data(1000, 0x5a);
  ASSERT_TRUE(pump(*r1.value(), data.size(), 3, 0, 0, 1000, 1).isOk());
  r1.value().reset();  // rank 1 closes

  auto& c = *r0.value();
  uint64_t got = 0;
  Status err;
  auto end = Clock::now() + 3s;
  std::vector<uint8_t> buf(4096);
  while (Clock::now() < end) {
    auto r = c.tryRecv(buf.data(), buf.size());
    if (!r.isOk()) {
      err = r.status();
      break;
    }
    EXPECT_EQ(testing::checkPattern(buf.data(), *r, got, 3), *r);
    got += *r;
    if (*r == 0) std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(got, data.size());
  ASSERT_FALSE(err.isOk()) << "no error within 3 s";
  EXPECT_EQ(err.code(), Code::kRemoteError);
  EXPECT_NE(err.message().find("rank 1"), std::string::npos) << err.message();
  EXPECT_NE(err.message().find("closed by peer"), std::string::npos) << err.message();
  EXPECT_FALSE(c.checkAlive().isOk());

  // Sending eventually fails too (TCP: once the peer's RST arrives).
  Status serr;
  end = Clock::now() + 3s;
  while (Clock::now() < end && serr.isOk()) {
    auto r = c.trySend(buf.data(), buf.size());
    if (!r.isOk()) serr = r.status();
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_FALSE(serr.isOk());
}

TEST_P(TransportTest, AbortConnection) {
  Pair p;
  auto [r0, r1] = connectBoth(*t0_, *t1_, p.ctx(0), p.ctx(1));
  ASSERT_TRUE(r0.isOk()) << r0.status().message();
  ASSERT_TRUE(r1.isOk()) << r1.status().message();
  r0.value()->abort();
  uint8_t b = 0;
  EXPECT_FALSE(r0.value()->trySend(&b, 1).isOk());
  EXPECT_FALSE(r0.value()->tryRecv(&b, 1).isOk());
  EXPECT_FALSE(r0.value()->checkAlive().isOk());
  // The peer notices.
  Status err;
  auto end = Clock::now() + 3s;
  while (Clock::now() < end && err.isOk()) {
    auto r = r1.value()->tryRecv(&b, 1);
    if (!r.isOk()) err = r.status();
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_FALSE(err.isOk());
  EXPECT_NE(err.message().find("rank 0"), std::string::npos) << err.message();
}

TEST_P(TransportTest, ZeroByteCallsAreNoOps) {
  Pair p;
  auto [r0, r1] = connectBoth(*t0_, *t1_, p.ctx(0), p.ctx(1));
  ASSERT_TRUE(r0.isOk()) << r0.status().message();
  ASSERT_TRUE(r1.isOk()) << r1.status().message();
  uint8_t b = 0;
  auto s = r0.value()->trySend(&b, 0);
  ASSERT_TRUE(s.isOk());
  EXPECT_EQ(*s, 0u);
  auto r = r1.value()->tryRecv(&b, 0);
  ASSERT_TRUE(r.isOk());
  EXPECT_EQ(*r, 0u);
  r = r1.value()->tryRecv(&b, 1);  // nothing there yet
  ASSERT_TRUE(r.isOk());
  EXPECT_EQ(*r, 0u);
  EXPECT_TRUE(r0.value()->checkAlive().isOk());
  EXPECT_TRUE(r1.value()->checkAlive().isOk());
}

TEST_P(TransportTest, RejectsBadContext) {
  Pair p;
  auto c = p.ctx(0);
  c.control = nullptr;
  EXPECT_EQ(t0_->connect(c).status().code(), Code::kInvalidArgument);
  c = p.ctx(0);
  c.isLower = false;
  EXPECT_EQ(t0_->connect(c).status().code(), Code::kInvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Transports, TransportTest, ::testing::Values("shm", "tcp"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace tutti::transport
