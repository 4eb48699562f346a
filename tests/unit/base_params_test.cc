// Parameters: parsing, precedence of the environment over config files, and
// the config-file format.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

#include <unistd.h>

#include "core/params.h"

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
}

class ParamsFile : public ::testing::Test {
 protected:
  void SetUp() override {
    // One file per process: ctest runs each test as its own process, in
    // parallel, and a shared name let one test's TearDown delete the file
    // another was reading.
    path_ = ::testing::TempDir() + "tutti_params_test." +
            std::to_string(::getpid()) + ".conf";
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

}  // namespace
}  // namespace tutti::params
