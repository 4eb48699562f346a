// tutti's libfabric plugin (transports/ofi) on its own, through the NCCL net
// ABI it exports, over libfabric's tcp provider on loopback: messages and
// their lengths, flow control (a send waits for a posted receive), a message
// larger than its receive (refused), registrations of one buffer, and a peer process
// that dies. The collectives over it are in inproc.OfiTcp/* and
// inproc.OfiShm/*.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "transports/ncclnet/net_abi.h"

namespace {

using namespace tutti::transport::ncclnet;
using Clock = std::chrono::steady_clock;

#ifdef TUTTI_TEST_OFI_PLUGIN_DIR

const NetV9* loadPlugin() {
  static const NetV9* table = [] {
    setenv("FI_PROVIDER", "tcp", 1);
    void* h = dlopen(TUTTI_TEST_OFI_PLUGIN_DIR "/libtutti-net-ofi.so", RTLD_NOW | RTLD_LOCAL);
    if (h == nullptr) return static_cast<const NetV9*>(nullptr);
    auto set = reinterpret_cast<TuttiNetSetOption>(dlsym(h, kTuttiNetSetOptionSymbol));
    if (set != nullptr) set("ifname", "=lo");
    auto* t = static_cast<const NetV9*>(dlsym(h, "ncclNetPlugin_v9"));
    if (t == nullptr || t->init(nullptr) != kNetSuccess) return static_cast<const NetV9*>(nullptr);
    return t;
  }();
  return table;
}

#define NEED_PLUGIN()              \
  const NetV9* net = loadPlugin(); \
  ASSERT_NE(net, nullptr) << "libtutti-net-ofi.so did not load or start (FI_PROVIDER=tcp)"

// A connected pair of comms in this process.
struct Pair {
  const NetV9* net;
  void* send = nullptr;
  void* recv = nullptr;
  explicit Pair(const NetV9* n) : net(n) {
    char handle[kHandleBytes];
    void* listen = nullptr;
    EXPECT_EQ(net->listen(0, handle, &listen), kNetSuccess);
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while ((send == nullptr || recv == nullptr) && Clock::now() < deadline) {
      if (send == nullptr) {
        EXPECT_EQ(net->connect(0, handle, &send, nullptr), kNetSuccess);
      }
      if (recv == nullptr) {
        EXPECT_EQ(net->accept(listen, &recv, nullptr), kNetSuccess);
      }
    }
    EXPECT_NE(send, nullptr);
    EXPECT_NE(recv, nullptr);
    net->closeListen(listen);
  }
  ~Pair() {
    net->closeSend(send);
    net->closeRecv(recv);
  }
};

void* reg(const NetV9* net, void* comm, void* p, size_t n) {
  void* mh = nullptr;
  EXPECT_EQ(net->regMr(comm, p, n, kPtrHost, &mh), kNetSuccess);
  return mh;
}

void* postRecv(const NetV9* net, void* comm, void* p, size_t cap, void* mh) {
  int tag = 7;
  void* req = nullptr;
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (req == nullptr && Clock::now() < deadline)
    EXPECT_EQ(net->irecv(comm, 1, &p, &cap, &tag, &mh, &req), kNetSuccess);
  return req;
}

// Tests until done (true), an error (false, *rc says it) or 10 s.
bool waitDone(const NetV9* net, void* req, int* size, NetResult* rc = nullptr) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  while (Clock::now() < deadline) {
    int done = 0;
    NetResult r = net->test(req, &done, size);
    if (rc != nullptr) *rc = r;
    if (r != kNetSuccess) return false;
    if (done) return true;
  }
  return false;
}

TEST(OfiPlugin, MessagesArriveInOrderWithTheirLengths) {
  NEED_PLUGIN();
  Pair p(net);
  const std::vector<size_t> sizes = {0, 1, 7, 4095, 4096, 12345, 65536, 3};
  const size_t cap = 65536;
  std::vector<unsigned char> rbuf(cap * sizes.size()), sbuf(cap * sizes.size());
  void* rmh = reg(net, p.recv, rbuf.data(), rbuf.size());
  void* smh = reg(net, p.send, sbuf.data(), sbuf.size());
  std::vector<void*> rreq;
  for (size_t i = 0; i < sizes.size(); ++i)
    rreq.push_back(postRecv(net, p.recv, rbuf.data() + i * cap, cap, rmh));
  std::vector<void*> sreq;
  for (size_t i = 0; i < sizes.size(); ++i) {
    unsigned char* s = sbuf.data() + i * cap + (i % 3);  // unaligned starts too
    for (size_t b = 0; b < sizes[i]; ++b) s[b] = static_cast<unsigned char>(i * 31 + b * 7);
    void* req = nullptr;
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    while (req == nullptr && Clock::now() < deadline)
      ASSERT_EQ(net->isend(p.send, s, sizes[i], 7, smh, &req), kNetSuccess);
    ASSERT_NE(req, nullptr) << "message " << i;
    sreq.push_back(req);
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    int got = -1;
    ASSERT_TRUE(waitDone(net, rreq[i], &got)) << "receive " << i;
    EXPECT_EQ(got, static_cast<int>(sizes[i])) << "receive " << i;
    const unsigned char* r = rbuf.data() + i * cap;
    for (size_t b = 0; b < sizes[i]; ++b)
      ASSERT_EQ(r[b], static_cast<unsigned char>(i * 31 + b * 7))
          << "message " << i << " byte " << b;
    int sent = -1;
    ASSERT_TRUE(waitDone(net, sreq[i], &sent)) << "send " << i;
    EXPECT_EQ(sent, static_cast<int>(sizes[i]));
  }
  net->deregMr(p.recv, rmh);
  net->deregMr(p.send, smh);
}

// A send waits for a receive its peer posted: no request until there is one.
TEST(OfiPlugin, ASendWaitsForAPostedReceive) {
  NEED_PLUGIN();
  Pair p(net);
  std::vector<unsigned char> rbuf(3 * 1024), sbuf(1024, 0x5a);
  void* rmh = reg(net, p.recv, rbuf.data(), rbuf.size());
  void* smh = reg(net, p.send, sbuf.data(), sbuf.size());
  auto trySend = [&] {
    void* req = nullptr;
    EXPECT_EQ(net->isend(p.send, sbuf.data(), 1024, 7, smh, &req), kNetSuccess);
    return req;
  };
  // Nothing posted: no send is taken, however often it is tried.
  for (int i = 0; i < 200; ++i) {
    ASSERT_EQ(trySend(), nullptr) << "a send was taken with no receive posted (try " << i << ")";
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  // Two receives posted: exactly two sends are taken.
  void* r0 = postRecv(net, p.recv, rbuf.data(), 1024, rmh);
  void* r1 = postRecv(net, p.recv, rbuf.data() + 1024, 1024, rmh);
  std::vector<void*> taken;
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (taken.size() < 2 && Clock::now() < deadline)
    if (void* s = trySend()) taken.push_back(s);  // (a refused send progresses)
  ASSERT_EQ(taken.size(), 2u);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(trySend(), nullptr) << "a third send with two receives";
  int n = 0;
  ASSERT_TRUE(waitDone(net, r0, &n));
  ASSERT_TRUE(waitDone(net, r1, &n));
  EXPECT_EQ(n, 1024);
  EXPECT_EQ(rbuf[1023], 0x5a);
  for (void* s : taken) ASSERT_TRUE(waitDone(net, s, &n));
  net->deregMr(p.recv, rmh);
  net->deregMr(p.send, smh);
}

// A message larger than the receive posted for it is refused by the sender
// (the connection stays usable: a message that fits arrives in that receive).
TEST(OfiPlugin, AMessageLargerThanItsReceiveIsRefused) {
  NEED_PLUGIN();
  Pair p(net);
  std::vector<unsigned char> rbuf(256, 0xee), sbuf(200, 1);
  void* rmh = reg(net, p.recv, rbuf.data(), rbuf.size());
  void* smh = reg(net, p.send, sbuf.data(), sbuf.size());
  void* r = postRecv(net, p.recv, rbuf.data(), 100, rmh);
  void* s = nullptr;
  NetResult rc = kNetSuccess;
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (s == nullptr && rc == kNetSuccess && Clock::now() < deadline)
    rc = net->isend(p.send, sbuf.data(), 200, 7, smh, &s);
  EXPECT_EQ(rc, kNetInvalidUsage);
  EXPECT_EQ(s, nullptr);
  s = nullptr;
  while (s == nullptr && Clock::now() < deadline)
    ASSERT_EQ(net->isend(p.send, sbuf.data(), 100, 7, smh, &s), kNetSuccess);
  ASSERT_NE(s, nullptr);
  int n = 0;
  ASSERT_TRUE(waitDone(net, r, &n));
  EXPECT_EQ(n, 100);
  for (size_t i = 0; i < rbuf.size(); ++i) ASSERT_EQ(rbuf[i], i < 100 ? 1 : 0xee) << "byte " << i;
  ASSERT_TRUE(waitDone(net, s, &n));
  net->deregMr(p.recv, rmh);
  net->deregMr(p.send, smh);
}

// A buffer registered twice (and a range inside it): dropping one
// registration leaves the others usable.
TEST(OfiPlugin, RegistrationsOfOneBufferAreIndependent) {
  NEED_PLUGIN();
  Pair p(net);
  std::vector<unsigned char> rbuf(8192), sbuf(8192, 0x33);
  void* rmh = reg(net, p.recv, rbuf.data(), rbuf.size());
  void* a = reg(net, p.send, sbuf.data(), sbuf.size());
  void* b = reg(net, p.send, sbuf.data(), sbuf.size());
  void* inner = reg(net, p.send, sbuf.data() + 100, 1000);
  EXPECT_EQ(net->deregMr(p.send, a), kNetSuccess);
  void* r = postRecv(net, p.recv, rbuf.data(), 8192, rmh);
  for (void* mh : {b, inner}) {
    void* s = nullptr;
    const auto deadline = Clock::now() + std::chrono::seconds(5);
    while (s == nullptr && Clock::now() < deadline)
      ASSERT_EQ(net->isend(p.send, sbuf.data() + 100, 1000, 7, mh, &s), kNetSuccess);
    ASSERT_NE(s, nullptr);
    int n = 0;
    ASSERT_TRUE(waitDone(net, s, &n));
    ASSERT_TRUE(waitDone(net, r, &n));
    EXPECT_EQ(n, 1000);
    EXPECT_EQ(rbuf[999], 0x33);
    rbuf[999] = 0;
    r = postRecv(net, p.recv, rbuf.data(), 8192, rmh);
  }
  // A buffer outside every registration is refused.
  std::vector<unsigned char> other(64);
  void* s = nullptr;
  EXPECT_EQ(net->isend(p.send, other.data(), 64, 7, inner, &s), kNetInvalidUsage);
  EXPECT_EQ(net->deregMr(p.send, b), kNetSuccess);
  EXPECT_EQ(net->deregMr(p.send, inner), kNetSuccess);
  net->deregMr(p.recv, rmh);
}

#endif  // TUTTI_TEST_OFI_PLUGIN_DIR

// The child of AReceiveFromAProcessThatDiedFails, in a process of its own
// (started afresh: libfabric does not survive a fork): reads a listen handle
// from fd R, connects, says so on fd W, and waits to be killed. Skipped when
// run on its own.
TEST(OfiPluginChild, ConnectsAndWaits) {
  const char* fds = std::getenv("TUTTI_OFI_TEST_CHILD_FDS");
  if (fds == nullptr) GTEST_SKIP() << "the child of OfiPluginProcess.* (started by it)";
#ifdef TUTTI_TEST_OFI_PLUGIN_DIR
  int rfd = -1, wfd = -1;
  ASSERT_EQ(std::sscanf(fds, "%d,%d", &rfd, &wfd), 2);
  NEED_PLUGIN();
  char handle[kHandleBytes];
  ASSERT_EQ(read(rfd, handle, sizeof(handle)), static_cast<ssize_t>(sizeof(handle)));
  void* send = nullptr;
  while (send == nullptr) ASSERT_EQ(net->connect(0, handle, &send, nullptr), kNetSuccess);
  char c = 'c';
  ASSERT_EQ(write(wfd, &c, 1), 1);
  for (;;) pause();  // killed by the parent
#endif
}

// A peer process killed while this one waits for its message: the receive
// fails within 3 s (the plugin's liveness socket closes with the process).
TEST(OfiPluginProcess, AReceiveFromAProcessThatDiedFails) {
#ifndef TUTTI_TEST_OFI_PLUGIN_DIR
  GTEST_SKIP() << "the libfabric plugin is not built (libfabric-dev missing at configure time)";
#else
  int toChild[2], toParent[2];
  ASSERT_EQ(pipe(toChild), 0);
  ASSERT_EQ(pipe(toParent), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    char fds[32];
    std::snprintf(fds, sizeof(fds), "%d,%d", toChild[0], toParent[1]);
    setenv("TUTTI_OFI_TEST_CHILD_FDS", fds, 1);
    execl("/proc/self/exe", "transport_ofi_plugin_test",
          "--gtest_filter=OfiPluginChild.ConnectsAndWaits", static_cast<char*>(nullptr));
    _exit(127);
  }
  NEED_PLUGIN();
  char handle[kHandleBytes];
  void* listen = nullptr;
  ASSERT_EQ(net->listen(0, handle, &listen), kNetSuccess);
  ASSERT_EQ(write(toChild[1], handle, sizeof(handle)), static_cast<ssize_t>(sizeof(handle)));
  void* recv = nullptr;
  const auto deadline = Clock::now() + std::chrono::seconds(20);
  while (recv == nullptr && Clock::now() < deadline)
    ASSERT_EQ(net->accept(listen, &recv, nullptr), kNetSuccess);
  ASSERT_NE(recv, nullptr);
  char c;
  ASSERT_EQ(read(toParent[0], &c, 1), 1);
  std::vector<unsigned char> buf(4096);
  void* mh = reg(net, recv, buf.data(), buf.size());
  void* r = postRecv(net, recv, buf.data(), buf.size(), mh);
  ASSERT_NE(r, nullptr);
  kill(pid, SIGKILL);
  waitpid(pid, nullptr, 0);
  const auto t0 = Clock::now();
  int n = 0;
  NetResult rc = kNetSuccess;
  EXPECT_FALSE(waitDone(net, r, &n, &rc));
  const double s = std::chrono::duration<double>(Clock::now() - t0).count();
  EXPECT_EQ(rc, kNetRemoteError);
  EXPECT_LT(s, 3.0);
  net->deregMr(recv, mh);
  net->closeRecv(recv);
  net->closeListen(listen);
#endif
}

}  // namespace
