// The bootstrap's threads (src/core/bootstrap.h): a unique id's root ends
// once its communicator is created, when a registered rank leaves before
// that, or at its deadline (TUTTI_INIT_TIMEOUT), and a rank that arrives
// later fails fast saying why; and a thread tutti starts that throws, or that
// cannot be started, turns into an API error while the process lives on
// (base::setThreadFaultForTesting).
//
// The root listens on loopback (NCCL_SOCKET_IFNAME=lo), so its address is
// 127.0.0.1 and the port in the id. Threads are counted in /proc/self/task and
// told apart by the names startThread gives them (tutti-root, tutti-service).
// Counts are taken relative to the test's start: roots of earlier tests (a
// plain run of the binary runs every test in one process) may still end.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "base/gate.h"
#include "base/thread.h"
#include "core/bootstrap.h"
#include "harness.h"

namespace tutti::test {
namespace {

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Threads of this process that tutti started (named "tutti-<site>" by
// base::startThread), all or those named `name`. Other threads are not
// counted: ThreadSanitizer starts a background thread of its own at a moment
// of its choosing, which made a count of every thread fail under it.
int threadCount(const char* name = nullptr) {
  int n = 0;
  DIR* d = opendir("/proc/self/task");
  if (!d) return -1;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream comm(std::string("/proc/self/task/") + e->d_name + "/comm");
    std::string s;
    std::getline(comm, s);
    if (name ? s != name : s.rfind("tutti-", 0) != 0) continue;
    ++n;
  }
  closedir(d);
  return n;
}

// The count of tutti's threads to come back to.
int baselineThreads() { return threadCount(); }

// Polls `cond` every 20 ms for up to `seconds`.
bool waitFor(const std::function<bool()>& cond, double seconds) {
  auto t0 = Clock::now();
  for (;;) {
    if (cond()) return true;
    if (secondsSince(t0) > seconds) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

core::UniqueIdData idData(const ncclUniqueId& id) {
  auto parsed = core::parseUniqueId(reinterpret_cast<const uint8_t*>(id.internal));
  EXPECT_TRUE(parsed.isOk());
  return parsed.isOk() ? parsed.value() : core::UniqueIdData{};
}

// Whether something listens on 127.0.0.1:port (the probe closes at once; the
// root drops a connection without a hello).
bool listening(uint16_t port) {
  int fd = connectLoopback(port);
  if (fd < 0) return false;
  close(fd);
  return true;
}

// Established TCP connections whose local port is `port` (/proc/net/tcp): at
// the root's port, the ranks connected to it.
int establishedAt(uint16_t port) {
  std::ifstream in("/proc/net/tcp");
  std::string line;
  std::getline(in, line);  // header
  int n = 0;
  while (std::getline(in, line)) {
    char local[64] = {}, remote[64] = {};
    unsigned state = 0;
    if (sscanf(line.c_str(), " %*d: %63s %63s %x", local, remote, &state) != 3) continue;
    const char* colon = strchr(local, ':');
    if (colon && strtoul(colon + 1, nullptr, 16) == port && state == 1) ++n;
  }
  return n;
}

bool contains(const std::string& s, const std::string& what) {
  return s.find(what) != std::string::npos;
}

// An id nobody uses: its root ends TUTTI_INIT_TIMEOUT after ncclGetUniqueId,
// its port closed and its thread gone.
// base::threadCount() counts every thread of the process (the child reader
// of topology files runs only where it is 1). A sanitizer may start a
// thread of its own at any moment, so only "at least one more" is checked.
TEST(ThreadCount, SeesAThreadThisProcessStarts) {
  const int before = base::threadCount();
  ASSERT_GE(before, 1);
  std::atomic<bool> stop{false};
  std::thread t([&] {
    while (!stop) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  const int during = base::threadCount();
  stop = true;
  t.join();
  EXPECT_GE(during, before + 1);
}

TEST(RootLifetime, UnusedIdEndsAtInitTimeout) {
  Env env({{"NCCL_SOCKET_IFNAME", "lo"}, {"TUTTI_INIT_TIMEOUT", "1"}});
  const int threads = baselineThreads(), roots = threadCount("tutti-root");
  ncclUniqueId id;
  auto t0 = Clock::now();
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess) << ncclGetLastError(nullptr);
  const uint16_t port = idData(id).port;
  EXPECT_TRUE(waitFor([&] { return threadCount("tutti-root") == roots + 1; }, 1));
  EXPECT_TRUE(listening(port));
  EXPECT_TRUE(waitFor(
      [&] {
        return !listening(port) && threadCount("tutti-root") == roots && threadCount() <= threads;
      },
      5))
      << "the root of an unused id still runs after " << secondsSince(t0) << " s";
  const double ended = secondsSince(t0);
  EXPECT_GE(ended, 0.9) << "the root ended before its deadline";
  EXPECT_LE(ended, 3.0);
  EXPECT_EQ(threadCount("tutti-root"), roots);
  EXPECT_LE(threadCount(), threads);
}

// Once every rank has the table the root is gone, while the communicator
// lives; a rank that arrives then is told the id was used, within seconds
// (not TUTTI_INIT_TIMEOUT). Destroying the communicators ends their service
// threads.
TEST(RootLifetime, RootEndsOnceTheCommunicatorIsCreated) {
  Env env({{"NCCL_SOCKET_IFNAME", "lo"}, {"TUTTI_INIT_TIMEOUT", "60"}});
  const int threads = baselineThreads(), roots = threadCount("tutti-root");
  const int services = threadCount("tutti-service");
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess) << ncclGetLastError(nullptr);
  const uint16_t port = idData(id).port;
  std::atomic<int> ready{0};
  std::atomic<bool> checked{false};
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      ncclComm_t c = nullptr;
      ASSERT_EQ(ncclCommInitRank(&c, 2, id, r), ncclSuccess) << ncclGetLastError(nullptr);
      ready++;
      while (!checked.load()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      EXPECT_EQ(ncclCommDestroy(c), ncclSuccess);
    });
  EXPECT_TRUE(waitFor([&] { return ready.load() == 2; }, 30));
  EXPECT_TRUE(waitFor([&] { return !listening(port) && threadCount("tutti-root") == roots; }, 2))
      << "the root still runs after its communicator was created";
  EXPECT_EQ(threadCount("tutti-service"), services + 2);

  ncclComm_t late = nullptr;
  auto t0 = Clock::now();
  ncclResult_t rc = ncclCommInitRank(&late, 2, id, 1);
  const double took = secondsSince(t0);
  const std::string err = ncclGetLastError(nullptr);
  EXPECT_NE(rc, ncclSuccess);
  EXPECT_LT(took, 10.0) << err;
  EXPECT_TRUE(contains(err, "127.0.0.1:" + std::to_string(port))) << err;
  EXPECT_TRUE(contains(err, "expired or was already used")) << err;
  if (late) ncclCommDestroy(late);

  checked = true;
  for (auto& t : ranks) t.join();
  EXPECT_TRUE(waitFor(
      [&] { return threadCount("tutti-service") == services && threadCount() <= threads; }, 2));
}

// A rank arriving after an unused id expired fails within seconds, although
// its own init would wait a minute, with an error naming the root's address
// and why it is gone.
TEST(RootLifetime, RankAfterExpiryFailsFastSayingWhy) {
  Env env({{"NCCL_SOCKET_IFNAME", "lo"}, {"TUTTI_INIT_TIMEOUT", "1"}});
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess) << ncclGetLastError(nullptr);
  const uint16_t port = idData(id).port;
  ASSERT_TRUE(waitFor([&] { return !listening(port); }, 5));
  setenv("TUTTI_INIT_TIMEOUT", "60", 1);  // the rank's own deadline
  ncclComm_t c = nullptr;
  auto t0 = Clock::now();
  ncclResult_t rc = ncclCommInitRank(&c, 2, id, 1);
  const double took = secondsSince(t0);
  const std::string err = ncclGetLastError(nullptr);
  EXPECT_NE(rc, ncclSuccess);
  EXPECT_LT(took, 10.0) << err;
  EXPECT_TRUE(contains(err, "bootstrap root 127.0.0.1:" + std::to_string(port))) << err;
  EXPECT_TRUE(contains(err, "connection refused")) << err;
  EXPECT_TRUE(contains(err, "expired or was already used")) << err;
  EXPECT_TRUE(contains(err, "TUTTI_INIT_TIMEOUT")) << err;
  if (c) ncclCommDestroy(c);
}

// A rank that registers and then goes away (its process died) ends the root
// at once: the rank still waiting is told who left instead of waiting for
// TUTTI_INIT_TIMEOUT. The leaving rank speaks the root's protocol by hand
// (handshake, registration: the layout in src/core/bootstrap.cc) and closes.
TEST(RootLifetime, RankLeavingBeforeEveryoneJoinedEndsTheRoot) {
  Env env({{"NCCL_SOCKET_IFNAME", "lo"}, {"TUTTI_INIT_TIMEOUT", "60"}});
  const int roots = threadCount("tutti-root");
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess) << ncclGetLastError(nullptr);
  const core::UniqueIdData data = idData(id);
  ncclResult_t rc = ncclSuccess;
  std::string err;
  double took = 0;
  std::thread waiting([&] {
    ncclComm_t c = nullptr;
    auto t0 = Clock::now();
    rc = ncclCommInitRank(&c, 3, id, 1);
    took = secondsSince(t0);
    err = ncclGetLastError(nullptr);
    if (c) ncclCommDestroy(c);
  });
  // The handshake of base/auth.h with the id's key, then the registration.
  auth::Key key;
  memcpy(key.bytes.data(), data.secret, key.bytes.size());
  net::SockAddr rootAddr = net::loopbackAddr(AF_INET);
  rootAddr.setPort(data.port);
  auto sock = net::connectAuthenticated(rootAddr, key, auth::Purpose::kBootstrapRoot, {0, 0},
                                        {-1, 0}, net::deadlineIn(10), nullptr, "root");
  ASSERT_TRUE(sock.isOk()) << sock.status().message();
  struct {
    int32_t rank = 0;
    int32_t nranks = 3;
    core::PeerInfo info{};
  } req;
  req.info.nranks = 3;
  int fd = sock.value().release();
  EXPECT_EQ(send(fd, &req, sizeof(req), 0), static_cast<ssize_t>(sizeof(req)));
  // Leave once rank 1 has connected too (and, a moment later, registered).
  EXPECT_TRUE(waitFor([&] { return establishedAt(data.port) >= 2; }, 20));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  close(fd);
  waiting.join();
  EXPECT_NE(rc, ncclSuccess);
  EXPECT_LT(took, 10.0) << err;
  EXPECT_TRUE(contains(err, "rank 0 left before every rank had joined")) << err;
  EXPECT_TRUE(
      waitFor([&] { return !listening(data.port) && threadCount("tutti-root") == roots; }, 2));
}

// The process exits while a root waits for ranks (an id never used): the
// exit is clean, with static destructors running beside the detached root
// (under TSan or ASan a report would change the exit status).
TEST(RootLifetime, ProcessExitsCleanlyWhileARootRuns) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("NCCL_SOCKET_IFNAME", "lo", 1);
        setenv("NCCL_DEBUG", "INFO", 1);
        setenv("NCCL_DEBUG_SUBSYS", "BOOTSTRAP", 1);
        ncclUniqueId id;
        if (ncclGetUniqueId(&id) != ncclSuccess) std::exit(1);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        std::exit(0);
      },
      ::testing::ExitedWithCode(0), "bootstrap root listening on 127.0.0.1:");
}

// ---- faults injected into tutti's threads -------------------------------------------------
//
// Each scenario runs in a process of its own (gtest's threadsafe death-test
// style runs this binary again) with base::setThreadFaultForTesting(fault):
// the process must survive, exiting 0 when the API returned errors that say
// what failed; its stderr (NCCL_DEBUG=WARN and what the scenario prints) must
// match `pattern`. A crash (std::terminate) fails the test.
void survives(const char* fault, const std::function<bool()>& scenario, const char* pattern) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        setenv("NCCL_DEBUG", "WARN", 1);
        setenv("NCCL_SOCKET_IFNAME", "lo", 1);
        setenv("TUTTI_INIT_TIMEOUT", "3", 1);  // a rank whose peer failed waits this long
        base::setThreadFaultForTesting(fault);
        std::exit(scenario() ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), pattern);
}

// n ranks of one id on threads; every init must fail within `within` seconds
// (a rank whose peer failed waits for TUTTI_INIT_TIMEOUT).
bool initFails(int n, double within) {
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) return false;
  std::vector<std::thread> ts;
  std::vector<ncclResult_t> rcs(n, ncclSuccess);
  auto t0 = Clock::now();
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      ncclComm_t c = nullptr;
      rcs[r] = ncclCommInitRank(&c, n, id, r);
      fprintf(stderr, "rank %d: init: %s\n", r, ncclGetLastError(nullptr));
      if (c) ncclCommDestroy(c);
    });
  for (auto& t : ts) t.join();
  const double took = secondsSince(t0);
  fprintf(stderr, "init took %.1f s\n", took);
  for (ncclResult_t rc : rcs)
    if (rc == ncclSuccess) return false;
  return took < within;
}

// Two communicators of one process driven together from this thread: the
// executor connects them on connect threads. The group must fail.
bool groupFails() {
  ncclComm_t comms[2] = {nullptr, nullptr};
  if (ncclCommInitAll(comms, 2, nullptr) != ncclSuccess) return false;
  int32_t in[2] = {1, 2}, out[2] = {0, 0};
  ncclGroupStart();
  for (int r = 0; r < 2; ++r)
    ncclAllReduce(&in[r], &out[r], 1, ncclInt32, ncclSum, comms[r], nullptr);
  ncclResult_t rc = ncclGroupEnd();
  fprintf(stderr, "group: %s\n", ncclGetLastError(comms[0]));
  for (auto* c : comms) ncclCommDestroy(c);
  return rc != ncclSuccess;
}

TEST(ThreadFaults, ServiceThreadThatThrowsFailsInit) {
  survives(
      "service", [] { return initFails(2, 20); },
      "NCCL WARN bootstrap service thread of rank [01] failed: internal error: injected "
      "failure \\(setThreadFaultForTesting\\(\"service\"\\)\\).*"
      "rank [01]: init: .*rank [01] cannot receive control messages \\(from rank [01]\\): "
      "bootstrap service thread of rank [01] failed");
}

TEST(ThreadFaults, ServiceThreadThatCannotStartFailsInit) {
  survives(
      "service@start", [] { return initFails(2, 20); },
      "rank 0: init: .*cannot start the bootstrap service thread of rank 0: injected "
      "failure \\(setThreadFaultForTesting\\(\"service@start\"\\)\\): Resource temporarily "
      "unavailable");
}

TEST(ThreadFaults, ConnectThreadThatThrowsFailsTheGroup) {
  survives("connect", groupFails,
           "group: .*connect thread of rank [01] failed: internal error: injected failure "
           "\\(setThreadFaultForTesting\\(\"connect\"\\)\\)");
}

TEST(ThreadFaults, ConnectThreadThatCannotStartFailsTheGroup) {
  survives("connect@start", groupFails,
           "group: .*cannot start the connect thread of rank [01]: injected failure "
           "\\(setThreadFaultForTesting\\(\"connect@start\"\\)\\): Resource temporarily "
           "unavailable");
}

// The root throws as it starts: its listener closes, and the ranks fail at
// once (reset, or refused: the id is gone) instead of waiting for it.
TEST(ThreadFaults, RootThreadThatThrowsFailsInitFast) {
  survives(
      "root", [] { return initFails(2, 15); },
      "NCCL WARN bootstrap root thread \\([^)]*\\) failed: internal error: injected "
      "failure \\(setThreadFaultForTesting\\(\"root\"\\)\\).*"
      "rank [01]: init: .*bootstrap root 127.0.0.1:[0-9]+");
}

TEST(ThreadFaults, RootThreadThatCannotStartFailsGetUniqueId) {
  survives(
      "root@start",
      [] {
        ncclUniqueId id;
        ncclResult_t rc = ncclGetUniqueId(&id);
        fprintf(stderr, "ncclGetUniqueId: %d: %s\n", rc, ncclGetLastError(nullptr));
        return rc == ncclSystemError;
      },
      "ncclGetUniqueId: 2: ncclGetUniqueId: cannot start the bootstrap root thread \\([^)]*\\): "
      "injected failure \\(setThreadFaultForTesting\\(\"root@start\"\\)\\): Resource "
      "temporarily unavailable");
}

}  // namespace
}  // namespace tutti::test
