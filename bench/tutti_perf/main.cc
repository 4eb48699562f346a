// tutti-perf: nccl-tests compatible collective benchmark for tutti.
// See docs/tutti-perf.md.

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "bench.h"
#include "launch.h"
#include "options.h"

namespace {

// The plot script installed next to the binary (bench/tutti_perf/plot.py).
std::string plotScript() {
  char self[PATH_MAX];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (len <= 0) return "tutti-perf-plot";
  self[len] = '\0';
  std::string dir(self);
  const size_t slash = dir.rfind('/');
  dir = slash == std::string::npos ? "." : dir.substr(0, slash);
  return dir + "/tutti-perf-plot";
}

// Runs the plot script with `args`; its exit code, or -1 when it cannot run.
int runScript(const std::string& script, const char* const* args) {
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    // Its messages go to stderr; stdout stays the table's.
    dup2(STDERR_FILENO, STDOUT_FILENO);
    execv(script.c_str(), const_cast<char* const*>(args));
    std::fprintf(stderr, "tutti-perf: --plot: cannot run %s: %s\n", script.c_str(),
                 std::strerror(errno));
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

bool fileIsEmpty(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && st.st_size == 0;
}

}  // namespace

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
  const bool local = env.kind == LaunchEnv::Kind::kLocal;
  // Before any rank starts, with --np or under a launcher alike.
  const int nranks = local ? opts.np : env.size;
  if (opts.coll->coll == Coll::kHyperCube && (nranks & (nranks - 1)) != 0) {
    if (env.rank == 0) {
      std::fprintf(stderr,
                   "tutti-perf: hypercube needs a power-of-two number of ranks: %d is not one\n",
                   nranks);
    }
    return kExitUsage;
  }
  if (env.rank == 0) {
    for (const std::string& note : opts.notes)
      std::fprintf(stderr, "tutti-perf: %s\n", note.c_str());
  }
  // Before any rank starts: what the flags need from tutti (each rank checks
  // again when it runs). Under a launcher, rank 0 says why.
  if (!checkLibrarySupport(opts, &error)) {
    if (env.rank == 0) std::fprintf(stderr, "tutti-perf: %s\n", error.c_str());
    return kExitUsage;
  }
  // --plot: the script and matplotlib are checked before a long run, and the
  // results go through a JSON file (a temporary one without -J).
  const bool plot = !opts.plot_path.empty() && env.rank == 0;
  const std::string script = plotScript();
  bool temp_json = false;
  if (plot) {
    const char* check[] = {script.c_str(), "--check", nullptr};
    const int rc = access(script.c_str(), X_OK) == 0 ? runScript(script, check) : -1;
    if (rc != 0) {
      if (rc < 0) {
        std::fprintf(stderr, "tutti-perf: --plot: %s is missing (it comes with tutti-perf)\n",
                     script.c_str());
      }
      return kExitUsage;
    }
    if (opts.json_path.empty()) {
      char tmpl[] = "/tmp/tutti-perf-XXXXXX.json";
      const int fd = mkstemps(tmpl, 5);
      if (fd < 0) {
        std::fprintf(stderr, "tutti-perf: --plot: cannot create a temporary file: %s\n",
                     std::strerror(errno));
        return kExitError;
      }
      close(fd);
      opts.json_path = opts.json_file = tmpl;
      temp_json = true;
    }
  }
  // -J: the launching process creates the file, so that bad paths fail
  // before any rank starts; under a launcher rank 0 does it when it runs.
  if (local && !opts.json_path.empty() && opts.json_file.empty()) {
    if (!createJsonFile(opts.json_path, &opts.json_file, &error)) {
      std::fprintf(stderr, "tutti-perf: -J/--output_file: %s\n", error.c_str());
      return kExitUsage;
    }
  }
  int rc = local ? runForked(opts) : runLaunched(opts, env);
  const std::string json = local ? opts.json_file : jsonFileWritten();
  if (!json.empty() && fileIsEmpty(json)) {
    // The run stopped before rank 0 wrote anything: no empty .json left behind.
    unlink(json.c_str());
    return rc;
  }
  if (plot && !json.empty() && (rc == kExitOk || rc == kExitWrongResults)) {
    const char* args[] = {script.c_str(), "-o", opts.plot_path.c_str(), json.c_str(), nullptr};
    const int prc = runScript(script, args);
    if (prc != 0) {
      std::fprintf(stderr, "tutti-perf: --plot: %s failed (exit code %d)\n", script.c_str(), prc);
      if (rc == kExitOk) rc = kExitError;
    }
  }
  if (temp_json) unlink(json.c_str());
  return rc;
}
