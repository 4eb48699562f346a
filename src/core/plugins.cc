#include "core/plugins.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cstdlib>
#include <sstream>

#include "base/params.h"

namespace tutti::core {
namespace {

// The object this code was linked into: libtutti.so, or a test binary.
std::string ownObjectDir() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<void*>(&ownObjectDir), &info) || !info.dli_fname) return "";
  // Absolute, so that paths found from it stay valid after a chdir (a
  // program's dli_fname is argv[0] as typed, e.g. "./tutti-conformance").
  char* real = realpath(info.dli_fname, nullptr);
  std::string path = real ? real : info.dli_fname;
  free(real);
  auto slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

}  // namespace

std::vector<std::string> pluginSearchDirs() {
  std::vector<std::string> dirs;
  std::string own = ownObjectDir();
  if (!own.empty()) {
    dirs.push_back(own + "/tutti");
    // A program in P/bin that links tutti statically (tutti-conformance)
    // looks where libtutti.so would: P/lib/tutti.
    const std::string bin = "/bin";
    if (own.size() >= bin.size() && own.compare(own.size() - bin.size(), bin.size(), bin) == 0)
      dirs.push_back(own.substr(0, own.size() - bin.size()) + "/lib/tutti");
  }
  std::stringstream ss(params::getStr("TUTTI_PLUGIN_PATH", ""));
  std::string dir;
  while (std::getline(ss, dir, ':'))
    if (!dir.empty()) dirs.push_back(dir);
  return dirs;
}

Result<std::string> findPlugin(const std::string& kind, const std::string& nameOrPath) {
  if (nameOrPath.empty()) return invalidArgument("empty " + kind + " plugin name");
  if (nameOrPath.find('/') != std::string::npos) {
    if (access(nameOrPath.c_str(), R_OK) == 0) return nameOrPath;
    return invalidArgument(kind + " plugin '" + nameOrPath + "' does not exist or is unreadable");
  }
  const std::string file = "libtutti-" + kind + "-" + nameOrPath + ".so";
  std::string searched;
  for (const auto& dir : pluginSearchDirs()) {
    std::string candidate = dir + "/" + file;
    if (access(candidate.c_str(), R_OK) == 0) return candidate;
    searched += (searched.empty() ? "" : ", ") + dir;
  }
  return invalidArgument(kind + " plugin " + file + " not found (searched: " +
                         (searched.empty() ? std::string("nowhere") : searched) +
                         "; set TUTTI_PLUGIN_PATH)");
}

}  // namespace tutti::core
