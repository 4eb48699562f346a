// Fuzz target: topo::loadXml (topology/topology.h), which reads a topology
// file (TUTTI_TOPO_FILE, tutti-topo --load) through hwloc's XML reader:
// libxml2's when libhwloc-plugins is installed, else (or with
// HWLOC_LIBXML=0) hwloc's own minimal parser. The input is the file's
// content (an anonymous memory file, named by /proc/self/fd).
//
// Inputs that crash hwloc 2.9 (Debian 12) itself, in bugs fixed upstream,
// are refused by loadXml (topology/xml_guard.h): by the patterns when they
// know the kind, else because hwloc crashed reading it in another process
// first. In this single-threaded process that is a forked child, which
// scripts/fuzz.sh keeps so by running this target without libFuzzer's
// memory-watching thread (-rss_limit_mb=0 -malloc_limit_mb=2048). A crash
// found here is then one of loadXml itself, or of hwloc on what the child
// read without crashing; a new kind the patterns could name precisely may
// join them.
//
// Invariants (a violation traps), for a file that loads:
// - what topology.h promises of a Topology: NUMA nodes in ascending OS index
//   and their distance matrix square (or empty); CPU lists ascending; every
//   device's NUMA node one of the nodes (or -1) and its nearest NIC a NIC of
//   the list (or -1); caches in ascending level;
// - describe() and toJson() produce text;
// - "A dumped file loads back to an equal Topology": dumpXml then loadXml
//   gives a Topology equal to the first.
#include <dirent.h>
#include <hwloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_input.h"
#include "topology/topology.h"

// A sanitizer's (sanitizer/common_interface_defs.h); weak, for the replay
// build without one.
extern "C" void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

namespace {

using tutti::topo::Topology;

struct Files {
  int inputFd = -1;
  std::string input;  // /proc/self/fd/N of inputFd
  std::string dir;    // scratch directory for the dump
  std::string dump;
};

Files& files() {
  static Files* f = [] {
    auto* f = new Files();
    // hwloc loads (dlopen) its plugins, libxml2's reader among them, when the
    // first topology is created and unloads them with the last; one kept
    // for the whole run saves that on every input.
    static hwloc_topology_t keep;
    hwloc_topology_init(&keep);
    // The child that reads each input first (xml_guard.h) is this process's
    // fork: a sanitizer's report of a crash there would run libFuzzer's
    // death callback and save the input as a crash of this process.
    pthread_atfork(nullptr, nullptr, [] {
      if (__sanitizer_set_death_callback) __sanitizer_set_death_callback(nullptr);
    });
    f->inputFd = memfd_create("tutti-fuzz-topology", 0);
    if (f->inputFd < 0) {
      std::perror("memfd_create");
      abort();
    }
    f->input = "/proc/self/fd/" + std::to_string(f->inputFd);
    // The dump's directory is named after this process; those of processes
    // gone (a crash skips the clean-up at exit) are removed here.
    const std::string base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    const std::string prefix = "tutti-fuzz-topology.";
    if (DIR* d = opendir(base.c_str())) {
      while (dirent* e = readdir(d)) {
        const std::string name = e->d_name;
        if (name.compare(0, prefix.size(), prefix) != 0) continue;
        const long pid = std::strtol(name.c_str() + prefix.size(), nullptr, 10);
        if (pid > 0 && kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) {
          unlink((base + "/" + name + "/dump.xml").c_str());
          rmdir((base + "/" + name).c_str());
        }
      }
      closedir(d);
    }
    f->dir = base + "/" + prefix + std::to_string(getpid());
    if (mkdir(f->dir.c_str(), 0700) != 0 && errno != EEXIST) {
      std::perror("mkdir");
      abort();
    }
    f->dump = f->dir + "/dump.xml";
    atexit([] {
      unlink(files().dump.c_str());
      rmdir(files().dir.c_str());
    });
    return f;
  }();
  return *f;
}

bool ascending(const std::vector<int>& v) { return std::is_sorted(v.begin(), v.end()); }

void checkTopology(const Topology& t) {
  for (size_t i = 1; i < t.numaNodes.size(); ++i)
    FUZZ_CHECK(t.numaNodes[i - 1].osIndex < t.numaNodes[i].osIndex);
  for (const auto& n : t.numaNodes) FUZZ_CHECK(ascending(n.cpus));
  for (const auto& p : t.packages) FUZZ_CHECK(ascending(p.cpus));
  if (!t.numaDistances.empty()) {
    FUZZ_CHECK(t.numaDistances.size() == t.numaNodes.size());
    for (const auto& row : t.numaDistances) FUZZ_CHECK(row.size() == t.numaNodes.size());
  }
  for (size_t i = 1; i < t.caches.size(); ++i)
    FUZZ_CHECK(t.caches[i - 1].level <= t.caches[i].level);
  for (const auto& d : t.pci) {
    FUZZ_CHECK(d.numaNode == -1 || t.numa(d.numaNode) != nullptr);
    FUZZ_CHECK(d.nearestNuma == -1 || t.numa(d.nearestNuma) != nullptr);
    if (d.nearestNic != -1) {
      FUZZ_CHECK(d.nearestNic >= 0 && static_cast<size_t>(d.nearestNic) < t.pci.size());
      FUZZ_CHECK(t.pci[d.nearestNic].kind == tutti::topo::PciKind::kNic);
    }
    FUZZ_CHECK(!d.name().empty());
  }
}

}  // namespace

// hwloc 2.9.0 leaks the object it was importing when a file turns out
// malformed (an unknown element inside a NUMANode, say): LeakSanitizer is
// told to ignore allocations made inside libhwloc. tutti's own hold on a
// topology (topology.cc's HwlocTree) is not inside libhwloc.
extern "C" const char* __lsan_default_suppressions() { return "leak:libhwloc.so\n"; }

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Files& f = files();
  if (ftruncate(f.inputFd, 0) != 0 ||
      pwrite(f.inputFd, data, size, 0) != static_cast<ssize_t>(size)) {
    std::perror("writing the input");
    abort();
  }
  auto loaded = tutti::topo::loadXml(f.input);
  if (!loaded.isOk()) {
    FUZZ_CHECK(!loaded.status().message().empty());
    return 0;
  }
  const Topology& t = *loaded;
  checkTopology(t);
  FUZZ_CHECK(!tutti::topo::describe(t).empty());
  FUZZ_CHECK(!tutti::topo::toJson(t).empty());

  auto st = tutti::topo::dumpXml(t, f.dump);
  FUZZ_CHECK(st.isOk());
  auto again = tutti::topo::loadXml(f.dump);
  if (!again.isOk()) std::fprintf(stderr, "reload failed: %s\n", again.status().message().c_str());
  FUZZ_CHECK(again.isOk());
  FUZZ_CHECK(*again == t);
  return 0;
}
