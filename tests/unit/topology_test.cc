// Topology: discovery on this machine, the XML round trip with tutti's
// attributes, nearest-device logic on a hand-made two-socket fixture, the
// environment (TUTTI_HOST_ID, TUTTI_TOPO_FILE, TUTTI_TOPO_DUMP_FILE), describe()
// and thread binding.
#include "topology/topology.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <hwloc.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "base/params.h"
#include "base/thread.h"
#include "topology/xml_guard.h"

namespace tutti::topo {
namespace {

std::string fixturePath() {
  std::string here = __FILE__;
  return here.substr(0, here.find_last_of('/')) + "/data/topo_2numa_gpu_nic.xml";
}

std::string tempPath(const std::string& name) {
  return ::testing::TempDir() + "tutti_topo_" + std::to_string(getpid()) + "_" + name;
}

std::string readFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Tests on the hand-made fixture need hwloc's libxml2 reader; without it
// (libhwloc-plugins not installed, or HWLOC_LIBXML=0) they skip, saying why.
#define SKIP_WITHOUT_XML_READER()                                                        \
  if (!hwlocReadsAnyXml())                                                               \
  GTEST_SKIP() << "hwloc cannot read hand-written XML here: its libxml2 reader (Debian " \
                  "package libhwloc-plugins) is not installed or HWLOC_LIBXML=0"

// Unsets the variables the topology reads, before and after each test.
class TopoEnv : public ::testing::Test {
 protected:
  void SetUp() override { clear(); }
  void TearDown() override { clear(); }
  static void clear() {
    for (const char* v :
         {"TUTTI_HOST_ID", "TUTTI_TOPO_FILE", "TUTTI_TOPO_DUMP_FILE", "NCCL_TOPO_FILE"})
      unsetenv(v);
    params::resetForTesting();
  }
};

using TopologyDiscover = TopoEnv;
using TopologyXml = TopoEnv;
using TopologyFixture = TopoEnv;
using TopologyEnv = TopoEnv;

// The CPU ids this process may run on.
std::set<int> allowedCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  std::set<int> out;
  for (int i = 0; i < CPU_SETSIZE; ++i)
    if (CPU_ISSET(i, &set)) out.insert(i);
  return out;
}

std::set<int> threadCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(pthread_getaffinity_np(pthread_self(), sizeof(set), &set), 0);
  std::set<int> out;
  for (int i = 0; i < CPU_SETSIZE; ++i)
    if (CPU_ISSET(i, &set)) out.insert(i);
  return out;
}

// ---- discovery ---------------------------------------------------------------------

TEST_F(TopologyDiscover, CountsMatchTheMachine) {
  auto r = discover();
  ASSERT_TRUE(r.isOk()) << r.status().message();
  const Topology& t = r.value();
  EXPECT_GE(t.puCount, 1);
  EXPECT_GE(t.coreCount, 1);
  EXPECT_LE(t.coreCount, t.puCount);
  ASSERT_GE(t.numaNodes.size(), 1u);
  EXPECT_GE(t.packages.size(), 1u);

  // hwloc on its own (no I/O) agrees.
  hwloc_topology_t h;
  ASSERT_EQ(hwloc_topology_init(&h), 0);
  ASSERT_EQ(hwloc_topology_load(h), 0);
  EXPECT_EQ(t.puCount, hwloc_get_nbobjs_by_type(h, HWLOC_OBJ_PU));
  EXPECT_EQ(t.coreCount, hwloc_get_nbobjs_by_type(h, HWLOC_OBJ_CORE));
  EXPECT_EQ(static_cast<int>(t.numaNodes.size()), hwloc_get_nbobjs_by_type(h, HWLOC_OBJ_NUMANODE));
  hwloc_topology_destroy(h);

  // And so does sysconf, unless a cgroup hides some online CPUs from us.
  long online = sysconf(_SC_NPROCESSORS_ONLN);
  if (static_cast<long>(allowedCpus().size()) == online) {
    EXPECT_EQ(t.puCount, online);
  }

  // Every PU is in exactly one NUMA node's cpu list (nodes without CPUs allowed).
  std::multiset<int> inNodes;
  for (const auto& n : t.numaNodes) {
    inNodes.insert(n.cpus.begin(), n.cpus.end());
    EXPECT_GT(n.localMemoryBytes, 0u) << "NUMA " << n.osIndex;
  }
  EXPECT_EQ(static_cast<int>(inNodes.size()), t.puCount);
  EXPECT_EQ(std::set<int>(inNodes.begin(), inNodes.end()).size(), inNodes.size());
  // The CPUs we run on are among them.
  for (int cpu : allowedCpus()) EXPECT_EQ(inNodes.count(cpu), 1u) << "cpu " << cpu;

  // Caches have sane figures.
  for (const auto& c : t.caches) {
    EXPECT_GE(c.level, 1);
    EXPECT_GT(c.sizeBytes, 0u);
    EXPECT_GE(c.sharedByPus, 1);
    EXPECT_GE(c.count, 1);
  }
  // PCI devices are well-formed; accelerators point at NICs or nothing.
  for (const auto& d : t.pci) {
    EXPECT_EQ(d.busId.size(), 12u) << d.busId;
    if (d.kind == PciKind::kAccelerator && d.nearestNic >= 0) {
      ASSERT_LT(static_cast<size_t>(d.nearestNic), t.pci.size());
      EXPECT_EQ(t.pci[d.nearestNic].kind, PciKind::kNic);
    }
    if (d.numaNode >= 0) {
      EXPECT_EQ(d.nearestNuma, d.numaNode);
    }
  }

  // Identity.
  EXPECT_EQ(t.hostname, localHostName());
  EXPECT_FALSE(t.hostname.empty());
  EXPECT_EQ(t.bootId, localBootId());
  EXPECT_EQ(t.hostId, hostIdOf(t.hostname, t.bootId));
  EXPECT_EQ(t.hostId, localHostId());
  EXPECT_TRUE(t.hwloc != nullptr);
}

TEST_F(TopologyDiscover, IsCachedButIdentityIsNot) {
  auto a = discover();
  ASSERT_TRUE(a.isOk());
  auto b = discover();
  ASSERT_TRUE(b.isOk());
  EXPECT_EQ(a.value(), b.value());
  EXPECT_EQ(a->hwloc.get(), b->hwloc.get());  // same hwloc tree: discovered once

  setenv("TUTTI_HOST_ID", "node-b", 1);
  auto c = discover();
  ASSERT_TRUE(c.isOk());
  EXPECT_NE(c->hostId, a->hostId);
  EXPECT_EQ(c->hostId, localHostId());
}

TEST_F(TopologyDiscover, ConcurrentCallersGetTheSameAnswer) {
  std::vector<Topology> got(4);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i)
    threads.emplace_back([&got, i] {
      auto r = forThisProcess();
      ASSERT_TRUE(r.isOk()) << r.status().message();
      got[i] = r.value();
      (void)describe(got[i]);
    });
  for (auto& t : threads) t.join();
  for (const auto& t : got) {
    EXPECT_TRUE(t == got[0]);
    EXPECT_GE(t.puCount, 1);
  }
}

// ---- identity --------------------------------------------------------------------------

TEST_F(TopologyEnv, HostIdOverride) {
  uint64_t natural = localHostId();
  EXPECT_EQ(natural, hostIdOf(localHostName(), localBootId()));
  setenv("TUTTI_HOST_ID", "fake-node-1", 1);
  uint64_t one = localHostId();
  setenv("TUTTI_HOST_ID", "fake-node-2", 1);
  uint64_t two = localHostId();
  EXPECT_NE(one, natural);
  EXPECT_NE(one, two);
  setenv("TUTTI_HOST_ID", "fake-node-1", 1);
  EXPECT_EQ(localHostId(), one);  // stable
  // FNV-1a 64 of the value: the id bootstrap has always used.
  uint64_t h = 1469598103934665603ull;
  for (char ch : std::string("fake-node-1")) h = (h ^ static_cast<uint8_t>(ch)) * 1099511628211ull;
  EXPECT_EQ(one, h);
  unsetenv("TUTTI_HOST_ID");
  EXPECT_EQ(localHostId(), natural);
}

TEST_F(TopologyEnv, BootIdLooksLikeAUuid) {
  std::string b = localBootId();
  if (b.empty()) GTEST_SKIP() << "/proc/sys/kernel/random/boot_id not readable";
  EXPECT_EQ(b.size(), 36u) << b;
  EXPECT_EQ(b.find('\n'), std::string::npos);
}

// ---- XML round trip ----------------------------------------------------------------------

TEST_F(TopologyXml, DumpLoadRoundTripPreservesEverything) {
  auto d = discover();
  ASSERT_TRUE(d.isOk()) << d.status().message();
  Topology t = d.value();
  t.intraLatencyUs = 1.25;
  t.intraBandwidthGBs = 0.1;  // not exact in binary: must still round-trip
  t.interBandwidthGBs = 12.345678901234567;
  std::string path = tempPath("roundtrip.xml");
  ASSERT_TRUE(dumpXml(t, path).isOk());

  std::string xml = readFile(path);
  EXPECT_NE(xml.find("name=\"TuttiHostname\""), std::string::npos);
  EXPECT_NE(xml.find("name=\"TuttiBootId\""), std::string::npos);
  EXPECT_NE(xml.find(fmt::format("name=\"TuttiHostId\" value=\"0x{:016x}\"", t.hostId)),
            std::string::npos);
  EXPECT_NE(xml.find("name=\"TuttiIntraLatencyUs\" value=\"1.25\""), std::string::npos);
  EXPECT_EQ(xml.find("TuttiInterLatencyUs"), std::string::npos);  // unset stays absent

  auto l = loadXml(path);
  ASSERT_TRUE(l.isOk()) << l.status().message();
  const Topology& u = l.value();
  EXPECT_EQ(u.hostname, t.hostname);
  EXPECT_EQ(u.bootId, t.bootId);
  EXPECT_EQ(u.hostId, t.hostId);
  EXPECT_EQ(u.packages, t.packages);
  EXPECT_EQ(u.numaNodes, t.numaNodes);
  EXPECT_EQ(u.numaDistances, t.numaDistances);
  EXPECT_EQ(u.coreCount, t.coreCount);
  EXPECT_EQ(u.puCount, t.puCount);
  EXPECT_EQ(u.caches, t.caches);
  EXPECT_EQ(u.pci, t.pci);
  EXPECT_EQ(u.intraLatencyUs, 1.25);
  EXPECT_EQ(u.intraBandwidthGBs, 0.1);
  EXPECT_EQ(u.interBandwidthGBs, 12.345678901234567);
  EXPECT_FALSE(u.interLatencyUs.has_value());
  EXPECT_TRUE(u == t);

  // Dumping the loaded one replaces the Tutti* attributes instead of adding more.
  Topology v = u;
  v.intraLatencyUs = 2.5;
  v.intraBandwidthGBs.reset();
  v.hostname = "renamed";
  std::string path2 = tempPath("roundtrip2.xml");
  ASSERT_TRUE(dumpXml(v, path2).isOk());
  std::string xml2 = readFile(path2);
  size_t first = xml2.find("TuttiHostname");
  ASSERT_NE(first, std::string::npos);
  EXPECT_EQ(xml2.find("TuttiHostname", first + 1), std::string::npos);
  EXPECT_EQ(xml2.find("TuttiIntraBandwidthGBs"), std::string::npos);
  auto w = loadXml(path2);
  ASSERT_TRUE(w.isOk()) << w.status().message();
  EXPECT_TRUE(w.value() == v);
  EXPECT_EQ(w->hostname, "renamed");
  EXPECT_EQ(w->hostId, t.hostId);  // recorded id, not recomputed from the new name
  std::remove(path.c_str());
  std::remove(path2.c_str());
}

TEST_F(TopologyXml, HostIdEnvWinsOverTheFile) {
  SKIP_WITHOUT_XML_READER();
  setenv("TUTTI_HOST_ID", "rank-on-node-9", 1);
  auto l = loadXml(fixturePath());
  ASSERT_TRUE(l.isOk()) << l.status().message();
  EXPECT_EQ(l->hostId, localHostId());
  EXPECT_NE(l->hostId, 0xc0ffee07ull);
  EXPECT_EQ(l->hostname, "gpu-node-07");  // the rest of the identity is the file's
}

TEST_F(TopologyXml, PlainLstopoFileTakesHwlocHostName) {
  SKIP_WITHOUT_XML_READER();
  // A file without Tutti* attributes (what lstopo writes).
  std::string path = tempPath("plain.xml");
  std::string xml = readFile(fixturePath());
  for (const char* name : {"TuttiHostname", "TuttiBootId", "TuttiHostId", "TuttiIntraLatencyUs",
                           "TuttiIntraBandwidthGBs"}) {
    size_t at = xml.find(std::string("<info name=\"") + name);
    ASSERT_NE(at, std::string::npos) << name;
    xml.erase(at, xml.find("/>", at) + 2 - at);
  }
  std::ofstream(path) << xml;
  auto l = loadXml(path);
  ASSERT_TRUE(l.isOk()) << l.status().message();
  EXPECT_EQ(l->hostname, "gpu-node-07");
  EXPECT_EQ(l->bootId, "");
  EXPECT_EQ(l->hostId, hostIdOf("gpu-node-07", ""));
  EXPECT_FALSE(l->intraLatencyUs.has_value());
  std::remove(path.c_str());
}

TEST_F(TopologyXml, BadFilesAreClearErrors) {
  Topology handMade;
  EXPECT_EQ(dumpXml(handMade, tempPath("never.xml")).code(), Code::kInvalidArgument);

  auto missing = loadXml("/nonexistent/dir/topo.xml");
  ASSERT_FALSE(missing.isOk());
  EXPECT_NE(missing.status().message().find("/nonexistent/dir/topo.xml"), std::string::npos);
  EXPECT_NE(missing.status().message().find("No such file"), std::string::npos)
      << missing.status().message();

  std::string garbage = tempPath("garbage.xml");
  std::ofstream(garbage) << "this is not xml <topology";
  auto g = loadXml(garbage);
  ASSERT_FALSE(g.isOk());
  EXPECT_NE(g.status().message().find(garbage), std::string::npos) << g.status().message();
  EXPECT_NE(g.status().message().find("hwloc"), std::string::npos) << g.status().message();

  std::remove(garbage.c_str());

  SKIP_WITHOUT_XML_READER();  // the rest edits the hand-made fixture
  std::string badNumber = tempPath("badnumber.xml");
  std::string xml = readFile(fixturePath());
  size_t at = xml.find("value=\"1.5\"");
  ASSERT_NE(at, std::string::npos);
  xml.replace(at, 11, "value=\"fast\"");
  std::ofstream(badNumber) << xml;
  auto b = loadXml(badNumber);
  ASSERT_FALSE(b.isOk());
  EXPECT_NE(b.status().message().find("TuttiIntraLatencyUs"), std::string::npos)
      << b.status().message();
  std::remove(badNumber.c_str());
}

// Files on which hwloc 2.9 crashes (found by fuzzing, topology/xml_guard.h),
// and files it takes that describe no machine, are refused with the reason:
// a typo in a
// hand-edited TUTTI_TOPO_FILE must be an error, not a dead job. Files hwloc
// wrote, and the project's fixtures, pass the guard.
TEST_F(TopologyXml, FilesThatWouldCrashHwlocAreRefusedWithTheReason) {
  std::string xml = readFile(fixturePath());
  ASSERT_FALSE(hwlocCrashReason(xml).has_value());
  auto mine = discover();
  ASSERT_TRUE(mine.isOk());
  std::string dumped = tempPath("mine.xml");
  ASSERT_TRUE(dumpXml(*mine, dumped).isOk());
  EXPECT_FALSE(hwlocCrashReason(readFile(dumped)).has_value()) << readFile(dumped);
  std::remove(dumped.c_str());

  // A one-letter typo: "complete_cpuset" misspelt on one object.
  size_t at = xml.find("complete_cpuset=");
  ASSERT_NE(at, std::string::npos);
  std::string typo = xml;
  typo.replace(at, 15, "complete_cpuzet");
  // A set hwloc would not write.
  std::string badSet = xml;
  at = badSet.find("nodeset=\"");
  ASSERT_NE(at, std::string::npos);
  badSet.insert(at + 9, ",");
  // A NUMA node without its os_index: hwloc's libxml2 reader takes it, as
  // "unknown" (a dump of it was 134 MB of XML, found by fuzzing; hwloc
  // sizes a bitmap by it): refused before hwloc reads it.
  std::string noIndex = xml;
  at = noIndex.find("type=\"NUMANode\" os_index=");
  ASSERT_NE(at, std::string::npos);
  noIndex.replace(at + 16, 8, "os_indey");
  // A root whose cpuset is not within its complete_cpuset, and a stray text
  // line that hides its children from the libxml2 reader: hwloc removes the
  // root and dereferences it ("Topology became empty", found by fuzzing).
  std::string rootEmptied = xml;
  at = rootEmptied.find("complete_cpuset=\"");
  ASSERT_NE(at, std::string::npos);
  rootEmptied.replace(at + 17, rootEmptied.find('"', at + 17) - at - 17, "0x10000000");
  // The root's allowed_cpuset disjoint from its cpuset: the same crash.
  std::string noneAllowed = xml;
  at = noneAllowed.find("allowed_cpuset=\"");
  ASSERT_NE(at, std::string::npos);
  noneAllowed.replace(at + 16, noneAllowed.find('"', at + 16) - at - 16, "0x10000000");
  std::vector<std::tuple<const char*, std::string, const char*>> cases = {
      {"typo.xml", typo, "some but not all of cpuset"},
      {"badset.xml", badSet, "is not a set as hwloc writes it"},
      {"rootemptied.xml", rootEmptied, "cpuset is not within its complete_cpuset"},
      {"noneallowed.xml", noneAllowed, "allows none of the PUs of its cpuset"}};
  cases.emplace_back("noindex.xml", noIndex, "NUMANode object (at byte");
  // These are refused before hwloc reads them, in any process (with threads
  // no child reads the file first).
  for (const auto& [name, text, reason] : cases) {
    auto why = hwlocCrashReason(text);
    ASSERT_TRUE(why.has_value()) << name;
    EXPECT_NE(why->find(reason), std::string::npos) << *why;
  }
  for (const auto& [name, text, reason] : cases) {
    std::string path = tempPath(name);
    std::ofstream(path) << text;
    auto r = loadXml(path);
    ASSERT_FALSE(r.isOk()) << name;
    EXPECT_NE(r.status().message().find(path), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(reason), std::string::npos) << r.status().message();
    std::remove(path.c_str());
  }
}

// Sets as hwloc writes them pass the guard (zero words are empty between
// commas: a 192-PU machine's "0x000000ff,,,,,,0x000000ff" was once refused),
// and the forms hwloc_bitmap_sscanf asserts on or reads past are refused.
TEST_F(TopologyXml, SetsAsHwlocWritesThemPassTheGuard) {
  const std::string xml = readFile(fixturePath());
  const std::string attr = "allowed_nodeset=\"0x00000003\"";
  const size_t at = xml.find(attr);
  ASSERT_NE(at, std::string::npos);
  auto with = [&](const std::string& set) {
    std::string t = xml;
    t.replace(at, attr.size(), "allowed_nodeset=\"" + set + "\"");
    return hwlocCrashReason(t);
  };
  for (const char* ok : {"0x00000003", "0x3", "0x0", "0x00000003,,,0x0",
                         "0x000000ff,,,,,,0x000000ff", "0x00000001,0x0", "0xf...f",
                         "0xf...f,,0x00000001", "0xf...f,0x00000001"})
    EXPECT_FALSE(with(ok).has_value()) << ok << ": " << *with(ok);
  // "": hwloc's reader reads past it (found by fuzzing); hwloc writes "0x0".
  for (const char* bad : {"", ",0x3", "0x3,", "0x3,,", ",", "0xg", "3", "0x", "0xf...f0x1",
                          "0x00000003 ", "0x11111111111111111"})
    EXPECT_TRUE(with(bad).has_value()) << bad;
  // A file with PU 40 ("0x00000100,0x0") loads.
  SKIP_WITHOUT_XML_READER();
  std::string wide = fixturePath();
  wide = wide.substr(0, wide.find("/unit/data/")) + "/fuzz/corpus/topology_xml/wide_sets.xml";
  auto l = loadXml(wide);
  ASSERT_TRUE(l.isOk()) << l.status().message();
  ASSERT_EQ(l->packages.size(), 1u);
  EXPECT_EQ(l->packages[0].cpus, (std::vector<int>{0, 40}));
}

// A file hwloc takes but reads back otherwise once it has written it (a 1.x
// file whose CPU-less NUMA node sits in a Group; hwloc 2.9 moves it) is
// refused: what loads is what its dump loads again (found by fuzzing).
TEST_F(TopologyXml, FileThatHwlocReadsBackOtherwiseIsRefused) {
  SKIP_WITHOUT_XML_READER();
  std::string f = fixturePath();
  f = f.substr(0, f.find("/unit/data/")) + "/fuzz/corpus/topology_xml/v1_cpuless_numa_in_group.xml";
  auto l = loadXml(f);
  ASSERT_FALSE(l.isOk());
  EXPECT_NE(l.status().message().find("inconsistent: hwloc reads back another topology"),
            std::string::npos)
      << l.status().message();
}

// Memory attributes are left out before hwloc reads a file: hwloc 2.9 takes
// one whose target object is missing and frees it twice when the topology
// is duplicated (dumpXml duplicates it; found by fuzzing). Without the
// stripping this test dies of the double free.
TEST_F(TopologyXml, MemoryAttributesAreLeftOut) {
  EXPECT_FALSE(withoutMemattrs("<topology><object/></topology>").has_value());
  EXPECT_EQ(*withoutMemattrs("<a/><memattr name=\"x\"><memattr_value v=\"1\"/></memattr><b/>"
                             "<memattr name=\"y\"/><!-- <memattr name=\"z\"/> -->"),
            "<a/><b/><!-- <memattr name=\"z\"/> -->");
  std::string f = fixturePath();
  f = f.substr(0, f.find("/unit/data/")) + "/fuzz/corpus/topology_xml/memattr_missing_target.xml";
  auto l = loadXml(f);
  ASSERT_TRUE(l.isOk()) << l.status().message();
  const std::string dumped = tempPath("memattr.xml");
  ASSERT_TRUE(dumpXml(*l, dumped).isOk());
  ASSERT_TRUE(dumpXml(*l, dumped).isOk());
  auto again = loadXml(dumped);
  ASSERT_TRUE(again.isOk()) << again.status().message();
  EXPECT_TRUE(*again == *l);
  std::remove(dumped.c_str());
}

// Every input on which fuzzing saw hwloc crash is kept in the fuzz corpus
// as hwloc_crash_*.xml, and each is refused by the patterns alone, with
// their precise reason, before any process reads it (the reader apart
// catches the rest: hwloc_unpatterned_crash_*.xml, below).
TEST_F(TopologyXml, EveryCrashFoundByFuzzingIsRefusedByThePatterns) {
  std::string dir = fixturePath();
  dir = dir.substr(0, dir.find("/unit/data/")) + "/fuzz/corpus/topology_xml";
  int crashes = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("hwloc_crash_", 0) != 0) continue;
    ++crashes;
    EXPECT_TRUE(hwlocCrashReason(readFile(entry.path().string())).has_value()) << name;
  }
  EXPECT_GE(crashes, 3) << "no hwloc_crash_* inputs in " << dir;
}

// Every input on which fuzzing saw hwloc crash though the patterns let it
// through (hwloc_unpatterned_crash_*.xml: a double free in
// hwloc_bitmap_zero, a NULL in hwloc_bitmap_or) is refused by loadXml,
// whichever process reads it first: a forked child in a process with one
// thread, the reader program (tutti-topo --read-apart) in a process with
// threads.
std::vector<std::string> unpatternedCrashes() {
  std::string dir = fixturePath();
  dir = dir.substr(0, dir.find("/unit/data/")) + "/fuzz/corpus/topology_xml";
  std::vector<std::string> files;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    if (entry.path().filename().string().rfind("hwloc_unpatterned_crash_", 0) == 0)
      files.push_back(entry.path().string());
  std::sort(files.begin(), files.end());
  return files;
}

// A thread that lives while the test reads, so that the process has threads.
struct BusyThread {
  std::atomic<bool> stop{false};
  std::thread t{[this] {
    while (!stop.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }};
  ~BusyThread() {
    stop = true;
    t.join();
  }
};

// hwloc alone reading `path`, past tutti's patterns.
bool hwlocLoads(const std::string& path) {
  hwloc_topology_t t;
  if (hwloc_topology_init(&t) != 0) return false;
  const bool ok = hwloc_topology_set_xml(t, path.c_str()) == 0 && hwloc_topology_load(t) == 0;
  hwloc_topology_destroy(t);
  return ok;
}

void expectCrashSeenApart(const std::string& file, const std::function<bool()>& readHere,
                          ReadApart expected) {
  ReadApart how = ReadApart::kNone;
  auto why = hwlocCrashesApart(file, readHere, &how);
  EXPECT_EQ(how, expected) << file;
  ASSERT_TRUE(why.has_value()) << file;
  // A sanitizer turns the crash into its report and an exit status.
  EXPECT_TRUE(why->find("hwloc crashed reading it") != std::string::npos ||
              why->find("hwloc failed reading it") != std::string::npos)
      << *why;
}

void expectRefusedAsCrash(const std::string& file, ReadApart expected) {
  expectCrashSeenApart(
      file, [&] { return loadXmlHere(file).isOk(); }, expected);
  auto r = loadXml(file);
  ASSERT_FALSE(r.isOk()) << file;
  EXPECT_NE(r.status().message().find("malformed: hwloc"), std::string::npos)
      << r.status().message();
}

TEST_F(TopologyXml, CrashesNoPatternKnowsAreRefusedInAChild) {
  if (tutti::base::threadCount() != 1 || !hwlocReadsAnyXml())
    GTEST_SKIP() << "needs a single-threaded process and hwloc's libxml2 reader";
  std::string fuzzed = fixturePath();
  fuzzed = fuzzed.substr(0, fuzzed.find("/unit/data/")) +
           "/fuzz/corpus/topology_xml/hwloc_crash_topology_became_empty.xml";
  auto files = unpatternedCrashes();
  ASSERT_GE(files.size(), 2u);
  for (const auto& f : files) expectRefusedAsCrash(f, ReadApart::kChild);
  // A crash the patterns know ("Topology became empty"), handed to hwloc in
  // the child past them.
  expectCrashSeenApart(
      fuzzed, [&] { return hwlocLoads(fuzzed); }, ReadApart::kChild);
  // A file hwloc reads: nothing to say.
  ReadApart how = ReadApart::kNone;
  EXPECT_FALSE(hwlocCrashesApart(
                   fixturePath(), [&] { return loadXmlHere(fixturePath()).isOk(); }, &how)
                   .has_value());
  EXPECT_EQ(how, ReadApart::kChild);
}

TEST_F(TopologyXml, CrashesNoPatternKnowsAreRefusedByTheReaderProgramInAProcessWithThreads) {
  if (!hwlocReadsAnyXml()) GTEST_SKIP() << "needs hwloc's libxml2 reader";
  ASSERT_FALSE(readerProgram().empty())
      << "no reader program: build tutti-topo (this build's, or TUTTI_TOPO_READER)";
  BusyThread busy;
  ASSERT_GT(tutti::base::threadCount(), 1);
  auto files = unpatternedCrashes();
  ASSERT_GE(files.size(), 2u);
  for (const auto& f : files) expectRefusedAsCrash(f, ReadApart::kProgram);
  // A file hwloc reads loads, read by the program first; one it refuses
  // is refused with its own reason, not as a crash.
  ReadApart how = ReadApart::kNone;
  EXPECT_FALSE(hwlocCrashesApart(
                   fixturePath(), [] { return false; }, &how)
                   .has_value());
  EXPECT_EQ(how, ReadApart::kProgram);
  auto r = loadXml(fixturePath());
  EXPECT_TRUE(r.isOk()) << r.status().message();
  const std::string notXml = tempPath("not_topology.xml");
  { std::ofstream(notXml) << "<topology version=\"2.0\"></topology>\n"; }
  auto bad = loadXml(notXml);
  ASSERT_FALSE(bad.isOk());
  EXPECT_EQ(bad.status().message().find("malformed: hwloc crashed"), std::string::npos)
      << bad.status().message();
  EXPECT_FALSE(hwlocCrashesApart(
                   notXml, [] { return true; }, &how)
                   .has_value());
  EXPECT_EQ(how, ReadApart::kProgram);
  std::remove(notXml.c_str());
}

// TUTTI_TOPO_READER names the reader program; one that is not there means
// none (a process with threads then has the patterns only), not a failure.
TEST_F(TopologyXml, ReaderProgramComesFromTuttiTopoReader) {
  const char* old = std::getenv("TUTTI_TOPO_READER");
  const std::string saved = old ? old : "";
  setenv("TUTTI_TOPO_READER", "/nonexistent/tutti-topo", 1);
  EXPECT_EQ(readerProgram(), "");
  {
    BusyThread busy;
    ReadApart how = ReadApart::kChild;
    EXPECT_FALSE(hwlocCrashesApart(
                     fixturePath(), [] { return true; }, &how)
                     .has_value());
    EXPECT_EQ(how, ReadApart::kNone);
    if (hwlocReadsAnyXml()) EXPECT_TRUE(loadXml(fixturePath()).isOk());
  }
  setenv("TUTTI_TOPO_READER", "/bin/false", 1);  // runs, and fails every file
  EXPECT_EQ(readerProgram(), "/bin/false");
  {
    BusyThread busy;
    auto why = hwlocCrashesApart(fixturePath(), [] { return true; });
    ASSERT_TRUE(why.has_value());
    EXPECT_NE(why->find("exit status 1 of the reading process, /bin/false"), std::string::npos)
        << *why;
  }
  if (old)
    setenv("TUTTI_TOPO_READER", saved.c_str(), 1);
  else
    unsetenv("TUTTI_TOPO_READER");
}

// With hwloc's libxml2 reader the fixture loads; without it (run by ctest
// again under HWLOC_LIBXML=0) the error names the file and says what to
// install, instead of a bare parse failure.
TEST_F(TopologyXml, HandWrittenFileNeedsTheFullReaderAndSaysSo) {
  auto r = loadXml(fixturePath());
  if (hwlocReadsAnyXml()) {
    EXPECT_TRUE(r.isOk()) << r.status().message();
    return;
  }
  ASSERT_FALSE(r.isOk());
  EXPECT_NE(r.status().message().find(fixturePath()), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("libhwloc-plugins"), std::string::npos)
      << r.status().message();
}

// ---- the fixture: two sockets, GPUs and NICs ---------------------------------------------

const PciDevice* byBus(const Topology& t, const std::string& bus) {
  for (const auto& d : t.pci)
    if (d.busId == bus) return &d;
  return nullptr;
}

TEST_F(TopologyFixture, LoadsEveryField) {
  SKIP_WITHOUT_XML_READER();
  auto r = loadXml(fixturePath());
  ASSERT_TRUE(r.isOk()) << r.status().message();
  const Topology& t = r.value();
  EXPECT_EQ(t.hostname, "gpu-node-07");
  EXPECT_EQ(t.bootId, "6a1c2f40-7d2e-4b8a-9c51-0f3e2d1b7a99");
  EXPECT_EQ(t.hostId, 0xc0ffee07ull);
  EXPECT_EQ(t.intraLatencyUs, 1.5);
  EXPECT_EQ(t.intraBandwidthGBs, 20.25);
  EXPECT_FALSE(t.interLatencyUs.has_value());
  EXPECT_FALSE(t.interBandwidthGBs.has_value());

  ASSERT_EQ(t.packages.size(), 2u);
  EXPECT_EQ(t.packages[1].osIndex, 1);
  EXPECT_EQ(t.packages[1].cpuModel, "Fake Xeon 8480 (tutti test fixture)");
  EXPECT_EQ(t.coreCount, 8);
  EXPECT_EQ(t.puCount, 16);
  ASSERT_EQ(t.numaNodes.size(), 2u);
  EXPECT_EQ(t.numaNodes[0].osIndex, 0);
  EXPECT_EQ(t.numaNodes[0].cpus, (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(t.numaNodes[1].cpus, (std::vector<int>{8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(t.numaNodes[1].localMemoryBytes, 64ull << 30);
  EXPECT_EQ(t.numaDistances, (std::vector<std::vector<uint64_t>>{{10, 21}, {21, 10}}));
  ASSERT_EQ(t.caches.size(), 2u);
  EXPECT_EQ(t.caches[0], (Cache{2, CacheType::kUnified, 2ull << 20, 2, 8}));
  EXPECT_EQ(t.caches[1], (Cache{3, CacheType::kUnified, 32ull << 20, 8, 2}));

  ASSERT_EQ(t.pci.size(), 7u);
  EXPECT_EQ(t.accelerators().size(), 3u);
  EXPECT_EQ(t.nics().size(), 3u);
  const PciDevice* eth = byBus(t, "0000:01:00.0");
  ASSERT_TRUE(eth);
  EXPECT_EQ(eth->kind, PciKind::kNic);
  EXPECT_EQ(eth->netDevs, std::vector<std::string>{"eth0"});
  EXPECT_EQ(eth->vendorName, "Intel");
  EXPECT_EQ(eth->name(), "eth0");
  const PciDevice* vga = byBus(t, "0000:02:00.0");
  ASSERT_TRUE(vga);
  EXPECT_EQ(vga->kind, PciKind::kOther);  // a BMC's VGA is no accelerator
  EXPECT_EQ(vga->classId, 0x0300);
  const PciDevice* ib = byBus(t, "0000:18:00.0");
  ASSERT_TRUE(ib);
  EXPECT_EQ(ib->kind, PciKind::kNic);
  EXPECT_EQ(ib->ibDevs, std::vector<std::string>{"mlx5_0"});
  EXPECT_EQ(ib->netDevs, std::vector<std::string>{"ib0"});
  EXPECT_EQ(ib->name(), "mlx5_0");
  EXPECT_EQ(ib->vendorId, 0x15b3);
  EXPECT_EQ(ib->deviceId, 0x101b);
  EXPECT_EQ(ib->classId, 0x0207);
  EXPECT_DOUBLE_EQ(ib->linkGBs, 31.51);
  EXPECT_EQ(ib->numaNode, 0);
  EXPECT_EQ(ib->nearestNic, -1);  // only accelerators have one
}

TEST_F(TopologyFixture, NearestNicAndNumaOfEachAccelerator) {
  SKIP_WITHOUT_XML_READER();
  auto r = loadXml(fixturePath());
  ASSERT_TRUE(r.isOk()) << r.status().message();
  const Topology& t = r.value();

  // GPU 0 shares a PCIe switch with mlx5_0: that NIC, not eth0 on the same socket.
  const PciDevice* gpu0 = byBus(t, "0000:17:00.0");
  ASSERT_TRUE(gpu0);
  EXPECT_EQ(gpu0->kind, PciKind::kAccelerator);
  EXPECT_EQ(gpu0->vendorName, "NVIDIA");
  EXPECT_EQ(gpu0->otherDevs, std::vector<std::string>{"card1"});
  EXPECT_EQ(gpu0->numaNode, 0);
  EXPECT_EQ(gpu0->nearestNuma, 0);
  ASSERT_GE(gpu0->nearestNic, 0);
  EXPECT_EQ(t.pci[gpu0->nearestNic].busId, "0000:18:00.0");
  EXPECT_EQ(t.pci[gpu0->nearestNic].name(), "mlx5_0");

  // GPU 1 is on socket 1 with mlx5_1 (separate host bridges, same package).
  const PciDevice* gpu1 = byBus(t, "0000:97:00.0");
  ASSERT_TRUE(gpu1);
  EXPECT_EQ(gpu1->kind, PciKind::kAccelerator);
  EXPECT_EQ(gpu1->numaNode, 1);
  EXPECT_EQ(gpu1->nearestNuma, 1);
  ASSERT_GE(gpu1->nearestNic, 0);
  EXPECT_EQ(t.pci[gpu1->nearestNic].name(), "mlx5_1");

  // The class-0x12 accelerator hangs off the machine: no local node; the
  // nearest is decided by the tie rule (lowest OS index), and some NIC is nearest.
  const PciDevice* acc = byBus(t, "0000:c0:00.0");
  ASSERT_TRUE(acc);
  EXPECT_EQ(acc->kind, PciKind::kAccelerator);
  EXPECT_EQ(acc->vendorName, "Habana");
  EXPECT_EQ(acc->numaNode, -1);
  EXPECT_EQ(acc->nearestNuma, 0);
  ASSERT_GE(acc->nearestNic, 0);
  EXPECT_EQ(t.pci[acc->nearestNic].kind, PciKind::kNic);
  // Tie between eth0 (socket 0, 3 hops below the machine) and mlx5_1 (socket 1,
  // same depth): the first in hwloc's order wins.
  EXPECT_EQ(t.pci[acc->nearestNic].name(), "eth0");
}

TEST_F(TopologyFixture, FixtureRoundTrips) {
  SKIP_WITHOUT_XML_READER();
  auto r = loadXml(fixturePath());
  ASSERT_TRUE(r.isOk()) << r.status().message();
  std::string path = tempPath("fixture_copy.xml");
  ASSERT_TRUE(dumpXml(r.value(), path).isOk());
  auto again = loadXml(path);
  ASSERT_TRUE(again.isOk()) << again.status().message();
  EXPECT_TRUE(again.value() == r.value());
  std::remove(path.c_str());
}

// ---- describe() ----------------------------------------------------------------------------

TEST(TopologyDescribe, CpuListsAreRanges) {
  EXPECT_EQ(formatCpuList({}), "");
  EXPECT_EQ(formatCpuList({3}), "3");
  EXPECT_EQ(formatCpuList({0, 1, 2, 3, 8, 10, 11}), "0-3,8,10-11");
  EXPECT_EQ(formatCpuList({23, 16, 17, 18, 19, 20, 21, 22, 0, 1, 2, 3, 4, 5, 6, 7, 7}),
            "0-7,16-23");
}

TEST_F(TopologyFixture, DescribeMentionsCountsAndDevices) {
  SKIP_WITHOUT_XML_READER();
  auto r = loadXml(fixturePath());
  ASSERT_TRUE(r.isOk()) << r.status().message();
  std::string s = describe(r.value());
  EXPECT_NE(s.find("host gpu-node-07 (host id 0x00000000c0ffee07"), std::string::npos) << s;
  EXPECT_NE(s.find("2 packages, 2 NUMA nodes, 8 cores / 16 threads"), std::string::npos) << s;
  EXPECT_NE(s.find("NUMA 0: cpus 0-7, 64 GiB"), std::string::npos) << s;
  EXPECT_NE(s.find("NUMA 1: cpus 8-15, 64 GiB"), std::string::npos) << s;
  EXPECT_NE(s.find("NUMA distances: 0:[10 21] 1:[21 10]"), std::string::npos) << s;
  EXPECT_NE(s.find("L3 32 MiB shared by 8 threads (2 in all)"), std::string::npos) << s;
  EXPECT_NE(s.find("GPU 0000:17:00.0 NVIDIA 10de:2330 card1 (31.51 GB/s link) near NUMA 0, "
                   "nearest NIC mlx5_0 (0000:18:00.0)"),
            std::string::npos)
      << s;
  EXPECT_NE(s.find("NIC 0000:98:00.0 Mellanox 15b3:101b mlx5_1 ib1"), std::string::npos) << s;
  EXPECT_NE(s.find("accelerator 0000:c0:00.0 Habana 1da3:1020"), std::string::npos) << s;
  EXPECT_NE(s.find("nearest NUMA 0"), std::string::npos) << s;
  EXPECT_NE(s.find("measured: intra-node 1.5 us, 20.25 GB/s; inter-node ? us, ? GB/s"),
            std::string::npos)
      << s;

  std::string j = toJson(r.value());
  EXPECT_EQ(j.front(), '{');
  EXPECT_EQ(j.back(), '}');
  EXPECT_NE(j.find("\"hostId\":\"0x00000000c0ffee07\""), std::string::npos) << j;
  EXPECT_NE(j.find("\"busId\":\"0000:17:00.0\""), std::string::npos) << j;
  EXPECT_NE(j.find("\"interLatencyUs\":null"), std::string::npos) << j;
}

TEST_F(TopologyDiscover, DescribeOfThisMachine) {
  auto r = discover();
  ASSERT_TRUE(r.isOk());
  const Topology& t = r.value();
  std::string s = describe(t);
  std::string counts = fmt::format("{} cores / {} threads", t.coreCount, t.puCount);
  EXPECT_NE(s.find(counts), std::string::npos) << s;
  EXPECT_NE(s.find(t.numaNodes.size() == 1 ? "1 NUMA node," : "NUMA nodes,"), std::string::npos)
      << s;
  EXPECT_NE(s.find("NUMA " + std::to_string(t.numaNodes[0].osIndex) + ": cpus " +
                   formatCpuList(t.numaNodes[0].cpus)),
            std::string::npos)
      << s;
  EXPECT_NE(s.find(t.hostname), std::string::npos) << s;
}

// ---- forThisProcess() and the environment ---------------------------------------------------

TEST_F(TopologyEnv, TopoFileReplacesDiscovery) {
  SKIP_WITHOUT_XML_READER();
  setenv("TUTTI_TOPO_FILE", fixturePath().c_str(), 1);
  auto r = forThisProcess();
  ASSERT_TRUE(r.isOk()) << r.status().message();
  EXPECT_EQ(r->hostname, "gpu-node-07");
  EXPECT_EQ(r->puCount, 16);
}

TEST_F(TopologyEnv, MissingTopoFileIsAClearError) {
  setenv("TUTTI_TOPO_FILE", "/no/such/topo.xml", 1);
  auto r = forThisProcess();
  ASSERT_FALSE(r.isOk());
  const std::string m = r.status().message();
  EXPECT_NE(m.find("TUTTI_TOPO_FILE"), std::string::npos) << m;
  EXPECT_NE(m.find("/no/such/topo.xml"), std::string::npos) << m;
  EXPECT_NE(m.find("No such file or directory"), std::string::npos) << m;
}

TEST_F(TopologyEnv, WithoutVariablesItDiscovers) {
  setenv("NCCL_TOPO_FILE", "/whatever/nvidia_topo.xml", 1);  // ignored
  auto r = forThisProcess();
  ASSERT_TRUE(r.isOk()) << r.status().message();
  auto d = discover();
  ASSERT_TRUE(d.isOk());
  EXPECT_TRUE(r.value() == d.value());
}

TEST_F(TopologyEnv, DumpFileExpandsHostAndPid) {
  std::string tmpl = tempPath("dump_%h_%p.xml");
  setenv("TUTTI_TOPO_DUMP_FILE", tmpl.c_str(), 1);
  std::string expect =
      tempPath("dump_" + localHostName() + "_" + std::to_string(getpid()) + ".xml");
  EXPECT_EQ(expandPathTemplate(tmpl), expect);
  EXPECT_EQ(expandPathTemplate("a%%h%q%"), "a%h%q%");
  std::remove(expect.c_str());
  auto r = forThisProcess();
  ASSERT_TRUE(r.isOk()) << r.status().message();
  auto back = loadXml(expect);
  ASSERT_TRUE(back.isOk()) << back.status().message();
  EXPECT_TRUE(back.value() == r.value());
  std::remove(expect.c_str());

  // An unwritable dump path is not fatal.
  setenv("TUTTI_TOPO_DUMP_FILE", "/nonexistent/dir/topo.xml", 1);
  EXPECT_TRUE(forThisProcess().isOk());
}

// ---- placement ----------------------------------------------------------------------------------

TEST_F(TopologyDiscover, BindNearNodeKeepsTheMaskNonEmpty) {
  auto r = discover();
  ASSERT_TRUE(r.isOk());
  const Topology t = r.value();
  const std::set<int> allowed = allowedCpus();
  std::thread([&] {
    for (const auto& n : t.numaNodes) {
      ASSERT_TRUE(bindThisThreadNear(t, n.osIndex).isOk());
      std::set<int> now = threadCpus();
      ASSERT_FALSE(now.empty());
      std::set<int> expect;
      for (int c : n.cpus)
        if (allowed.count(c)) expect.insert(c);
      if (!expect.empty()) {
        EXPECT_EQ(now, expect) << "NUMA " << n.osIndex;
      }
    }
    // Unknown node: an error, mask untouched.
    std::set<int> before = threadCpus();
    EXPECT_EQ(bindThisThreadNear(t, 4242).code(), Code::kInvalidArgument);
    EXPECT_EQ(threadCpus(), before);
    // A node whose CPUs this process may not use: left as it is.
    Topology fake = t;
    fake.numaNodes.push_back(NumaNode{77, {CPU_SETSIZE + 5, CPU_SETSIZE + 6}, 1 << 20});
    EXPECT_TRUE(bindThisThreadNear(fake, 77).isOk());
    EXPECT_EQ(threadCpus(), before);
    NumaNode empty{78, {}, 0};
    fake.numaNodes.push_back(empty);
    EXPECT_TRUE(bindThisThreadNear(fake, 78).isOk());
    EXPECT_EQ(threadCpus(), before);
    EXPECT_TRUE(bindThisThreadNear(t, -1).isOk());
    EXPECT_EQ(threadCpus(), before);
  }).join();
}

TEST_F(TopologyFixture, BindNearFakeNodeOutsideThisMachineIsANoOp) {
  SKIP_WITHOUT_XML_READER();
  auto r = loadXml(fixturePath());
  ASSERT_TRUE(r.isOk());
  const std::set<int> allowed = allowedCpus();
  bool node1Usable = false;
  for (int c = 8; c < 16; ++c) node1Usable |= allowed.count(c) > 0;
  std::thread([&] {
    std::set<int> before = threadCpus();
    ASSERT_TRUE(bindThisThreadNear(r.value(), 1).isOk());
    std::set<int> now = threadCpus();
    EXPECT_FALSE(now.empty());
    if (!node1Usable) {
      EXPECT_EQ(now, before);
    }
    for (int c : now) EXPECT_TRUE(allowed.count(c)) << c;
  }).join();
}

TEST_F(TopologyDiscover, PlaceOnNodeIsBestEffort) {
  auto r = discover();
  ASSERT_TRUE(r.isOk());
  size_t bytes = 4 << 20;
  void* p = nullptr;
  ASSERT_EQ(posix_memalign(&p, 4096, bytes), 0);
  memset(p, 1, bytes);
  placeOnNode(p, bytes, r->numaNodes[0].osIndex);
  placeOnNode(p, bytes, 4242);  // no such node: logged, nothing else
  placeOnNode(p, bytes, -1);
  placeOnNode(nullptr, bytes, 0);
  placeOnNode(static_cast<char*>(p) + 1, 100, r->numaNodes[0].osIndex);  // unaligned

  // Where membind works, the pages now sit on that node.
  hwloc_topology_t h = nullptr;
  ASSERT_EQ(hwloc_topology_init(&h), 0);
  ASSERT_EQ(hwloc_topology_load(h), 0);
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  hwloc_membind_policy_t policy;
  if (hwloc_get_area_membind(h, p, bytes, set, &policy, HWLOC_MEMBIND_BYNODESET) == 0) {
    EXPECT_TRUE(hwloc_bitmap_isset(set, static_cast<unsigned>(r->numaNodes[0].osIndex)));
  }
  hwloc_bitmap_free(set);
  hwloc_topology_destroy(h);
  for (size_t i = 0; i < bytes; i += 4096) ASSERT_EQ(static_cast<char*>(p)[i], 1);
  free(p);
}

TEST_F(TopologyFixture, NumaNodeCoveringNeedsOneNodeForEveryCpu) {
  SKIP_WITHOUT_XML_READER();
  auto r = loadXml(fixturePath());  // node 0: cpus 0-7, node 1: cpus 8-15
  ASSERT_TRUE(r.isOk()) << r.status().message();
  const Topology& t = r.value();
  EXPECT_EQ(numaNodeCovering(t, {0}), 0);
  EXPECT_EQ(numaNodeCovering(t, {0, 1, 2, 3, 4, 5, 6, 7}), 0);
  EXPECT_EQ(numaNodeCovering(t, {9, 15}), 1);
  EXPECT_EQ(numaNodeCovering(t, {7, 8}), -1);    // spans both
  EXPECT_EQ(numaNodeCovering(t, {15, 16}), -1);  // 16: no node has it
  EXPECT_EQ(numaNodeCovering(t, {}), -1);
}

// Sets the calling thread's mask to `cpus` (which must be allowed).
void bindThreadTo(const std::set<int>& cpus) {
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) CPU_SET(c, &set);
  ASSERT_EQ(pthread_setaffinity_np(pthread_self(), sizeof(set), &set), 0);
}

TEST_F(TopologyFixture, HomeNumaNodeFollowsTheThreadMask) {
  const std::set<int> allowed = allowedCpus();
  if (allowed.size() < 2) GTEST_SKIP() << "needs two usable CPUs, this process has 1";
  const int a = *allowed.begin(), b = *std::next(allowed.begin());
  // A made-up machine with a and b on different nodes (2 and 5).
  Topology t;
  t.numaNodes = {NumaNode{2, {a}, 1 << 30}, NumaNode{5, {b}, 1 << 30}};
  std::thread([&] {
    bindThreadTo({a, b});
    EXPECT_EQ(homeNumaNode(t), -1);  // free to run on either node
    bindThreadTo({b});
    EXPECT_EQ(homeNumaNode(t), 5);
    bindThreadTo({a});
    EXPECT_EQ(homeNumaNode(t), 2);
    // One node: nothing to choose.
    Topology one;
    one.numaNodes = {NumaNode{0, {a, b}, 1 << 30}};
    EXPECT_EQ(homeNumaNode(one), -1);
    // Both on one node of two.
    t.numaNodes[0].cpus = {std::min(a, b), std::max(a, b)};
    t.numaNodes[1].cpus = {};
    bindThreadTo({a, b});
    EXPECT_EQ(homeNumaNode(t), 2);
  }).join();
}

// placeOnNode on a shared mapping (what the shm rings and the one-shot arena
// are): the pages' policy becomes "bind to that node" and their data stays.
TEST_F(TopologyDiscover, PlaceOnNodeBindsSharedMappings) {
  auto r = discover();
  ASSERT_TRUE(r.isOk());
  const int node = r->numaNodes[0].osIndex;
  const size_t bytes = 1 << 20;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(p, MAP_FAILED);
  memset(p, 7, bytes);
  hwloc_topology_t h = nullptr;
  ASSERT_EQ(hwloc_topology_init(&h), 0);
  ASSERT_EQ(hwloc_topology_load(h), 0);
  hwloc_bitmap_t set = hwloc_bitmap_alloc();
  hwloc_membind_policy_t policy;
  if (hwloc_get_area_membind(h, p, bytes, set, &policy, HWLOC_MEMBIND_BYNODESET) != 0) {
    hwloc_bitmap_free(set);
    hwloc_topology_destroy(h);
    munmap(p, bytes);
    GTEST_SKIP() << "this kernel reports no memory policy: " << strerror(errno);
  }
  EXPECT_NE(policy, HWLOC_MEMBIND_BIND);  // nobody asked yet
  placeOnNode(static_cast<char*>(p) + 4096, bytes - 8192, node);
  ASSERT_EQ(hwloc_get_area_membind(h, static_cast<char*>(p) + 4096, bytes - 8192, set, &policy,
                                   HWLOC_MEMBIND_BYNODESET),
            0);
  EXPECT_EQ(policy, HWLOC_MEMBIND_BIND);
  EXPECT_TRUE(hwloc_bitmap_isset(set, static_cast<unsigned>(node)));
  EXPECT_EQ(hwloc_bitmap_weight(set), 1);
  // The pages around it keep the default.
  ASSERT_EQ(hwloc_get_area_membind(h, p, 4096, set, &policy, HWLOC_MEMBIND_BYNODESET), 0);
  EXPECT_NE(policy, HWLOC_MEMBIND_BIND);
  hwloc_bitmap_free(set);
  hwloc_topology_destroy(h);
  for (size_t i = 0; i < bytes; i += 512) ASSERT_EQ(static_cast<char*>(p)[i], 7) << i;
  munmap(p, bytes);
}

}  // namespace
}  // namespace tutti::topo
