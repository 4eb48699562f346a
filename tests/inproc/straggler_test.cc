// Straggler telemetry (core/telemetry.h, tuttiCommStragglers): a rank that
// calls late and a slow link are each named by every rank, within five
// operations, as what they are (a late rank is not taken for a slow link, nor
// the reverse); an even run names nobody. Four ranks as threads over TCP,
// each a node of its own (TUTTI_TEST_NODES: the link probe measures the
// inter-node bandwidth at init), on an emulated network
// (TUTTI_TEST_LINK_MBPS: every link a token bucket whose counters the
// telemetry reads; tests/netns/straggler_test.sh does the same over links
// shaped by the kernel, through TCP_INFO); ring all-reduces of exact
// integers, values checked.
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <initializer_list>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/log.h"
#include "harness.h"
#include "tutti/tutti.h"

namespace tutti::test {
namespace {

constexpr int kRanks = 4;

// Under a sanitizer (scripts/sanitize.sh runs the instrumented tests two at
// a time on the machine's cores, each rank a thread beside its engine's) a
// thread may lose its core for tens of milliseconds several operations in a
// row, which is what a late rank is: there the tests check that every rank
// names the straggler, not that no rank names anything else. The plain
// build (test.sh) checks both.
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif

// This rank's rows (tuttiCommStragglers).
std::vector<tuttiStraggler_t> rowsOf(ncclComm_t comm) {
  int n = 0;
  EXPECT_EQ(tuttiCommStragglers(comm, nullptr, 0, &n), ncclSuccess);
  std::vector<tuttiStraggler_t> rows(n);
  int again = 0;
  EXPECT_EQ(tuttiCommStragglers(comm, rows.data(), n, &again), ncclSuccess);
  rows.resize(std::min(n, again));
  return rows;
}

// The verdict of `kind` this rank holds for kWarnAfter (3) operations or
// more, or none (kind -1).
tuttiStraggler_t named(ncclComm_t comm, int kind) {
  for (const auto& r : rowsOf(comm))
    if (r.kind == kind && r.ops >= 3) return r;
  return tuttiStraggler_t{-1, -1, -1, 0, 0, 0, 0};
}

// WARN lines go to a file per test (NCCL_DEBUG_FILE); the lines of rank r
// that contain `what`.
struct WarnLog {
  std::string path = ::testing::TempDir() + "tutti_straggler." + std::to_string(getpid()) + ".txt";
  WarnLog() {
    std::remove(path.c_str());
    setenv("NCCL_DEBUG", "WARN", 1);
    setenv("NCCL_DEBUG_FILE", path.c_str(), 1);
    tutti::log::reset();
  }
  ~WarnLog() {
    unsetenv("NCCL_DEBUG");
    unsetenv("NCCL_DEBUG_FILE");
    tutti::log::reset();
    std::remove(path.c_str());
  }
  std::vector<std::string> lines(int r, const std::string& what) const {
    std::ifstream in(path);
    std::vector<std::string> out;
    const std::string tag = "[" + std::to_string(r) + "] NCCL WARN";
    for (std::string l; std::getline(in, l);)
      if (l.find(tag) != std::string::npos && l.find(what) != std::string::npos) out.push_back(l);
    return out;
  }
};

// Every rank named the straggler by the fifth operation (namedAt: the
// operation at which its row appeared) in exactly one WARN line, which says
// every one of `says`. Counted among all straggler lines, or under a
// sanitizer among those of `kind` only (see kSanitized).
void expectNamedOnce(const std::vector<int>& namedAt, const WarnLog& log, const char* kind,
                     std::initializer_list<const char*> says) {
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_GE(namedAt[r], 0) << "rank " << r << " never named it";
    EXPECT_LE(namedAt[r], 4) << "rank " << r;
    const auto warns = log.lines(r, kSanitized ? kind : "straggler:");
    ASSERT_EQ(warns.size(), 1u) << "rank " << r;
    for (const char* say : says) EXPECT_NE(warns[0].find(say), std::string::npos) << warns[0];
  }
}

// One ring all-reduce of `count` int32 on rank r, checked.
void allReduce(int r, ncclComm_t comm, size_t count, int round) {
  std::vector<int32_t> in(count), out(count, -1);
  for (size_t i = 0; i < count; ++i) in[i] = static_cast<int32_t>(r * 1000 + round + i % 977);
  ASSERT_EQ(ncclAllReduce(in.data(), out.data(), count, ncclInt32, ncclSum, comm, nullptr),
            ncclSuccess)
      << ncclGetLastError(comm);
  for (size_t i = 0; i < count; ++i)
    ASSERT_EQ(out[i], static_cast<int32_t>(6000 + kRanks * (round + i % 977))) << "element " << i;
}

// Rank 2 spends 60 ms more than the others before each call (100 ms under
// a sanitizer: there the others' own checking of 128 Ki results between
// calls takes tens of ms too, which left rank 2 only 37 ms late once): every
// rank names it late, by 40 ms or more, by the fifth operation, WARNs once,
// and names no link.
TEST(Stragglers, ALateRankIsNamedByEveryRank) {
  Env env({{"NCCL_SHM_DISABLE", "1"},
           {"TUTTI_TEST_NODES", "1,1,1,1"},
           {"NCCL_ALGO", "ring"},
           {"TUTTI_TEST_LINK_MBPS", "*:*:20"}});
  WarnLog log;
  std::vector<int> namedAt(kRanks, -1);
  runRanks(kRanks, [&](int r, ncclComm_t comm) {
    for (int op = 0; op < 8; ++op) {
      if (r == 2) std::this_thread::sleep_for(std::chrono::milliseconds(kSanitized ? 100 : 60));
      allReduce(r, comm, 128 << 10, op);
      const tuttiStraggler_t late = named(comm, tuttiStragglerLate);
      if (late.kind >= 0 && namedAt[r] < 0) {
        namedAt[r] = op;
        EXPECT_EQ(late.rank, 2) << "rank " << r;
        EXPECT_GE(late.lateMs, 40) << "rank " << r;
      }
      const tuttiStraggler_t link = named(comm, tuttiStragglerSlowLink);
      if (!kSanitized) {
        EXPECT_LT(link.kind, 0) << "rank " << r << ", operation " << op << ": link from "
                                << link.peer << " to " << link.rank << ", " << link.mbps
                                << " MB/s, ratio " << link.ratio;
      }
    }
  });
  expectNamedOnce(namedAt, log, "arrives late", {"rank 2 (host", "arrives late"});
}

// The link from rank 1 to rank 2 runs at a fifth of the others' rate:
// every rank names that link by the fifth operation, and no rank late
// (rank 2 starts each operation after the others, its inbound link being
// slow, but with no longer a gap before it).
TEST(Stragglers, ASlowLinkIsNamedByEveryRank) {
  Env env({{"NCCL_SHM_DISABLE", "1"},
           {"TUTTI_TEST_NODES", "1,1,1,1"},
           {"NCCL_ALGO", "ring"},
           {"TUTTI_TEST_LINK_MBPS", "*:*:20,1:2:4"}});
  WarnLog log;
  std::vector<int> namedAt(kRanks, -1);
  runRanks(kRanks, [&](int r, ncclComm_t comm) {
    for (int op = 0; op < 8; ++op) {
      allReduce(r, comm, 128 << 10, op);
      const tuttiStraggler_t link = named(comm, tuttiStragglerSlowLink);
      if (link.kind >= 0 && namedAt[r] < 0) {
        namedAt[r] = op;
        EXPECT_EQ(link.peer, 1) << "rank " << r;
        EXPECT_EQ(link.rank, 2) << "rank " << r;
        EXPECT_GT(link.ratio, 2.5) << "rank " << r;
        EXPECT_LT(link.mbps, 6) << "rank " << r;
      }
      if (!kSanitized) {
        EXPECT_LT(named(comm, tuttiStragglerLate).kind, 0) << "rank " << r << ", operation " << op;
      }
    }
  });
  expectNamedOnce(namedAt, log, "slow link", {"slow link from rank 1 (host", "to rank 2 (host"});
}

// Every link at one rate and no rank late: 1,000 operations (every tenth
// large enough for its messages to be measured) name nobody.
TEST(Stragglers, AnEvenRunNamesNobody) {
  if (kSanitized) GTEST_SKIP() << "timing under a sanitizer is not an even run (see kSanitized)";
  Env env({{"NCCL_SHM_DISABLE", "1"},
           {"TUTTI_TEST_NODES", "1,1,1,1"},
           {"NCCL_ALGO", "ring"},
           {"TUTTI_TEST_LINK_MBPS", "*:*:20"}});
  WarnLog log;
  runRanks(kRanks, [&](int r, ncclComm_t comm) {
    for (int op = 0; op < 1000; ++op) {
      allReduce(r, comm, op % 10 ? 1024 : 128 << 10, op);
      for (const auto& row : rowsOf(comm))
        ASSERT_TRUE(row.kind == tuttiStragglerObserved || row.ops < 3)
            << "rank " << r << ", operation " << op << ": kind " << row.kind << " rank " << row.rank
            << " peer " << row.peer << " for " << row.ops << " operations, " << row.mbps
            << " MB/s, ratio " << row.ratio;
    }
  });
  for (int r = 0; r < kRanks; ++r) EXPECT_TRUE(log.lines(r, "straggler").empty()) << "rank " << r;
}

// The API's argument checks.
TEST(Stragglers, ArgumentsAreChecked) {
  int n = 0;
  EXPECT_EQ(tuttiCommStragglers(nullptr, nullptr, 0, &n), ncclInvalidArgument);
  runRanks(1, [&](int, ncclComm_t comm) {
    tuttiStraggler_t row;
    EXPECT_EQ(tuttiCommStragglers(comm, &row, 1, nullptr), ncclInvalidArgument);
    EXPECT_EQ(tuttiCommStragglers(comm, nullptr, 1, &n), ncclInvalidArgument);
    EXPECT_EQ(tuttiCommStragglers(comm, &row, -1, &n), ncclInvalidArgument);
    EXPECT_NE(std::string(ncclGetLastError(comm)).find("tuttiCommStragglers"), std::string::npos);
    EXPECT_EQ(tuttiCommStragglers(comm, nullptr, 0, &n), ncclSuccess);
    EXPECT_EQ(n, 0);  // one rank exchanges no messages
  });
}

// A TUTTI_TEST_LINK_MBPS that does not parse fails the communicator's
// creation, naming it.
TEST(Stragglers, ABadLinkRateSettingIsRefused) {
  Env env({std::make_pair("TUTTI_TEST_LINK_MBPS", "*:*:20,1:x:3")});
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ncclComm_t comm = nullptr;
  EXPECT_NE(ncclCommInitRank(&comm, 1, id, 0), ncclSuccess);
  EXPECT_NE(std::string(ncclGetLastError(nullptr)).find("'1:x:3' is not from:to:MBps"),
            std::string::npos)
      << ncclGetLastError(nullptr);
  if (comm) ncclCommDestroy(comm);
}

}  // namespace
}  // namespace tutti::test
