// Parameters: parsing, precedence of the environment over config files, the
// config-file format, the registry of NCCL_* / TUTTI_* names (what tutti does
// with each), the "set by environment" INFO lines, the WARN for settings that
// have no effect, and the logger's own settings coming from config files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "base/log.h"
#include "base/params.h"

namespace tutti::params {
namespace {

TEST(Params, ParseIntAcceptsSuffixesAndRejectsGarbage) {
  EXPECT_EQ(parseInt("0"), 0);
  EXPECT_EQ(parseInt("123"), 123);
  EXPECT_EQ(parseInt("-7"), -7);
  EXPECT_EQ(parseInt("0x10"), 16);
  EXPECT_EQ(parseInt("4K"), 4096);
  EXPECT_EQ(parseInt("4k"), 4096);
  EXPECT_EQ(parseInt("2M"), 2 << 20);
  EXPECT_EQ(parseInt("1G"), 1ll << 30);
  EXPECT_EQ(parseInt("3MB"), 3 << 20);
  EXPECT_EQ(parseInt(" 12 "), 12);
  EXPECT_FALSE(parseInt(""));
  EXPECT_FALSE(parseInt("abc"));
  EXPECT_FALSE(parseInt("12Q"));
  EXPECT_FALSE(parseInt("4KX"));
  EXPECT_FALSE(parseInt("99999999999999999999999"));
  // A suffix that takes the value out of range: malformed (found by
  // tests/fuzz/config_file_fuzz.cc; the multiplication overflowed).
  EXPECT_FALSE(parseInt("9223372036854775807K"));
  EXPECT_FALSE(parseInt("-9007199254740993K"));
  EXPECT_FALSE(parseInt("8589934592G"));
  EXPECT_EQ(parseInt("8589934591G"), int64_t{8589934591} << 30);
  EXPECT_EQ(parseInt("-8589934592G"), INT64_MIN);
}

TEST(Params, ConfigTextIsNameEqualsValueLines) {
  using Settings = std::vector<std::pair<std::string, std::string>>;
  EXPECT_EQ(
      parseConfigText("A=1\n# B=2\n  C = three four  # comment\r\nD==x=\n=5\nno equals\nE=\nF=6"),
      (Settings{{"A", "1"}, {"C", "three four"}, {"D", "=x="}, {"E", ""}, {"F", "6"}}));
  EXPECT_EQ(parseConfigText(""), Settings{});
  EXPECT_EQ(parseConfigText("\n\n"), Settings{});
  EXPECT_EQ(parseConfigText("A=1\nA=2\n"), (Settings{{"A", "1"}, {"A", "2"}}));
}

class ParamsFile : public ::testing::Test {
 protected:
  void SetUp() override {
    // One file per process: ctest runs each test as its own process, in
    // parallel, and a shared name let one test's TearDown delete the file
    // another was reading.
    path_ = ::testing::TempDir() + "tutti_params_test." + std::to_string(::getpid()) + ".conf";
    std::ofstream f(path_);
    f << "# a comment line\n"
      << "TUTTI_TEST_A = 42   # trailing comment\n"
      << "TUTTI_TEST_B=hello world\n"
      << "TUTTI_TEST_BOOL=yes\n"
      << "TUTTI_TEST_BAD=12Q\n"
      << "not a setting\n"
      << "=novalue\n";
    f.close();
    setenv("TUTTI_CONF_FILE", path_.c_str(), 1);
    resetForTesting();
  }
  void TearDown() override {
    unsetenv("TUTTI_CONF_FILE");
    unsetenv("TUTTI_TEST_A");
    std::remove(path_.c_str());
    resetForTesting();
  }
  std::string path_;
};

TEST_F(ParamsFile, ValuesComeFromTheFile) {
  EXPECT_EQ(getInt("TUTTI_TEST_A", 0), 42);
  EXPECT_EQ(getStr("TUTTI_TEST_B", ""), "hello world");
  EXPECT_TRUE(getBool("TUTTI_TEST_BOOL", false));
  EXPECT_FALSE(get("TUTTI_TEST_MISSING").has_value());
  EXPECT_EQ(getInt("TUTTI_TEST_MISSING", 9), 9);
}

TEST_F(ParamsFile, EnvironmentOverridesTheFile) {
  setenv("TUTTI_TEST_A", "7", 1);
  EXPECT_EQ(getInt("TUTTI_TEST_A", 0), 7);
}

TEST_F(ParamsFile, MalformedValuesFallBackToTheDefault) {
  EXPECT_EQ(getInt("TUTTI_TEST_BAD", 5), 5);
  setenv("TUTTI_TEST_A", "lots", 1);
  EXPECT_EQ(getInt("TUTTI_TEST_A", 3), 3);
}

TEST(Params, BooleanSpellings) {
  for (const char* t : {"1", "true", "YES", "on"}) {
    setenv("TUTTI_TEST_FLAG", t, 1);
    EXPECT_TRUE(getBool("TUTTI_TEST_FLAG", false)) << t;
  }
  for (const char* f : {"0", "false", "No", "off", ""}) {
    setenv("TUTTI_TEST_FLAG", f, 1);
    EXPECT_FALSE(getBool("TUTTI_TEST_FLAG", true)) << f;
  }
  unsetenv("TUTTI_TEST_FLAG");
}

// ---- the registry --------------------------------------------------------------------

TEST(ParamsRegistry, ExactEntriesWinOverPrefixes) {
  ASSERT_NE(findKnown("NCCL_SHM_DISABLE"), nullptr);
  EXPECT_EQ(findKnown("NCCL_SHM_DISABLE")->effect, Effect::kHonoured);
  ASSERT_NE(findKnown("NCCL_SHM_USE_CUDA_MEMCPY"), nullptr);
  EXPECT_EQ(findKnown("NCCL_SHM_USE_CUDA_MEMCPY")->effect, Effect::kNoEffect);
  EXPECT_EQ(findKnown("NCCL_P2P_DISABLE")->effect, Effect::kDifferent);
  EXPECT_EQ(findKnown("NCCL_P2P_LEVEL")->effect, Effect::kNoEffect);
  EXPECT_EQ(findKnown("NCCL_IB_HCA")->effect, Effect::kNoEffect);
  EXPECT_EQ(findKnown("NCCL_IB_GID_INDEX")->effect, Effect::kNoEffect);
  EXPECT_EQ(findKnown("NCCL_NET")->effect, Effect::kDifferent);  // IB: no effect (comm.cc)
  EXPECT_EQ(findKnown("NCCL_NET_PLUGIN")->effect, Effect::kHonoured);
  EXPECT_EQ(findKnown("NCCL_NET_GDR_LEVEL")->effect, Effect::kNoEffect);
  EXPECT_EQ(findKnown("NCCL_TESTS_MIN_BW")->effect, Effect::kNotLibrary);
  EXPECT_EQ(findKnown("NCCL_IB_"), nullptr);  // a prefix alone names nothing
  EXPECT_EQ(findKnown("NCCL_NO_SUCH_THING"), nullptr);
}

std::string sourceRoot() {
  std::string here = __FILE__;  // tests/unit/base_params_test.cc
  for (int i = 0; i < 3; ++i) here = here.substr(0, here.find_last_of('/'));
  return here;
}

std::string readFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Every NCCL_* / TUTTI_* name the code spells is in the registry, so the
// init-time scan never calls a variable tutti reads unknown.
TEST(ParamsRegistry, KnowsEveryNameTheSourcesRead) {
  namespace fs = std::filesystem;
  const std::string root = sourceRoot();
  if (!fs::exists(root + "/src/base/params.cc")) GTEST_SKIP() << "no source tree at " << root;
  const std::regex literal(R"re("((NCCL|TUTTI)_[A-Z0-9_]+)")re");
  std::set<std::string> names;
  for (const char* dir : {"src", "backends", "transports", "topology", "bench"}) {
    if (!fs::exists(root + "/" + dir)) continue;
    for (const auto& e : fs::recursive_directory_iterator(root + "/" + dir)) {
      const std::string ext = e.path().extension().string();
      if (ext != ".cc" && ext != ".h" && ext != ".c") continue;
      if (e.path().filename() == "params.cc") continue;  // the registry itself
      const std::string text = readFile(e.path().string());
      for (std::sregex_iterator it(text.begin(), text.end(), literal), end; it != end; ++it)
        names.insert((*it)[1].str());
    }
  }
  EXPECT_GT(names.size(), 30u);
  for (const std::string& n : names)
    EXPECT_NE(findKnown(n), nullptr) << n << " is not in the registry";
  // The NCCL_* names the code reads are honoured, except NCCL_TOPO_FILE, read
  // only to say that it is ignored.
  for (const std::string& n : names) {
    if (n.rfind("NCCL_", 0) == 0 && n != "NCCL_TOPO_FILE" && findKnown(n)) {
      EXPECT_NE(findKnown(n)->effect, Effect::kNoEffect) << n;
    }
  }
}

// docs/env.md names every registry entry (prefixes as NCCL_IB_*).
TEST(ParamsRegistry, DocsNameEveryEntry) {
  const std::string doc = readFile(sourceRoot() + "/docs/env.md");
  if (doc.empty()) GTEST_SKIP() << "no docs/env.md";
  for (const Known& k : registry()) {
    const std::string spelled = std::string("`") + k.name + (k.prefix ? "*`" : "`");
    EXPECT_NE(doc.find(spelled), std::string::npos) << spelled << " is not in docs/env.md";
  }
}

// ---- the environment as tutti sees it -------------------------------------------------

// Sets variables for a test and removes them after it, with the params and
// log state reset both ways.
class ParamsEnv : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = ::testing::TempDir() + "tutti_params_env." + std::to_string(::getpid());
    logPath_ = base_ + ".log";
    std::remove(logPath_.c_str());
  }
  void TearDown() override {
    for (const std::string& n : names_) unsetenv(n.c_str());
    resetForTesting();
    log::reset();
    std::remove(logPath_.c_str());
    for (const std::string& f : files_) std::remove(f.c_str());
  }
  void set(const std::string& name, const std::string& value) {
    setenv(name.c_str(), value.c_str(), 1);
    names_.push_back(name);
  }
  std::string writeConf(const std::string& suffix, const std::string& text) {
    const std::string path = base_ + suffix;
    std::ofstream(path) << text;
    files_.push_back(path);
    return path;
  }
  // Logs at INFO, all subsystems, to logPath_.
  void logToFile() {
    set("NCCL_DEBUG", "INFO");
    set("NCCL_DEBUG_SUBSYS", "ALL");
    set("NCCL_DEBUG_FILE", logPath_);
    resetForTesting();
    log::reset();
  }
  // The log so far (closing the file).
  std::vector<std::string> logLines() {
    for (const char* n : {"NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"}) unsetenv(n);
    log::reset();
    std::vector<std::string> out;
    std::ifstream in(logPath_);
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
  }
  static int count(const std::vector<std::string>& lines, const std::string& what) {
    return static_cast<int>(std::count_if(lines.begin(), lines.end(), [&](const std::string& l) {
      return l.find(what) != std::string::npos;
    }));
  }
  std::string base_, logPath_;
  std::vector<std::string> names_, files_;
};

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& l : v) s += l + "\n";
  return s;
}

TEST_F(ParamsEnv, IneffectiveSettingsNamesTodaysIgnoredListAndNotTheHonouredOnes) {
  set("NCCL_IB_HCA", "mlx5_0");
  set("NCCL_NTHREADS", "256");
  set("NCCL_TOPO_DUMP_FILE", "/tmp/nccl_topo.xml");
  set("NCCL_TOPO_FILE", "/tmp/nccl_in.xml");
  set("NCCL_PROTO", "LL128");
  set("NCCL_TUTTI_TYPO", "1");
  // Honoured (or read by other programs): never named.
  set("NCCL_SHM_DISABLE", "1");
  set("NCCL_SOCKET_IFNAME", "lo");
  set("NCCL_BUFFSIZE", "8M");
  set("NCCL_ALGO", "ring");
  set("NCCL_P2P_DISABLE", "1");
  set("NCCL_MAX_NCHANNELS", "4");
  set("NCCL_TESTS_MIN_BW", "1");
  set("NCCL_ASYNC_ERROR_HANDLING", "1");
  set("NCCL_NET", "Socket");
  set("NCCL_NET_PLUGIN", "aws-ofi");
  resetForTesting();
  const std::vector<std::string> msgs = ineffectiveSettings();
  const std::string all = joined(msgs);
  auto has = [&](const std::string& prefix) {
    return std::count_if(msgs.begin(), msgs.end(),
                         [&](const std::string& m) { return m.rfind(prefix, 0) == 0; });
  };
  EXPECT_EQ(has("NCCL_IB_HCA=mlx5_0 has no effect: tutti has no InfiniBand transport"), 1) << all;
  EXPECT_EQ(has("NCCL_NTHREADS=256 has no effect: tutti's host kernels do not use it"), 1) << all;
  EXPECT_EQ(has("NCCL_TOPO_DUMP_FILE=/tmp/nccl_topo.xml has no effect: "), 1) << all;
  EXPECT_NE(all.find("TUTTI_TOPO_DUMP_FILE"), std::string::npos) << all;  // says what to use
  EXPECT_EQ(has("NCCL_TOPO_FILE=/tmp/nccl_in.xml has no effect: "), 1) << all;
  EXPECT_NE(all.find("hwloc XML from TUTTI_TOPO_FILE"), std::string::npos) << all;
  EXPECT_EQ(has("NCCL_PROTO=LL128 has no effect: "), 1) << all;
  EXPECT_EQ(has("NCCL_TUTTI_TYPO=1 has no effect: tutti does not know this variable"), 1) << all;
  for (const char* honoured :
       {"NCCL_SHM_DISABLE=", "NCCL_SOCKET_IFNAME=", "NCCL_BUFFSIZE=", "NCCL_ALGO=",
        "NCCL_P2P_DISABLE=", "NCCL_MAX_NCHANNELS=", "NCCL_TESTS_MIN_BW=",
        "NCCL_ASYNC_ERROR_HANDLING=", "NCCL_NET=", "NCCL_NET_PLUGIN="})
    EXPECT_EQ(has(honoured), 0) << honoured << " is honoured:\n" << all;
}

TEST_F(ParamsEnv, IneffectiveSettingsFromAConfigFileSayWhichFile) {
  const std::string conf = writeConf(".conf", "NCCL_IB_HCA=mlx5_1\nNCCL_SHM_DISABLE=1\n");
  set("NCCL_CONF_FILE", conf);
  resetForTesting();
  const std::string all = joined(ineffectiveSettings());
  EXPECT_NE(all.find("NCCL_IB_HCA=mlx5_1 (from config file " + conf + ") has no effect: "),
            std::string::npos)
      << all;
  EXPECT_EQ(all.find("NCCL_SHM_DISABLE"), std::string::npos) << all;
  // The environment wins over the file, in the message too.
  set("NCCL_IB_HCA", "mlx5_0");
  EXPECT_NE(joined(ineffectiveSettings()).find("NCCL_IB_HCA=mlx5_0 has no effect"),
            std::string::npos);
}

TEST_F(ParamsEnv, SetByLinesOncePerVariableInNcclsWording) {
  const std::string conf = writeConf(".conf", "TUTTI_TEST_FROMFILE=42\n");
  set("TUTTI_CONF_FILE", conf);
  set("TUTTI_TEST_FROMENV", "7");
  set("NCCL_SHM_DISABLE", "1");
  set("NCCL_TOPO_FILE", "/tmp/nccl_in.xml");
  logToFile();
  EXPECT_EQ(getInt("TUTTI_TEST_FROMENV", 0), 7);
  EXPECT_EQ(getInt("TUTTI_TEST_FROMENV", 0), 7);
  EXPECT_EQ(getStr("TUTTI_TEST_FROMFILE", ""), "42");
  EXPECT_EQ(getStr("TUTTI_TEST_FROMFILE", ""), "42");
  EXPECT_TRUE(getBool("NCCL_SHM_DISABLE", false));
  EXPECT_TRUE(get("NCCL_TOPO_FILE").has_value());
  EXPECT_FALSE(get("TUTTI_TEST_UNSET").has_value());
  const auto lines = logLines();
  const std::string all = joined(lines);
  EXPECT_EQ(count(lines, "NCCL INFO TUTTI_TEST_FROMENV set by environment to 7."), 1) << all;
  EXPECT_EQ(count(lines, "NCCL INFO TUTTI_TEST_FROMFILE set by config file " + conf + " to 42."), 1)
      << all;
  EXPECT_EQ(count(lines, "NCCL INFO NCCL_SHM_DISABLE set by environment to 1."), 1) << all;
  // A variable with no effect gets its WARN at init, not a "set by" line.
  EXPECT_EQ(count(lines, "NCCL_TOPO_FILE set by"), 0) << all;
  EXPECT_EQ(count(lines, "TUTTI_TEST_UNSET"), 0) << all;
}

TEST_F(ParamsEnv, ReportEnvironmentWarnsOncePerNameAndPrintsTheLoggersOwnLines) {
  set("NCCL_IB_HCA", "mlx5_0");
  set("NCCL_NTHREADS", "256");
  set("NCCL_SOCKET_IFNAME", "lo");
  set("NCCL_CONF_FILE", base_ + ".missing.conf");
  logToFile();
  reportEnvironment();
  reportEnvironment();  // a second communicator: nothing new
  EXPECT_EQ(getStr("NCCL_SOCKET_IFNAME", ""), "lo");
  const auto lines = logLines();
  const std::string all = joined(lines);
  EXPECT_EQ(count(lines, "NCCL WARN NCCL_IB_HCA=mlx5_0 has no effect: "), 1) << all;
  EXPECT_EQ(count(lines, "NCCL WARN NCCL_NTHREADS=256 has no effect: "), 1) << all;
  EXPECT_EQ(count(lines, "NCCL_SOCKET_IFNAME=lo has no effect"), 0) << all;
  EXPECT_EQ(count(lines, "NCCL INFO NCCL_SOCKET_IFNAME set by environment to lo."), 1) << all;
  EXPECT_EQ(count(lines, "NCCL INFO NCCL_DEBUG set by environment to INFO."), 1) << all;
  EXPECT_EQ(count(lines, "NCCL INFO NCCL_DEBUG_FILE set by environment to " + logPath_ + "."), 1)
      << all;
  EXPECT_EQ(count(lines, "NCCL WARN config file NCCL_CONF_FILE=" + base_ + ".missing.conf ("), 1)
      << all;
}

TEST_F(ParamsEnv, BuffSizeBelowTheMinimumIsRaisedWithOneWarn) {
  set("NCCL_BUFFSIZE", "1K");
  logToFile();
  EXPECT_EQ(getIntAtLeast("NCCL_BUFFSIZE", 4 << 20, 64 << 10), 64 << 10);
  EXPECT_EQ(getIntAtLeast("NCCL_BUFFSIZE", 4 << 20, 64 << 10), 64 << 10);
  set("TUTTI_TEST_SIZE", "2M");
  EXPECT_EQ(getIntAtLeast("TUTTI_TEST_SIZE", 4 << 20, 64 << 10), 2 << 20);  // above: as set
  EXPECT_EQ(getIntAtLeast("TUTTI_TEST_UNSET", 4 << 20, 64 << 10), 4 << 20);
  const auto lines = logLines();
  const std::string all = joined(lines);
  EXPECT_EQ(count(lines,
                  "NCCL WARN NCCL_BUFFSIZE=1K is below the minimum tutti accepts; using "
                  "64K (65536 bytes)"),
            1)
      << all;
  EXPECT_EQ(count(lines, "WARN TUTTI_TEST_SIZE"), 0) << all;
}

TEST(Params, FormatSize) {
  EXPECT_EQ(formatSize(65536), "64K");
  EXPECT_EQ(formatSize(4 << 20), "4M");
  EXPECT_EQ(formatSize(int64_t{3} << 30), "3G");
  EXPECT_EQ(formatSize(1000), "1000");
  EXPECT_EQ(formatSize(0), "0");
}

// NCCL_DEBUG* come from config files like every other parameter.
TEST_F(ParamsEnv, NcclDebugFromTheFileNcclConfFileNames) {
  const std::string conf = writeConf(
      ".debug.conf", "NCCL_DEBUG=INFO\nNCCL_DEBUG_SUBSYS=ENV\nNCCL_DEBUG_FILE=" + logPath_ + "\n");
  set("NCCL_CONF_FILE", conf);
  resetForTesting();
  log::reset();
  EXPECT_TRUE(log::enabled(log::Level::kInfo, log::kEnv));
  EXPECT_FALSE(log::enabled(log::Level::kInfo, log::kColl));  // NCCL_DEBUG_SUBSYS=ENV
  reportEnvironment();
  unsetenv("NCCL_CONF_FILE");
  resetForTesting();
  log::reset();  // closes the file
  std::ifstream in(logPath_);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  EXPECT_EQ(count(lines, "NCCL INFO NCCL_DEBUG set by config file " + conf + " to INFO."), 1)
      << joined(lines);
}

TEST_F(ParamsEnv, NcclDebugFromHomeNcclConf) {
  const std::string home = base_ + ".home";
  std::filesystem::create_directories(home);
  { std::ofstream(home + "/.nccl.conf") << "NCCL_DEBUG=WARN\n"; }
  files_.push_back(home + "/.nccl.conf");
  files_.push_back(home);
  const char* oldHome = std::getenv("HOME");
  const std::string saved = oldHome ? oldHome : "";
  setenv("HOME", home.c_str(), 1);
  resetForTesting();
  log::reset();
  const bool warn = log::enabled(log::Level::kWarn, log::kAll);
  const bool info = log::enabled(log::Level::kInfo, log::kInit);
  if (oldHome)
    setenv("HOME", saved.c_str(), 1);
  else
    unsetenv("HOME");
  EXPECT_TRUE(warn);
  EXPECT_FALSE(info);
}

}  // namespace
}  // namespace tutti::params
