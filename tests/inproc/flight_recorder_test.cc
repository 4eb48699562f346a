// The flight recorder (issue 28): a rank whose collective fails (here: a
// timeout, because one rank skipped the call) writes its last operations to
// TUTTI_DEBUG_DUMP, with what it waits in and on whom; the merge script
// (bench/fault/flight_merge.py) names the rank everyone waits for. Over
// shared memory and TCP.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tests/inproc/harness.h"

namespace tutti::test {
namespace {

class FlightRecorder : public testing::TestWithParam<const char*> {};

std::string repoRoot() {
  std::string f = __FILE__;  // <root>/tests/inproc/flight_recorder_test.cc
  return f.substr(0, f.rfind("/tests/inproc/"));
}

std::vector<std::string> linesOf(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);)
    if (!l.empty()) lines.push_back(l);
  return lines;
}

std::string run(const std::string& cmd, int* status) {
  std::string out;
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[512];
  while (fgets(buf, sizeof(buf), p)) out += buf;
  *status = pclose(p);
  return out;
}

TEST_P(FlightRecorder, FailedRanksSayWhatTheyWaitOnAndTheMergeNamesTheRank) {
  char dir[] = "/tmp/tutti-flight.XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string dump = std::string(dir) + "/dump.jsonl";
  Env env({std::make_pair("NCCL_SHM_DISABLE", GetParam()), std::make_pair("TUTTI_TIMEOUT", "2"),
           std::make_pair("TUTTI_DEBUG_DUMP", dump.c_str())});
  constexpr int kRanks = 3, kSkipper = 2;
  std::atomic<int> finished{0};
  runRanks(kRanks, [&](int r, ncclComm_t comm) {
    // One call every rank makes: done on every rank.
    int32_t x = r + 1, y = 0;
    ASSERT_EQ(ncclAllReduce(&x, &y, 1, ncclInt32, ncclSum, comm, nullptr), ncclSuccess);
    EXPECT_EQ(y, 6);
    if (r == kSkipper) {  // skips the next one: the others time out waiting on it
      while (finished.load() < kRanks - 1) usleep(10000);
      return;
    }
    std::vector<float> buf(1000, 1.0f);
    EXPECT_NE(ncclAllReduce(buf.data(), buf.data(), buf.size(), ncclFloat, ncclSum, comm, nullptr),
              ncclSuccess);
    ++finished;
  });
  const auto lines = linesOf(dump);
  ASSERT_EQ(lines.size(), 2u) << "one dump per failed rank in " << dump;
  std::vector<int> ranks;
  for (const auto& l : lines) {
    EXPECT_NE(l.find("\"tutti_flight_recorder\":1"), std::string::npos) << l;
    // The first call done, the second pending: what and which call.
    EXPECT_NE(l.find("{\"op\":0,\"coll\":\"AllReduce\",\"count\":1,\"datatype\":\"int32\""),
              std::string::npos)
        << l;
    EXPECT_NE(l.find("\"state\":\"done\",\"call\":0"), std::string::npos) << l;
    EXPECT_NE(l.find("{\"op\":1,\"coll\":\"AllReduce\",\"count\":1000,\"datatype\":\"float\""),
              std::string::npos)
        << l;
    EXPECT_NE(l.find("\"state\":\"pending\",\"call\":1"), std::string::npos) << l;
    const auto at = l.find("\"rank\":");
    ASSERT_NE(at, std::string::npos);
    ranks.push_back(std::atoi(l.c_str() + at + 7));
  }
  std::sort(ranks.begin(), ranks.end());
  EXPECT_EQ(ranks, (std::vector<int>{0, 1}));
  int status = -1;
  const std::string out = run(
      "/usr/bin/python3 " + repoRoot() + "/bench/fault/flight_merge.py " + dump + " 2>&1", &status);
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("everyone waits for rank 2"), std::string::npos) << out;
  EXPECT_NE(out.find("2 | - | - | (no dump)"), std::string::npos) << out;
  std::remove(dump.c_str());
  rmdir(dir);
}

INSTANTIATE_TEST_SUITE_P(Transports, FlightRecorder, testing::Values("0", "1"),
                         [](const testing::TestParamInfo<const char*>& i) {
                           return std::string(i.param[0] == '1' ? "tcp" : "shm");
                         });

// Nothing is written while nothing fails.
TEST(FlightRecorderQuiet, NoDumpWithoutAFailure) {
  char dir[] = "/tmp/tutti-flight.XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  const std::string dump = std::string(dir) + "/dump.jsonl";
  Env env({std::make_pair("TUTTI_DEBUG_DUMP", dump.c_str())});
  runRanks(2, [](int r, ncclComm_t comm) {
    for (int i = 0; i < 100; ++i) {  // more calls than the recorder keeps
      int32_t x = r + i, y = 0;
      ASSERT_EQ(ncclAllReduce(&x, &y, 1, ncclInt32, ncclSum, comm, nullptr), ncclSuccess);
      EXPECT_EQ(y, 2 * i + 1);
    }
  });
  EXPECT_TRUE(linesOf(dump).empty());
  std::remove(dump.c_str());
  rmdir(dir);
}

}  // namespace
}  // namespace tutti::test
