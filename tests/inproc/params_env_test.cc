// NCCL's environment through real communicators (ranks as threads): every
// NCCL_* setting with no effect is named once at WARN, honoured ones get
// NCCL's "set by environment" INFO line and no warning, NCCL_DEBUG works from a
// config file, NCCL_BUFFSIZE below the minimum is raised with a WARN, and the
// version line appears once per process.
//
// The version line is printed once per process (no reset exists), so the test
// that counts it comes first: ctest runs each test as its own process, and a
// plain run of the binary runs them in this order.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "base/log.h"
#include "base/params.h"
#include "harness.h"

namespace tutti::test {
namespace {

std::vector<std::string> readLines(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

int count(const std::vector<std::string>& lines, const std::string& what) {
  return static_cast<int>(std::count_if(lines.begin(), lines.end(), [&](const std::string& l) {
    return l.find(what) != std::string::npos;
  }));
}

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& l : v) s += l + "\n";
  return s;
}

std::string tempPath(const std::string& what) {
  return ::testing::TempDir() + "tutti_params_env_" + std::to_string(getpid()) + "." + what;
}

// Two communicators in one process (the second a split of the first, then a
// fresh one): each WARN, each "set by" line and the version line once.
TEST(ParamsEnv, TwoCommunicatorsWarnOnceAndHonouredVariablesAreNotWarned) {
  const std::string log = tempPath("log");
  {
    Env env({{"NCCL_DEBUG", "INFO"},
             {"NCCL_DEBUG_SUBSYS", "INIT,ENV"},
             {"NCCL_DEBUG_FILE", log.c_str()},
             {"NCCL_IB_HCA", "mlx5_0"},
             {"NCCL_NTHREADS", "256"},
             {"NCCL_NET", "IB"},
             {"NCCL_SHM_DISABLE", "1"},
             {"NCCL_SOCKET_IFNAME", "lo"},
             {"NCCL_BUFFSIZE", "1K"},
             {"NCCL_TESTS_MIN_BW", "1"}});
    params::resetForTesting();
    log::reset();
    for (int round = 0; round < 2; ++round)
      runRanks(2, [](int r, ncclComm_t comm) {
        ncclComm_t sub = nullptr;
        ASSERT_EQ(ncclCommSplit(comm, 0, r, &sub, nullptr), ncclSuccess) << ncclGetLastError(comm);
        int32_t x = r + 1, y = 0;
        ASSERT_EQ(ncclAllReduce(&x, &y, 1, ncclInt32, ncclSum, sub, nullptr), ncclSuccess);
        EXPECT_EQ(y, 3);
        ASSERT_EQ(ncclCommDestroy(sub), ncclSuccess);
      });
  }
  params::resetForTesting();
  log::reset();  // closes the file
  const auto lines = readLines(log);
  std::remove(log.c_str());
  const std::string all = joined(lines);
  // 2 rounds x (a communicator and its split) x 2 ranks.
  EXPECT_EQ(count(lines, "Init COMPLETE"), 8) << all;
  EXPECT_EQ(count(lines,
                  "NCCL WARN NCCL_IB_HCA=mlx5_0 has no effect: tutti has no InfiniBand "
                  "transport"),
            1)
      << all;
  EXPECT_EQ(count(lines, "NCCL WARN NCCL_NTHREADS=256 has no effect: "), 1) << all;
  EXPECT_EQ(count(lines, "NCCL WARN NCCL_NET=IB has no effect: "), 1) << all;
  EXPECT_EQ(count(lines, "NCCL INFO NCCL_SHM_DISABLE set by environment to 1."), 1) << all;
  EXPECT_EQ(count(lines, "NCCL INFO NCCL_SOCKET_IFNAME set by environment to lo."), 1) << all;
  EXPECT_EQ(count(lines, "NCCL INFO NCCL_BUFFSIZE set by environment to 1K."), 1) << all;
  for (const char* honoured :
       {"NCCL_SHM_DISABLE=", "NCCL_SOCKET_IFNAME=", "NCCL_TESTS_MIN_BW", "NCCL_DEBUG"})
    EXPECT_EQ(count(lines, std::string("WARN ") + honoured), 0) << honoured << "\n" << all;
  EXPECT_EQ(count(lines,
                  "NCCL WARN NCCL_BUFFSIZE=1K is below the minimum tutti accepts; using "
                  "64K (65536 bytes)"),
            1)
      << all;
  // The value used is the rounded one, on every communicator.
  EXPECT_EQ(count(lines, "buffsize 65536 "), 8) << all;
  EXPECT_EQ(count(lines, "NCCL version "), 1) << all;
  // The ranks talk over TCP (NCCL_SHM_DISABLE honoured).
  EXPECT_EQ(count(lines, "via shm"), 0) << all;
}

// NCCL_DEBUG (and the log file) from the config file NCCL_CONF_FILE names.
TEST(ParamsEnv, NcclDebugFromNcclConfFileTakesEffect) {
  const std::string log = tempPath("conf.log");
  const std::string conf = tempPath("conf");
  std::ofstream(conf) << "NCCL_DEBUG=INFO\nNCCL_DEBUG_SUBSYS=INIT,ENV\nNCCL_DEBUG_FILE=" << log
                      << "\nNCCL_IB_HCA=mlx5_1\n";
  {
    Env env(std::vector<std::pair<const char*, const char*>>{{"NCCL_CONF_FILE", conf.c_str()}});
    params::resetForTesting();
    log::reset();
    runRanks(2, [](int, ncclComm_t) {});
  }
  params::resetForTesting();
  log::reset();
  const auto lines = readLines(log);
  std::remove(log.c_str());
  std::remove(conf.c_str());
  const std::string all = joined(lines);
  EXPECT_EQ(count(lines, "Init COMPLETE"), 2) << all;
  EXPECT_EQ(count(lines, "NCCL INFO NCCL_DEBUG set by config file " + conf + " to INFO."), 1)
      << all;
  EXPECT_EQ(
      count(lines, "NCCL WARN NCCL_IB_HCA=mlx5_1 (from config file " + conf + ") has no effect: "),
      1)
      << all;
}

}  // namespace
}  // namespace tutti::test
