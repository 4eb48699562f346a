// tutti-conformance: runs tutti's backend conformance checks against one
// device backend plugin, as a vendor does before shipping it.
//
//   tutti-conformance [--check NAME[,NAME...]] [--verbose] PLUGIN
//   tutti-conformance --list
//
// PLUGIN is a path to the plugin's .so (anything containing '/'), or a
// backend name resolved the way TUTTI_BACKEND_PLUGIN is: the file
// libtutti-backend-<name>.so in P/lib/tutti of this installation, then in
// each directory of TUTTI_PLUGIN_PATH; "cpu" is the built-in reference.
//
// The plugin is loaded by tutti's own loader (core::Backend::load, linked in
// statically): the same dlopen, entry-point call and table checks (ABI
// version, size, name, every required function) as in libtutti.so. Then the
// checks of tests/device/conformance_test.cc run (the same GoogleTest tests
// ctest runs), each printed as one PASS / FAIL / SKIP row with the first
// failures under it, then a summary.
//
// Exit status: 0 when every check that ran passed, 1 when one failed (or
// crashed), 2 on bad usage or when the plugin cannot be loaded or started
// (the reason is printed: file not found, dlopen's message, no entry symbol,
// ABI version or table size mismatch, entry returned NULL, a required
// function is NULL, init() failed).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/plugins.h"
#include "tests/device/conformance_checks.h"

namespace tutti {
namespace {

constexpr int kExitPass = 0, kExitFail = 1, kExitUsage = 2;

void usage(FILE* out) {
  fprintf(out,
          "usage: tutti-conformance [--check NAME[,NAME...]] [--verbose] PLUGIN\n"
          "       tutti-conformance --list\n"
          "Runs tutti's device backend conformance checks against PLUGIN: a path to\n"
          "libtutti-backend-<name>.so, or a backend name found in this installation's\n"
          "lib/tutti or in TUTTI_PLUGIN_PATH (\"cpu\": the built-in reference).\n"
          "  --check NAMES  run only these checks (comma-separated; see --list)\n"
          "  --list         print the names of the checks and exit\n"
          "  --verbose, -v  also print GoogleTest's own output\n"
          "Exit status: 0 all checks passed, 1 a check failed, 2 bad usage or the\n"
          "plugin cannot be loaded.\n");
}

int usageError(const std::string& msg) {
  fprintf(stderr, "tutti-conformance: %s\n", msg.c_str());
  fprintf(stderr, "run 'tutti-conformance --help' for usage\n");
  return kExitUsage;
}

// "ReduceEveryTypeAndOperator/xpu_emu" -> "ReduceEveryTypeAndOperator".
std::string checkName(const char* testName) {
  std::string n = testName;
  auto slash = n.find('/');
  return slash == std::string::npos ? n : n.substr(0, slash);
}

std::vector<std::string> registeredChecks() {
  std::vector<std::string> out;
  std::set<std::string> seen;
  auto* ut = ::testing::UnitTest::GetInstance();
  for (int i = 0; i < ut->total_test_suite_count(); ++i) {
    const auto* suite = ut->GetTestSuite(i);
    for (int j = 0; j < suite->total_test_count(); ++j) {
      std::string n = checkName(suite->GetTestInfo(j)->name());
      if (seen.insert(n).second) out.push_back(n);
    }
  }
  return out;
}

// The check running now, for the crash handler (plain storage: read in a
// signal handler).
char g_current[128];

void onCrash(int sig) {
  const char* what = sig == SIGSEGV  ? "SIGSEGV"
                     : sig == SIGBUS ? "SIGBUS"
                     : sig == SIGFPE ? "SIGFPE"
                     : sig == SIGILL ? "SIGILL"
                                     : "SIGABRT";
  const char* parts[] = {"  FAIL  ", g_current, ": crashed with ", what,
                         "\ntutti-conformance: FAIL (a check crashed the process; the "
                         "remaining checks did not run)\n"};
  for (const char* p : parts) {
    ssize_t ignored = write(STDOUT_FILENO, p, strlen(p));
    (void)ignored;
  }
  _exit(kExitFail);
}

// One row per check: PASS / FAIL / SKIP, the time, and what went wrong.
class TablePrinter : public ::testing::EmptyTestEventListener {
 public:
  int passed = 0, failed = 0, skipped = 0;

 private:
  void OnTestStart(const ::testing::TestInfo& info) override {
    snprintf(g_current, sizeof(g_current), "%s", checkName(info.name()).c_str());
    notes_.clear();
    start_ = std::chrono::steady_clock::now();
  }
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (notes_.size() >= 3) {
      if (notes_.size() == 3) notes_.push_back("(more failures not shown)");
      return;
    }
    // At most a few lines of each message; SCOPED_TRACE's lines ("Google
    // Test trace:" then "file:line: datatype 7 op 2 ...") become "while: ...".
    std::istringstream ss(r.message());
    std::string line, kept;
    bool trace = false;
    for (int n = 0; std::getline(ss, line) && n < 10;) {
      if (line == "Google Test trace:") {
        trace = true;
        continue;
      }
      if (trace) {
        auto colon = line.find(": ");
        line = "while: " + (colon == std::string::npos ? line : line.substr(colon + 2));
      }
      kept += (n++ ? "\n      " : "") + line;
    }
    if (r.skipped()) {
      notes_.push_back(kept);
    } else {
      const char* file = r.file_name() ? r.file_name() : "";
      const char* base = strrchr(file, '/');
      notes_.push_back(std::string(base ? base + 1 : file) + ":" + std::to_string(r.line_number()) +
                       ": " + kept);
    }
  }
  void OnTestEnd(const ::testing::TestInfo& info) override {
    const auto* res = info.result();
    const char* verdict = "PASS";
    if (res->Skipped()) {
      verdict = "SKIP";
      ++skipped;
    } else if (res->Failed()) {
      verdict = "FAIL";
      ++failed;
    } else {
      ++passed;
    }
    const long ms = static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          std::chrono::steady_clock::now() - start_)
                                          .count());
    printf("  %s  %-34s %8ld ms\n", verdict, checkName(info.name()).c_str(), ms);
    if (!res->Passed() || res->Skipped())
      for (const auto& n : notes_) printf("      %s\n", n.c_str());
    fflush(stdout);
  }

  std::vector<std::string> notes_;
  std::chrono::steady_clock::time_point start_;
};

// What the plugin offers, before the checks (kernels left NULL run on the
// host through staging, which the checks then exercise).
void describe(core::Backend& b, const std::string& arg) {
  const tuttiBackendPlugin_v1& t = b.table();
  printf("tutti-conformance: backend '%s' from %s\n", b.name().c_str(),
         b.origin() == "built-in" ? "built-in (the CPU reference)" : b.origin().c_str());
  if (arg != b.origin() && b.origin() != "built-in") printf("  resolved from '%s'\n", arg.c_str());
  auto n = b.deviceCount();
  printf("  plugin ABI version %u; devices: %s; capabilities 0x%llx\n", t.abiVersion,
         n ? std::to_string(n.value()).c_str() : n.status().message().c_str(),
         static_cast<unsigned long long>(t.capabilities));
  struct {
    const char* name;
    bool present;
  } optional[] = {
      {"reduce", t.reduce != nullptr},     {"castScaled", t.castScaled != nullptr},
      {"pack1bit", t.pack1bit != nullptr}, {"unpack1bit", t.unpack1bit != nullptr},
      {"gemm", t.gemm != nullptr},         {"orthogonalize", t.orthogonalize != nullptr}};
  std::string native, host;
  for (const auto& o : optional) (o.present ? native : host) += std::string(" ") + o.name;
  printf("  kernels of its own:%s\n", native.empty() ? " none" : native.c_str());
  if (!host.empty() && !b.hostOnly())
    printf("  kernels run by tutti on the host (NULL in the table):%s\n", host.c_str());
  printf("  IPC: %s\n", b.hasIpc() ? "ipcExport/ipcImport/ipcClose"
                                   : "none (peers stage through pinned host memory)");
  printf("  stream ordering: %s; setDevice: %s\n",
         b.hasHostEvents() ? "host events (hostEventCreate/hostEventSignal)"
                           : "none (tutti blocks the caller until an operation completes)",
         t.setDevice ? "yes" : "no (only the current device)");
  printf("  stream waits: %s\n", b.hasHostFuncs()
                                     ? "launchHostFunc (the engine sleeps until a queue arrives)"
                                     : "none (the engine polls eventQuery)");
  printf("  PCI bus id: %s\n", b.hasPciBusId()
                                   ? "devicePciBusId (the engine thread runs near the device)"
                                   : "none (the engine thread keeps the caller's CPUs)");
}

int run(int argc, char** argv) {
  std::string plugin, checks;
  bool list = false, verbose = false;
  std::vector<std::string> gtestArgs = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      usage(stdout);
      return kExitPass;
    } else if (a == "--list") {
      list = true;
    } else if (a == "-v" || a == "--verbose") {
      verbose = true;
    } else if (a == "--check" || a.rfind("--check=", 0) == 0) {
      if (a == "--check") {
        if (++i == argc) return usageError("--check needs a value");
        checks = argv[i];
      } else {
        checks = a.substr(8);
      }
      if (checks.empty()) return usageError("--check needs a value");
    } else if (a.rfind("--gtest_", 0) == 0) {
      gtestArgs.push_back(a);  // for experts: passed to GoogleTest as is
    } else if (!a.empty() && a[0] == '-') {
      return usageError("unknown option '" + a + "'");
    } else if (!plugin.empty()) {
      return usageError("one PLUGIN only (got '" + plugin + "' and '" + a + "')");
    } else {
      plugin = a;
    }
  }
  if (plugin.empty() && !list) return usageError("no PLUGIN given");

  // Resolve and load it exactly as libtutti.so would; failures end here.
  std::string resolved = plugin.empty() ? "cpu" : plugin;
  if (resolved != "cpu") {
    auto path = core::findPlugin("backend", resolved);
    if (!path) {
      fprintf(stderr, "tutti-conformance: cannot load %s: %s\n", plugin.c_str(),
              path.status().message().c_str());
      return kExitUsage;
    }
    resolved = path.value();
  }
  if (!list) {
    auto b = core::Backend::load(resolved);
    if (!b) {
      fprintf(stderr, "tutti-conformance: cannot load %s: %s\n", plugin.c_str(),
              b.status().message().c_str());
      return kExitUsage;
    }
    describe(*b.value(), plugin);
    fflush(stdout);
  }  // unloaded again: every check loads and initialises it afresh

  conformance::setBackends({resolved});
  std::vector<char*> gargv;
  for (auto& s : gtestArgs) gargv.push_back(s.data());
  int gargc = static_cast<int>(gargv.size());
  gargv.push_back(nullptr);
  ::testing::InitGoogleTest(&gargc, gargv.data());

  const std::vector<std::string> known = registeredChecks();
  if (list) {
    for (const auto& n : known) printf("%s\n", n.c_str());
    return kExitPass;
  }
  if (!checks.empty()) {
    std::string filter;
    std::stringstream ss(checks);
    std::string c;
    while (std::getline(ss, c, ',')) {
      if (c.empty()) continue;
      bool ok = false;
      for (const auto& k : known) ok |= k == c;
      if (!ok) {
        std::string all;
        for (const auto& k : known) all += (all.empty() ? "" : ", ") + k;
        return usageError("unknown check '" + c + "' (checks: " + all + ")");
      }
      filter += (filter.empty() ? "" : ":") + std::string("*Conformance.") + c + "/*";
    }
    ::testing::GTEST_FLAG(filter) = filter;
  }

  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  if (!verbose) delete listeners.Release(listeners.default_result_printer());
  auto* table = new TablePrinter();
  listeners.Append(table);  // owned by GoogleTest
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) signal(sig, onCrash);

  printf("\n  %-4s  %-34s %11s\n", "", "check", "time");
  fflush(stdout);
  const int rc = RUN_ALL_TESTS();
  const int ran = table->passed + table->failed + table->skipped;
  printf("\ntutti-conformance: %d check%s: %d passed, %d failed, %d skipped: %s\n", ran,
         ran == 1 ? "" : "s", table->passed, table->failed, table->skipped,
         table->failed || rc != 0 ? "FAIL" : "PASS");
  if (table->failed || rc != 0) return kExitFail;
  if (table->passed == 0) {
    fprintf(stderr, "tutti-conformance: no check ran on %s\n", plugin.c_str());
    return kExitUsage;
  }
  return kExitPass;
}

}  // namespace
}  // namespace tutti

int main(int argc, char** argv) { return tutti::run(argc, argv); }
