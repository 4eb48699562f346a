// tutti-perf: nccl-tests compatible collective benchmark for tutti.
// See docs/tutti-perf.md.

#include <cstdio>
#include <string>

#include "bench.h"
#include "launch.h"
#include "options.h"

int main(int argc, char** argv) {
  using namespace tutti::perf;
  Options opts;
  switch (parseOptions(argc, argv, &opts)) {
    case ParseResult::kHelp:
      return kExitOk;
    case ParseResult::kError:
      return kExitUsage;
    case ParseResult::kOk:
      break;
  }
  LaunchEnv env;
  std::string error;
  if (!detectLaunch(&env, &error)) {
    std::fprintf(stderr, "tutti-perf: %s\n", error.c_str());
    return kExitUsage;
  }
  // Before any rank starts: what the flags need from tutti (each rank checks
  // again when it runs). Under a launcher, rank 0 says why.
  if (!checkLibrarySupport(opts, &error)) {
    if (env.rank == 0) std::fprintf(stderr, "tutti-perf: %s\n", error.c_str());
    return kExitUsage;
  }
  if (env.kind == LaunchEnv::Kind::kLocal) return runForked(opts);
  return runLaunched(opts, env);
}
