// Environment-driven behaviour through the public API: NCCL_COMM_ID
// bootstrap, TUTTI_TEST_NODES validation, NCCL-format logging to NCCL_DEBUG_FILE, non-NULL streams
// on host memory, and communicators used concurrently from several threads.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <regex>

#include "base/log.h"
#include "harness.h"

namespace tutti::test {
namespace {

// A loopback port that was free a moment ago.
int freePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    return 29517;
  int port = ntohs(a.sin_port);
  close(fd);
  return port;
}

TEST(Env, NcclCommIdLetsEveryRankMakeTheId) {
  std::string commId = "127.0.0.1:" + std::to_string(freePort());
  setenv("NCCL_COMM_ID", commId.c_str(), 1);
  const int n = 3;
  std::vector<std::thread> ts;
  std::vector<int64_t> sums(n, -1);
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      ncclUniqueId id;  // each rank derives the same id from NCCL_COMM_ID
      ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
      ncclComm_t c;
      ASSERT_EQ(ncclCommInitRank(&c, n, id, r), ncclSuccess) << ncclGetLastError(nullptr);
      int64_t v = r + 1;
      ASSERT_EQ(ncclAllReduce(&v, &sums[r], 1, ncclInt64, ncclSum, c, nullptr), ncclSuccess);
      ASSERT_EQ(ncclCommDestroy(c), ncclSuccess);
    });
  for (auto& t : ts) t.join();
  unsetenv("NCCL_COMM_ID");
  for (int r = 0; r < n; ++r) EXPECT_EQ(sums[r], 6);
}

// Split under NCCL_COMM_ID: each child gets a root of its own (a fresh port
// and secret), not NCCL_COMM_ID's address again, where two colours' roots
// collided ("Address already in use", then a wait for TUTTI_INIT_TIMEOUT).
TEST(Env, NcclCommIdSplitIntoTwoColours) {
  std::string commId = "127.0.0.1:" + std::to_string(freePort());
  Env env(
      {std::make_pair("NCCL_COMM_ID", commId.c_str()), std::make_pair("TUTTI_INIT_TIMEOUT", "20")});
  const int n = 4;
  std::vector<std::thread> ts;
  std::vector<int64_t> sums(n, -1), again(n, -1);
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      ncclUniqueId id;
      ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
      ncclComm_t c = nullptr, child = nullptr;
      ASSERT_EQ(ncclCommInitRank(&c, n, id, r), ncclSuccess) << ncclGetLastError(nullptr);
      // Twice: a second split's roots must not collide with the first's either.
      for (int round = 0; round < 2; ++round) {
        ASSERT_EQ(ncclCommSplit(c, r % 2, r, &child, nullptr), ncclSuccess) << ncclGetLastError(c);
        int64_t v = r + 1;
        ASSERT_EQ(
            ncclAllReduce(&v, round ? &again[r] : &sums[r], 1, ncclInt64, ncclSum, child, nullptr),
            ncclSuccess)
            << ncclGetLastError(child);
        ASSERT_EQ(ncclCommDestroy(child), ncclSuccess);
      }
      ASSERT_EQ(ncclCommDestroy(c), ncclSuccess);
    });
  for (auto& t : ts) t.join();
  for (int r = 0; r < n; ++r) {
    const int64_t want = r % 2 == 0 ? 1 + 3 : 2 + 4;  // ranks 0, 2 and 1, 3
    EXPECT_EQ(sums[r], want) << "rank " << r;
    EXPECT_EQ(again[r], want) << "rank " << r;
  }
}

// A bad TUTTI_TEST_NODES fails init on every rank with a message naming the
// variable.
TEST(Env, BadTestNodesFailsInitOnEveryRank) {
  for (const char* spec : {"2,x", "1,1,1", "0,2"}) {
    SCOPED_TRACE(spec);
    setenv("TUTTI_TEST_NODES", spec, 1);
    ncclUniqueId id;
    ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r)
      threads.emplace_back([&, r] {
        ncclComm_t c = nullptr;
        EXPECT_EQ(ncclCommInitRank(&c, 2, id, r), ncclInvalidArgument);
        EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("TUTTI_TEST_NODES"),
                  std::string::npos)
            << ncclGetLastError(nullptr);
      });
    for (auto& t : threads) t.join();
  }
  unsetenv("TUTTI_TEST_NODES");
}

TEST(Env, LogLinesHaveNcclsFormat) {
  std::string path = ::testing::TempDir() + "tutti_log_test.%p.txt";
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "INIT,COLL", 1);
  setenv("NCCL_DEBUG_FILE", path.c_str(), 1);
  log::reset();
  runRanks(2, [](int, ncclComm_t comm) {
    float x = 1, y = 0;
    ASSERT_EQ(ncclAllReduce(&x, &y, 1, ncclFloat, ncclSum, comm, nullptr), ncclSuccess);
  });
  unsetenv("NCCL_DEBUG");
  unsetenv("NCCL_DEBUG_SUBSYS");
  unsetenv("NCCL_DEBUG_FILE");
  log::reset();
  std::string file = ::testing::TempDir() + "tutti_log_test." + std::to_string(getpid()) + ".txt";
  std::ifstream in(file);
  ASSERT_TRUE(in.good()) << file;
  std::regex line(R"(^[^:\s]+:\d+:\d+ \[(\d+|-)\] NCCL (INFO|WARN) .+)");
  int infoLines = 0, initComplete = 0, allReduce = 0;
  std::string l;
  while (std::getline(in, l)) {
    if (l.rfind("NCCL version", 0) == 0) continue;
    EXPECT_TRUE(std::regex_match(l, line)) << l;
    infoLines++;
    if (l.find("Init COMPLETE") != std::string::npos) initComplete++;
    if (l.find("ncclAllReduce") != std::string::npos) allReduce++;
  }
  std::remove(file.c_str());
  EXPECT_GT(infoLines, 0);
  EXPECT_EQ(initComplete, 2);
  EXPECT_EQ(allReduce, 2);
}

// On host memory a stream changes nothing: the call has completed on return.
TEST(Env, NonNullStreamCompletesBeforeReturn) {
  runRanks(3, [](int r, ncclComm_t comm) {
    auto fakeStream = reinterpret_cast<cudaStream_t>(0x1234);
    std::vector<int32_t> in(100000, r + 1), out(100000, 0);
    ASSERT_EQ(ncclAllReduce(in.data(), out.data(), in.size(), ncclInt32, ncclSum, comm, fakeStream),
              ncclSuccess);
    for (int32_t v : out) ASSERT_EQ(v, 6);
  });
}

// Two communicators over the same ranks, driven from two threads per rank at
// the same time: each call only touches its own communicator.
TEST(Env, CommunicatorsUsedConcurrentlyFromSeveralThreads) {
  const int n = 3;
  runRanks(n, [&](int r, ncclComm_t comm) {
    ncclComm_t second = nullptr;
    ASSERT_EQ(ncclCommSplit(comm, 0, r, &second, nullptr), ncclSuccess);
    auto work = [&](ncclComm_t c, int32_t base) {
      std::vector<int32_t> in(20000), out(20000);
      for (int it = 0; it < 20; ++it) {
        for (size_t i = 0; i < in.size(); ++i) in[i] = base + r + it + static_cast<int32_t>(i % 7);
        ASSERT_EQ(ncclAllReduce(in.data(), out.data(), in.size(), ncclInt32, ncclSum, c, nullptr),
                  ncclSuccess);
        for (size_t i = 0; i < in.size(); ++i)
          ASSERT_EQ(out[i], n * (base + it + static_cast<int32_t>(i % 7)) + (0 + 1 + 2));
      }
    };
    std::thread other([&] { work(second, 1000); });
    work(comm, 0);
    other.join();
    ASSERT_EQ(ncclCommDestroy(second), ncclSuccess);
  });
}

}  // namespace
}  // namespace tutti::test
