// Shared-memory transport specifics: no names left in /dev/shm, peek/consume
// across the ring's wrap-around, liveness by pid, throughput.
#include <dirent.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "transport_test_util.h"
#include "transports/shm/shared_region.h"
#include "transports/shm/shm_transport.h"
#include "transports/transport.h"

namespace tutti::transport {
namespace {

using namespace std::chrono_literals;
using testing::connectBoth;
using testing::measureOneWay256MiB;
using testing::Pair;
using testing::pump;

// Names in /dev/shm that belong to this communicator.
std::vector<std::string> segmentsOf(uint64_t commHash) {
  std::vector<std::string> out;
  const std::string prefix = fmt::format("tutti-{:016x}-", commHash);
  DIR* d = opendir("/dev/shm");
  if (d == nullptr) return out;
  while (dirent* e = readdir(d)) {
    if (std::string(e->d_name).rfind(prefix, 0) == 0) out.push_back(e->d_name);
  }
  closedir(d);
  return out;
}

TEST(ShmTransport, NoNameLeftInDevShm) {
  auto t0 = makeShmTransport(), t1 = makeShmTransport();
  Pair p;
  auto [r0, r1] = connectBoth(*t0, *t1, p.ctx(0), p.ctx(1));
  ASSERT_TRUE(r0.isOk()) << r0.status().message();
  ASSERT_TRUE(r1.isOk()) << r1.status().message();
  EXPECT_TRUE(segmentsOf(p.commHash).empty());
  // Still usable after the unlink.
  Status s1;
  std::thread th([&] { s1 = pump(*r1.value(), 0, 0, 1 << 20, 5, 4096, 2); });
  EXPECT_TRUE(pump(*r0.value(), 1 << 20, 5, 0, 0, 4096, 1).isOk());
  th.join();
  EXPECT_TRUE(s1.isOk()) << s1.message();
}

TEST(ShmTransport, NoNameLeftAfterFailedHandshake) {
  auto t0 = makeShmTransport();
  Pair p;
  auto r = t0->connect(p.ctx(0, 0, 200ms));  // rank 1 never answers
  ASSERT_FALSE(r.isOk());
  EXPECT_TRUE(segmentsOf(p.commHash).empty());
}

TEST(ShmTransport, PeekConsumeAcrossWrap) {
  auto t0 = makeShmTransport(), t1 = makeShmTransport();
  Pair p;
  const size_t ring = 1000;  // not a power of two: wraps at odd offsets
  auto [r0, r1] = connectBoth(*t0, *t1, p.ctx(0, 0, 10s, ring), p.ctx(1, 0, 10s, ring));
  ASSERT_TRUE(r0.isOk()) << r0.status().message();
  ASSERT_TRUE(r1.isOk()) << r1.status().message();
  Connection& tx = *r0.value();
  Connection& rx = *r1.value();
  ASSERT_TRUE(rx.supportsPeek());
  size_t avail = 123;
  EXPECT_EQ(rx.peek(&avail), nullptr);
  EXPECT_EQ(avail, 0u);

  std::vector<uint8_t> buf(ring);
  uint64_t sent = 0, recvd = 0;
  const uint64_t total = 100000;
  bool sawWrap = false;
  while (recvd < total) {
    size_t n = std::min<uint64_t>(777, total - sent);
    testing::fillPattern(buf.data(), n, sent, 9);
    auto s = tx.trySend(buf.data(), n);
    ASSERT_TRUE(s.isOk());
    sent += *s;
    const void* ptr = rx.peek(&avail);
    if (ptr == nullptr) continue;
    ASSERT_GT(avail, 0u);
    ASSERT_LE(avail, ring);
    if (avail < sent - recvd) sawWrap = true;  // contiguous piece shorter than what is there
    size_t take = std::max<size_t>(1, avail / 2 + 1);
    take = std::min(take, avail);
    ASSERT_EQ(testing::checkPattern(static_cast<const uint8_t*>(ptr), take, recvd, 9), take);
    rx.consume(take);
    recvd += take;
  }
  EXPECT_TRUE(sawWrap);
  EXPECT_EQ(sent, total);
  // Mixed with tryRecv.
  testing::fillPattern(buf.data(), 500, sent, 9);
  ASSERT_EQ(*tx.trySend(buf.data(), 500), 500u);
  auto g = rx.tryRecv(buf.data(), 200);
  ASSERT_TRUE(g.isOk());
  ASSERT_EQ(*g, 200u);
  EXPECT_EQ(testing::checkPattern(buf.data(), 200, recvd, 9), 200u);
  const void* ptr = rx.peek(&avail);
  ASSERT_NE(ptr, nullptr);
  EXPECT_EQ(testing::checkPattern(static_cast<const uint8_t*>(ptr), avail, recvd + 200, 9), avail);
}

TEST(ShmTransport, SendFillsExactlyTheRing) {
  auto t0 = makeShmTransport(), t1 = makeShmTransport();
  Pair p;
  auto [r0, r1] = connectBoth(*t0, *t1, p.ctx(0, 0, 10s, 4096), p.ctx(1, 0, 10s, 4096));
  ASSERT_TRUE(r0.isOk() && r1.isOk());
  std::vector<uint8_t> big(10000, 1);
  EXPECT_EQ(*r0.value()->trySend(big.data(), big.size()), 4096u);
  EXPECT_EQ(*r0.value()->trySend(big.data(), big.size()), 0u);
  EXPECT_EQ(*r1.value()->tryRecv(big.data(), 100), 100u);
  EXPECT_EQ(*r0.value()->trySend(big.data(), big.size()), 100u);
}

// Each side asks for the ring it receives from to be placed near it: once,
// whole pages, and the range it names is where the peer's bytes arrive.
TEST(ShmTransport, PlacesTheRingEachSideReceivesFrom) {
  struct Asked {
    int calls = 0;
    uint8_t* p = nullptr;
    size_t bytes = 0;
  } asked[2];
  auto t0 = makeShmTransport(), t1 = makeShmTransport();
  Pair p;
  const size_t ring = 10000;  // not a whole page: the placed range is rounded up
  ConnectContext c[2] = {p.ctx(0, 0, 10s, ring), p.ctx(1, 0, 10s, ring)};
  for (int i = 0; i < 2; ++i)
    c[i].placeNear = [a = &asked[i]](void* ptr, size_t bytes) {
      ++a->calls;
      a->p = static_cast<uint8_t*>(ptr);
      a->bytes = bytes;
    };
  auto [r0, r1] = connectBoth(*t0, *t1, c[0], c[1]);
  ASSERT_TRUE(r0.isOk() && r1.isOk());
  std::unique_ptr<Connection>* conn[2] = {&r0.value(), &r1.value()};
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(asked[i].calls, 1) << "rank " << i;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(asked[i].p) % 4096, 0u);
    EXPECT_EQ(asked[i].bytes, 12288u);
    // The peer's message lands at the start of that range.
    std::vector<uint8_t> msg(3000);
    for (size_t k = 0; k < msg.size(); ++k) msg[k] = static_cast<uint8_t>(k * 7 + 1 + i);
    ASSERT_EQ(*(*conn[1 - i])->trySend(msg.data(), msg.size()), msg.size());
    EXPECT_EQ(memcmp(asked[i].p, msg.data(), msg.size()), 0) << "rank " << i;
    std::vector<uint8_t> got(msg.size());
    ASSERT_EQ(*(*conn[i])->tryRecv(got.data(), got.size()), got.size());
    EXPECT_EQ(got, msg);
  }
}

// A region one side writes and another maps read-only; no name outlives unlink().
TEST(SharedRegion, WriterAndReaderSeeOneMemory) {
  using shm::SharedRegion;
  const uint64_t hash = 0x5eed0000u + static_cast<uint64_t>(getpid());
  const std::string name = SharedRegion::makeName(hash, "test", 3);
  EXPECT_EQ(name.rfind(fmt::format("/tutti-{:016x}-test-3-", hash), 0), 0u) << name;
  const size_t bytes = 3 * 4096 + 5;
  auto w = SharedRegion::create(name, bytes);
  ASSERT_TRUE(w.isOk()) << w.status().message();
  ASSERT_EQ(w.value()->size(), bytes);
  for (size_t i = 0; i < bytes; ++i) w.value()->data()[i] = static_cast<uint8_t>(i * 13 + 1);
  EXPECT_FALSE(SharedRegion::create(name, bytes).isOk());  // the name is taken
  auto tooBig = SharedRegion::open(name, bytes + 4096);
  ASSERT_FALSE(tooBig.isOk());
  EXPECT_NE(tooBig.status().message().find("smaller than announced"), std::string::npos);
  auto r = SharedRegion::open(name, bytes);
  ASSERT_TRUE(r.isOk()) << r.status().message();
  w.value()->unlink();
  EXPECT_TRUE(segmentsOf(hash).empty());
  for (size_t i = 0; i < bytes; ++i)
    ASSERT_EQ(r.value()->data()[i], static_cast<uint8_t>(i * 13 + 1)) << i;
  w.value()->data()[bytes - 1] = 0xab;  // still one memory after the unlink
  EXPECT_EQ(r.value()->data()[bytes - 1], 0xab);
  auto gone = SharedRegion::open(name, bytes);
  ASSERT_FALSE(gone.isOk());
  EXPECT_NE(gone.status().message().find(name), std::string::npos) << gone.status().message();
  // A creator that never unlinks leaves no name behind either.
  { auto again = SharedRegion::create(SharedRegion::makeName(hash, "test", 4), 4096); }
  EXPECT_TRUE(segmentsOf(hash).empty());
}

TEST(ShmTransport, CheckAliveReportsDeadPeerProcess) {
  auto t0 = makeShmTransport(), t1 = makeShmTransport();
  Pair p;
  auto [r0, r1] = connectBoth(*t0, *t1, p.ctx(0), p.ctx(1));
  ASSERT_TRUE(r0.isOk() && r1.isOk());
  EXPECT_TRUE(r0.value()->checkAlive().isOk());
  // A pid that certainly no longer exists: a reaped child.
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) _exit(0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  auto* conn = dynamic_cast<shm::ShmConnection*>(r0.value().get());
  ASSERT_NE(conn, nullptr);
  conn->header()->pid[1].store(child);  // pretend rank 1 was that process
  Status s = r0.value()->checkAlive();
  ASSERT_FALSE(s.isOk());
  EXPECT_EQ(s.code(), Code::kRemoteError);
  EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.message();
}

// The ring alone, producer and consumer in one mapping, so a thread sanitizer
// sees both sides of every access (two mappings hide races from it).
TEST(ShmRing, TwoThreadsOneMapping) {
  const size_t cap = 4099;
  std::vector<uint8_t> mem(shm::segmentBytes(cap) + shm::kPage);
  void* base =
      reinterpret_cast<void*>(shm::roundUp(reinterpret_cast<uintptr_t>(mem.data()), shm::kPage));
  shm::SegmentHeader* h = shm::initSegment(base, cap);
  auto* bytes = static_cast<uint8_t*>(base);
  const uint64_t total = 8 << 20;
  std::thread producer([&] {
    shm::SpscRing ring(&h->ring[0], bytes + h->dataOffset[0], cap);
    std::vector<uint8_t> buf(5000);
    uint64_t sent = 0;
    std::mt19937 rng(1);
    while (sent < total) {
      size_t n = std::min<uint64_t>(1 + rng() % buf.size(), total - sent);
      testing::fillPattern(buf.data(), n, sent, 4);
      size_t off = 0;
      while (off < n) {
        size_t w = ring.write(buf.data() + off, n - off);
        if (w == 0) std::this_thread::yield();
        off += w;
      }
      sent += n;
    }
  });
  shm::SpscRing ring(&h->ring[0], bytes + h->dataOffset[0], cap);
  std::vector<uint8_t> buf(5000);
  uint64_t got = 0;
  bool ok = true;
  std::mt19937 rng(2);
  while (got < total && ok) {
    if (rng() % 2) {
      size_t n = ring.read(buf.data(), 1 + rng() % buf.size());
      ok = testing::checkPattern(buf.data(), n, got, 4) == n;
      got += n;
      if (n == 0) std::this_thread::yield();
    } else {
      size_t avail = 0;
      auto* p = static_cast<const uint8_t*>(ring.peek(&avail));
      if (p == nullptr) {
        std::this_thread::yield();
        continue;
      }
      size_t n = 1 + rng() % avail;
      ok = testing::checkPattern(p, n, got, 4) == n;
      ring.consume(n);
      got += n;
    }
  }
  producer.join();
  EXPECT_TRUE(ok) << "pattern mismatch near byte " << got;
  EXPECT_EQ(got, total);
}

TEST(ShmTransport, Throughput256MiB) {
  auto t0 = makeShmTransport(), t1 = makeShmTransport();
  Pair p;
  auto [r0, r1] = connectBoth(*t0, *t1, p.ctx(0, 0, 10s, 4 << 20), p.ctx(1, 0, 10s, 4 << 20));
  ASSERT_TRUE(r0.isOk() && r1.isOk());
  measureOneWay256MiB(*r0.value(), *r1.value(), "shm");
}

}  // namespace
}  // namespace tutti::transport
