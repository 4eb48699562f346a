// TCP transport specifics: hello verification against raw sockets, IPv6,
// socket-buffer settings, throughput. Traffic stays on 127.0.0.0/8 and ::1.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "transport_test_util.h"
#include "transports/tcp/socket_util.h"
#include "transports/tcp/tcp_transport.h"
#include "transports/transport.h"

namespace tutti::transport {
namespace {

using namespace std::chrono_literals;
using testing::connectBoth;
using testing::measureOneWay256MiB;
using testing::Pair;
using testing::pump;

// A raw client: connects to the endpoint rank 0 advertised to rank 1.
int rawConnect(Pair& p, uint64_t tagBase) {
  auto msg = p.box.take(0, 1, tagBase, Clock::now() + 5s, nullptr, /*remove=*/false);
  if (!msg.isOk()) return -1;
  auto addr = net::parseNumericAddr(std::string(msg->begin(), msg->end()));
  if (!addr.isOk()) return -1;
  int fd = socket(addr->family(), SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  if (::connect(fd, addr->sa(), addr->len) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// True when the listener closes fd within `limit`.
bool closedByPeer(int fd, std::chrono::milliseconds limit) {
  pollfd pf{fd, POLLIN, 0};
  if (poll(&pf, 1, static_cast<int>(limit.count())) <= 0) return false;
  char b;
  return recv(fd, &b, 1, MSG_DONTWAIT) <= 0;
}

struct RawHello {  // the wire layout of the transport's hello
  uint64_t magic;
  uint8_t secret[32];
  int32_t rank;
  int32_t channel;
};

void expectWorks(Connection& a, Connection& b) {
  Status sb;
  std::thread th([&] { sb = pump(b, 1 << 16, 1, 1 << 16, 2, 4096, 1); });
  Status sa = pump(a, 1 << 16, 2, 1 << 16, 1, 4096, 2);
  th.join();
  EXPECT_TRUE(sa.isOk()) << sa.message();
  EXPECT_TRUE(sb.isOk()) << sb.message();
}

TEST(TcpTransport, BadHelloDroppedRealPeerStillConnects) {
  auto t0 = makeTcpTransport(), t1 = makeTcpTransport();
  Pair p;
  auto c0 = p.ctx(0);
  testing::ConnResult r0 = Status(Code::kInternalError, "not run");
  std::thread lower([&] { r0 = t0->connect(c0); });

  // A silent client that never sends a hello must not block anyone.
  int silent = rawConnect(p, c0.tagBase);
  ASSERT_GE(silent, 0);
  // A client with the wrong secret (everything else right) is dropped.
  int bad = rawConnect(p, c0.tagBase);
  ASSERT_GE(bad, 0);
  RawHello h{};
  h.magic = 0x74757474695443ull;
  std::memset(h.secret, 0xee, sizeof(h.secret));
  h.rank = 1;
  h.channel = 0;
  ASSERT_EQ(send(bad, &h, sizeof(h), MSG_NOSIGNAL), static_cast<ssize_t>(sizeof(h)));
  EXPECT_TRUE(closedByPeer(bad, 3s));
  close(bad);
  // Garbage is dropped too.
  int junk = rawConnect(p, c0.tagBase);
  ASSERT_GE(junk, 0);
  std::string g(48, 'x');
  ASSERT_EQ(send(junk, g.data(), g.size(), MSG_NOSIGNAL), 48);
  EXPECT_TRUE(closedByPeer(junk, 3s));
  close(junk);

  auto r1 = t1->connect(p.ctx(1));
  lower.join();
  close(silent);
  ASSERT_TRUE(r0.isOk()) << r0.status().message();
  ASSERT_TRUE(r1.isOk()) << r1.status().message();
  expectWorks(*r0.value(), *r1.value());
}

TEST(TcpTransport, WrongSecretFailsBothSides) {
  auto t0 = makeTcpTransport(), t1 = makeTcpTransport();
  Pair p;
  uint8_t other[32];
  std::memset(other, 7, sizeof(other));
  auto c1 = p.ctx(1, 0, 800ms);
  c1.secret = other;
  auto t = Clock::now();
  auto [r0, r1] = connectBoth(*t0, *t1, p.ctx(0, 0, 800ms), c1);
  ASSERT_FALSE(r0.isOk());
  ASSERT_FALSE(r1.isOk());
  EXPECT_LE(std::chrono::duration<double>(Clock::now() - t).count(), 1.3);
  EXPECT_NE(r1.status().message().find("rank 0"), std::string::npos) << r1.status().message();
  EXPECT_NE(r0.status().message().find("rank 1"), std::string::npos) << r0.status().message();
}

TEST(TcpTransport, WrongChannelRejected) {
  auto t0 = makeTcpTransport(), t1 = makeTcpTransport();
  Pair p;
  auto c1 = p.ctx(1, 0, 600ms);
  c1.channel = 3;  // same tags, different channel: a mix-up must not connect
  auto [r0, r1] = connectBoth(*t0, *t1, p.ctx(0, 0, 600ms), c1);
  EXPECT_FALSE(r0.isOk());
  EXPECT_FALSE(r1.isOk());
}

TEST(TcpTransport, Ipv6Loopback) {
  int probe = socket(AF_INET6, SOCK_STREAM, 0);
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  bool ok = probe >= 0 && bind(probe, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  if (probe >= 0) close(probe);
  if (!ok) GTEST_SKIP() << "no IPv6 loopback here";

  auto t0 = makeTcpTransport(), t1 = makeTcpTransport();
  {
    Pair p;
    auto c0 = p.ctx(0), c1 = p.ctx(1);
    c0.peerSameHost = c1.peerSameHost = false;
    c0.localIfAddr = "::1";
    auto [r0, r1] = connectBoth(*t0, *t1, c0, c1);
    ASSERT_TRUE(r0.isOk()) << r0.status().message();
    ASSERT_TRUE(r1.isOk()) << r1.status().message();
    expectWorks(*r0.value(), *r1.value());
  }
  {
    setenv("NCCL_SOCKET_FAMILY", "AF_INET6", 1);
    Pair p;
    auto [r0, r1] = connectBoth(*t0, *t1, p.ctx(0), p.ctx(1));
    unsetenv("NCCL_SOCKET_FAMILY");
    ASSERT_TRUE(r0.isOk()) << r0.status().message();
    ASSERT_TRUE(r1.isOk()) << r1.status().message();
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    ASSERT_EQ(getsockname(r0.value()->waitHint(), reinterpret_cast<sockaddr*>(&ss), &len), 0);
    EXPECT_EQ(ss.ss_family, AF_INET6);
    expectWorks(*r0.value(), *r1.value());
  }
}

TEST(TcpTransport, ExplicitIpv4AddressAndEndpointParsing) {
  auto t0 = makeTcpTransport(), t1 = makeTcpTransport();
  Pair p;
  auto c0 = p.ctx(0), c1 = p.ctx(1);
  c0.peerSameHost = c1.peerSameHost = false;
  c0.localIfAddr = "127.0.0.2";
  auto [r0, r1] = connectBoth(*t0, *t1, c0, c1);
  ASSERT_TRUE(r0.isOk()) << r0.status().message();
  ASSERT_TRUE(r1.isOk()) << r1.status().message();
  sockaddr_in sa{};
  socklen_t len = sizeof(sa);
  ASSERT_EQ(getsockname(r0.value()->waitHint(), reinterpret_cast<sockaddr*>(&sa), &len), 0);
  EXPECT_EQ(ntohl(sa.sin_addr.s_addr), 0x7f000002u);

  EXPECT_FALSE(net::parseNumericAddr("127.0.0.1").isOk());
  EXPECT_FALSE(net::parseNumericAddr("host.example:80").isOk());
  EXPECT_FALSE(net::parseNumericAddr("127.0.0.1:99999").isOk());
  auto v6 = net::parseNumericAddr("[::1]:4242");
  ASSERT_TRUE(v6.isOk());
  EXPECT_EQ(v6->str(), "[::1]:4242");
  EXPECT_EQ(v6->port(), 4242);
}

TEST(TcpTransport, SocketBufferSizesFromEnv) {
  setenv("NCCL_SOCKET_SNDBUF", "1M", 1);
  setenv("NCCL_SOCKET_RCVBUF", "2M", 1);
  auto t0 = makeTcpTransport(), t1 = makeTcpTransport();
  Pair p;
  auto [r0, r1] = connectBoth(*t0, *t1, p.ctx(0), p.ctx(1));
  unsetenv("NCCL_SOCKET_SNDBUF");
  unsetenv("NCCL_SOCKET_RCVBUF");
  ASSERT_TRUE(r0.isOk() && r1.isOk());
  for (auto* c : {r0.value().get(), r1.value().get()}) {
    int fd = c->waitHint();
    ASSERT_GE(fd, 0);
    int snd = 0, rcv = 0;
    socklen_t len = sizeof(int);
    getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &snd, &len);
    getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, &len);
    // The kernel doubles the request and may cap it at net.core.[rw]mem_max.
    int wmax = 0, rmax = 0;
    if (FILE* f = fopen("/proc/sys/net/core/wmem_max", "r")) {
      if (fscanf(f, "%d", &wmax) != 1) wmax = 0;
      fclose(f);
    }
    if (FILE* f = fopen("/proc/sys/net/core/rmem_max", "r")) {
      if (fscanf(f, "%d", &rmax) != 1) rmax = 0;
      fclose(f);
    }
    EXPECT_GE(snd, std::min(1 << 20, wmax > 0 ? wmax : 1 << 20));
    EXPECT_GE(rcv, std::min(2 << 20, rmax > 0 ? rmax : 2 << 20));
  }
}

// Reads ahead: small receives take what the socket holds (up to 4 KiB) in one
// system call and hand it out message by message; larger ones go straight to
// the caller after the held bytes. A peer that closes is reported only once
// everything it sent was handed out.
TEST(TcpConnection, ReadAheadKeepsTheStreamAndReportsCloseAfterHeldBytes) {
  int sv[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  tcp::TcpConnection conn(sv[0], /*peer=*/1, /*channel=*/0);  // owns sv[0]
  auto byteAt = [](size_t i) { return static_cast<uint8_t>(i * 7 + 3); };
  // header, small payload, header, payload larger than the read-ahead, header,
  // small payload: the stream the executor reads.
  const std::vector<size_t> parts = {24, 8, 24, 10000, 24, 13};
  size_t total = 0;
  for (size_t n : parts) total += n;
  std::vector<uint8_t> wire(total);
  for (size_t i = 0; i < total; ++i) wire[i] = byteAt(i);
  ASSERT_EQ(send(sv[1], wire.data(), total, 0), static_cast<ssize_t>(total));
  ASSERT_EQ(close(sv[1]), 0);  // everything is queued: the peer leaves

  size_t at = 0;
  for (size_t k = 0; k < parts.size(); ++k) {
    std::vector<uint8_t> got(parts[k], 0);
    size_t have = 0;
    for (int tries = 0; have < parts[k] && tries < 100; ++tries) {
      auto n = conn.tryRecv(got.data() + have, parts[k] - have);
      ASSERT_TRUE(n.isOk()) << "part " << k << ": " << n.status().message();
      have += *n;
    }
    ASSERT_EQ(have, parts[k]) << "part " << k;
    for (size_t i = 0; i < parts[k]; ++i) ASSERT_EQ(got[i], byteAt(at + i)) << "part " << k;
    at += parts[k];
    if (k == 0) {
      // The first small receive read ahead: what follows is already held.
      EXPECT_EQ(conn.buffered(), std::min<size_t>(4096, total) - 24);
    }
  }
  EXPECT_EQ(conn.buffered(), 0u);
  uint8_t b;
  auto eof = conn.tryRecv(&b, 1);
  ASSERT_FALSE(eof.isOk());
  EXPECT_NE(eof.status().message().find("closed by peer"), std::string::npos)
      << eof.status().message();
}

TEST(TcpTransport, Throughput256MiB) {
  auto t0 = makeTcpTransport(), t1 = makeTcpTransport();
  Pair p;
  auto [r0, r1] = connectBoth(*t0, *t1, p.ctx(0), p.ctx(1));
  ASSERT_TRUE(r0.isOk() && r1.isOk());
  measureOneWay256MiB(*r0.value(), *r1.value(), "tcp");
}

}  // namespace
}  // namespace tutti::transport
