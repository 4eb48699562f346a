// Plugin lookup order: next to the library first, then TUTTI_PLUGIN_PATH.
#include "core/plugins.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

namespace tutti::core {
namespace {

// A fresh directory per run, so files of an earlier run cannot interfere.
std::string makeDir(const std::string& name) {
  std::string tmpl = ::testing::TempDir() + name + "_XXXXXX";
  char* d = mkdtemp(tmpl.data());
  return d ? std::string(d) : std::string();
}

TEST(Plugins, SearchesBesideTheLibraryThenThePluginPath) {
  std::string a = makeDir("tutti_plugins_a"), b = makeDir("tutti_plugins_b");
  setenv("TUTTI_PLUGIN_PATH", (a + "::" + b).c_str(), 1);
  auto dirs = pluginSearchDirs();
  ASSERT_EQ(dirs.size(), 3u);
  EXPECT_EQ(dirs[0].substr(dirs[0].size() - 6), "/tutti");
  EXPECT_EQ(dirs[1], a);
  EXPECT_EQ(dirs[2], b);

  std::ofstream(b + "/libtutti-backend-fake.so") << "x";
  auto found = findPlugin("backend", "fake");
  ASSERT_TRUE(found.isOk()) << found.status().message();
  EXPECT_EQ(found.value(), b + "/libtutti-backend-fake.so");
  std::ofstream(a + "/libtutti-backend-fake.so") << "x";  // earlier directory wins
  EXPECT_EQ(findPlugin("backend", "fake").value(), a + "/libtutti-backend-fake.so");

  auto missing = findPlugin("backend", "nosuch");
  ASSERT_FALSE(missing.isOk());
  EXPECT_NE(missing.status().message().find(b), std::string::npos) << missing.status().message();
  EXPECT_NE(missing.status().message().find("libtutti-backend-nosuch.so"), std::string::npos);

  EXPECT_TRUE(findPlugin("backend", a + "/libtutti-backend-fake.so").isOk());
  EXPECT_FALSE(findPlugin("backend", a + "/none.so").isOk());
  EXPECT_FALSE(findPlugin("backend", "").isOk());
  unsetenv("TUTTI_PLUGIN_PATH");
  for (const auto& d : {a, b}) {
    std::remove((d + "/libtutti-backend-fake.so").c_str());
    rmdir(d.c_str());
  }
}

}  // namespace
}  // namespace tutti::core
