#include "topology/topology.h"

#include <errno.h>
#include <hwloc.h>
#include <pthread.h>
#include <sched.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <tuple>
#include <type_traits>

#include "base/json.h"
#include "base/log.h"
#include "base/params.h"
#include "topology/xml_guard.h"

namespace tutti::topo {

namespace detail {
struct HwlocTree {
  hwloc_topology_t topo = nullptr;
  HwlocTree() = default;
  HwlocTree(const HwlocTree&) = delete;
  HwlocTree& operator=(const HwlocTree&) = delete;
  ~HwlocTree() {
    if (topo) hwloc_topology_destroy(topo);
  }
};
}  // namespace detail

namespace {

using detail::HwlocTree;

constexpr uint32_t kTopoLog = log::kInit | log::kGraph;

constexpr const char* kInfoHostname = "TuttiHostname";
constexpr const char* kInfoBootId = "TuttiBootId";
constexpr const char* kInfoHostId = "TuttiHostId";
constexpr const char* kInfoIntraLat = "TuttiIntraLatencyUs";
constexpr const char* kInfoIntraBw = "TuttiIntraBandwidthGBs";
constexpr const char* kInfoInterLat = "TuttiInterLatencyUs";
constexpr const char* kInfoInterBw = "TuttiInterBandwidthGBs";

// Same hash as the bootstrap has always used: ids must not change.
uint64_t fnv1a(const void* data, size_t n, uint64_t h = 1469598103934665603ull) {
  auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

std::string trim(std::string s) {
  while (!s.empty() && isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t i = 0;
  while (i < s.size() && isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

// ---- hwloc helpers --------------------------------------------------------------

std::vector<int> bitmapToList(hwloc_const_bitmap_t set) {
  std::vector<int> out;
  if (!set || hwloc_bitmap_iszero(set)) return out;
  if (hwloc_bitmap_weight(set) < 0) return out;  // infinite: never for cpusets we read
  for (int i = hwloc_bitmap_first(set); i >= 0; i = hwloc_bitmap_next(set, i)) out.push_back(i);
  return out;
}

const char* infoOf(hwloc_obj_t obj, const char* name) {
  return obj ? hwloc_obj_get_info_by_name(obj, name) : nullptr;
}

// What hwloc's XML export keeps of a name or an info value: printable ASCII,
// tab, newline and carriage return (it drops every other byte). Strings read
// from hwloc pass through this, so that a dumped file loads back to an equal
// Topology (a CPU model with a non-ASCII letter did not; found by fuzzing).
std::string keptByXml(const char* s) {
  std::string out;
  for (; s && *s; ++s) {
    const unsigned char c = static_cast<unsigned char>(*s);
    if ((c >= 32 && c <= 126) || c == '\t' || c == '\n' || c == '\r') out += static_cast<char>(c);
  }
  return out;
}

// Path from the root to obj, both included.
std::vector<hwloc_obj_t> chainOf(hwloc_obj_t obj) {
  std::vector<hwloc_obj_t> c;
  for (; obj; obj = obj->parent) c.push_back(obj);
  std::reverse(c.begin(), c.end());
  return c;
}

struct TreeDistance {
  size_t common = 0;  // shared ancestors (the deeper, the closer)
  size_t hops = 0;    // edges on the path between the two
  bool closerThan(const TreeDistance& o) const {
    return common != o.common ? common > o.common : hops < o.hops;
  }
};

TreeDistance treeDistance(const std::vector<hwloc_obj_t>& a, const std::vector<hwloc_obj_t>& b) {
  TreeDistance d;
  while (d.common < a.size() && d.common < b.size() && a[d.common] == b[d.common]) ++d.common;
  d.hops = a.size() + b.size() - 2 * d.common;
  return d;
}

const char* vendorNameOf(uint16_t vendor) {
  switch (vendor) {
    case 0x10de:
      return "NVIDIA";
    case 0x1002:
    case 0x1022:
      return "AMD";
    case 0x8086:
      return "Intel";
    case 0x15b3:
      return "Mellanox";
    case 0x14e4:
      return "Broadcom";
    case 0x1077:
      return "QLogic";
    case 0x1924:
      return "Solarflare";
    case 0x19ee:
      return "Netronome";
    case 0x1d0f:
      return "Amazon";
    case 0x1af4:
      return "Red Hat";
    case 0x1da3:
      return "Habana";
    case 0x1e52:
      return "Tenstorrent";
    case 0x1ed5:
      return "Moore Threads";
    case 0x1eb1:
      return "Iluvatar";
    case 0x1d17:
      return "Zhaoxin";
    case 0x1e3e:
      return "Biren";
    case 0x9999:
      return "MetaX";
    case 0x19e5:
      return "Huawei";
    case 0x1a03:
      return "ASPEED";
    case 0x1344:
      return "Micron";
    case 0x144d:
      return "Samsung";
    case 0x1b4b:
      return "Marvell";
    case 0x1c36:
      return "Annapurna";
    default:
      return "";
  }
}

PciKind classify(uint16_t classId, uint16_t vendor) {
  unsigned base = classId >> 8;
  if (base == 0x12) return PciKind::kAccelerator;
  if (base == 0x03 && (vendor == 0x10de || vendor == 0x1002 || vendor == 0x8086))
    return PciKind::kAccelerator;
  if (base == 0x02) return PciKind::kNic;
  return PciKind::kOther;
}

std::string busIdOf(const hwloc_obj_t obj) {
  const auto& a = obj->attr->pcidev;
  return fmt::format("{:04x}:{:02x}:{:02x}.{:x}", static_cast<unsigned>(a.domain),
                     static_cast<unsigned>(a.bus), static_cast<unsigned>(a.dev),
                     static_cast<unsigned>(a.func));
}

// An enum hwloc read from a file holds whatever number the file gave
// (osdev_type="8", cache_type="7"): it is read as its integer, since loading
// it as the enum type is undefined for values outside it (found by fuzzing,
// under UBSan).
template <typename E>
int rawEnum(const E& e) {
  std::underlying_type_t<E> v;
  static_assert(sizeof(v) == sizeof(e));
  std::memcpy(&v, &e, sizeof(v));
  return static_cast<int>(v);
}

CacheType cacheTypeOf(int t) {
  switch (t) {
    case HWLOC_OBJ_CACHE_DATA:
      return CacheType::kData;
    case HWLOC_OBJ_CACHE_INSTRUCTION:
      return CacheType::kInstruction;
    default:
      return CacheType::kUnified;
  }
}

std::optional<int> singleNode(hwloc_const_nodeset_t ns) {
  if (!ns || hwloc_bitmap_weight(ns) != 1) return std::nullopt;
  return hwloc_bitmap_first(ns);
}

// The hardware part of a Topology, read from a loaded hwloc tree.
Topology extractHardware(hwloc_topology_t t) {
  Topology out;

  for (hwloc_obj_t o = nullptr; (o = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_PACKAGE, o));) {
    Package p;
    p.osIndex = o->os_index == HWLOC_UNKNOWN_INDEX ? -1 : static_cast<int>(o->os_index);
    if (const char* m = infoOf(o, "CPUModel")) p.cpuModel = trim(keptByXml(m));
    p.cpus = bitmapToList(o->cpuset);
    out.packages.push_back(std::move(p));
  }

  std::vector<hwloc_obj_t> numaObjs;
  for (hwloc_obj_t o = nullptr; (o = hwloc_get_next_obj_by_type(t, HWLOC_OBJ_NUMANODE, o));)
    numaObjs.push_back(o);
  std::sort(numaObjs.begin(), numaObjs.end(),
            [](hwloc_obj_t a, hwloc_obj_t b) { return a->os_index < b->os_index; });
  for (hwloc_obj_t o : numaObjs) {
    NumaNode n;
    n.osIndex = static_cast<int>(o->os_index);
    n.cpus = bitmapToList(o->cpuset);
    n.localMemoryBytes = o->attr ? o->attr->numanode.local_memory : 0;
    out.numaNodes.push_back(std::move(n));
  }

  out.coreCount = std::max(0, hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_CORE));
  out.puCount = std::max(0, hwloc_get_nbobjs_by_type(t, HWLOC_OBJ_PU));

  // Caches, one entry per (level, type, size, sharing).
  std::map<std::tuple<int, int, uint64_t, int>, int> caches;
  int depthCount = hwloc_topology_get_depth(t);
  for (int d = 0; d < depthCount; ++d) {
    if (!hwloc_obj_type_is_cache(hwloc_get_depth_type(t, d))) continue;
    for (hwloc_obj_t o = nullptr; (o = hwloc_get_next_obj_by_depth(t, d, o));) {
      const auto& c = o->attr->cache;
      int shared = std::max(0, hwloc_bitmap_weight(o->cpuset));
      ++caches[{static_cast<int>(c.depth), static_cast<int>(cacheTypeOf(rawEnum(c.type))), c.size, shared}];
    }
  }
  for (const auto& [key, count] : caches) {
    Cache c;
    c.level = std::get<0>(key);
    c.type = static_cast<CacheType>(std::get<1>(key));
    c.sizeBytes = std::get<2>(key);
    c.sharedByPus = std::get<3>(key);
    c.count = count;
    out.caches.push_back(c);
  }

  // PCI devices.
  std::vector<hwloc_obj_t> pciObjs;
  for (hwloc_obj_t o = nullptr; (o = hwloc_get_next_pcidev(t, o));) {
    const auto& a = o->attr->pcidev;
    PciDevice d;
    d.busId = busIdOf(o);
    d.vendorId = a.vendor_id;
    d.deviceId = a.device_id;
    d.classId = a.class_id;
    d.kind = classify(a.class_id, a.vendor_id);
    d.vendorName = vendorNameOf(a.vendor_id);
    if (d.vendorName.empty()) {
      if (const char* v = infoOf(o, "PCIVendor")) d.vendorName = trim(keptByXml(v));
    }
    // Rounded so that a value written to XML ("%f") and read back compares equal.
    d.linkGBs = std::round(static_cast<double>(a.linkspeed) * 100.0) / 100.0;
    for (hwloc_obj_t c = o->io_first_child; c; c = c->next_sibling) {
      if (c->type != HWLOC_OBJ_OS_DEVICE || !c->name) continue;
      switch (rawEnum(c->attr->osdev.type)) {
        case HWLOC_OBJ_OSDEV_NETWORK:
          d.netDevs.push_back(keptByXml(c->name));
          break;
        case HWLOC_OBJ_OSDEV_OPENFABRICS:
          d.ibDevs.push_back(keptByXml(c->name));
          break;
        default:
          d.otherDevs.push_back(keptByXml(c->name));
          break;
      }
    }
    hwloc_obj_t host = hwloc_get_non_io_ancestor_obj(t, o);
    // A file may name a node in the nodeset that no NUMANode object has.
    if (auto n = singleNode(host ? host->nodeset : nullptr); n && out.numa(*n)) d.numaNode = *n;
    out.pci.push_back(std::move(d));
    pciObjs.push_back(o);
  }

  // Nearest NUMA node for every device, nearest NIC for accelerators.
  std::vector<std::vector<hwloc_obj_t>> pciChains, numaChains;
  for (hwloc_obj_t o : pciObjs) pciChains.push_back(chainOf(o));
  for (hwloc_obj_t o : numaObjs) numaChains.push_back(chainOf(o));
  for (size_t i = 0; i < out.pci.size(); ++i) {
    std::optional<TreeDistance> best;
    for (size_t n = 0; n < numaObjs.size(); ++n) {  // ascending OS index: first wins ties
      TreeDistance d = treeDistance(pciChains[i], numaChains[n]);
      if (!best || d.closerThan(*best)) {
        best = d;
        out.pci[i].nearestNuma = out.numaNodes[n].osIndex;
      }
    }
    if (out.pci[i].kind != PciKind::kAccelerator) continue;
    best.reset();
    for (size_t j = 0; j < out.pci.size(); ++j) {
      if (out.pci[j].kind != PciKind::kNic) continue;
      TreeDistance d = treeDistance(pciChains[i], pciChains[j]);
      if (!best || d.closerThan(*best)) {
        best = d;
        out.pci[i].nearestNic = static_cast<int>(j);
      }
    }
  }

  // NUMA distances: the first latency matrix hwloc has, else the first one.
  unsigned nr = 4;
  hwloc_distances_s* dists[4] = {};
  if (numaObjs.size() > 1 &&
      hwloc_distances_get_by_type(t, HWLOC_OBJ_NUMANODE, &nr, dists, 0, 0) == 0) {
    unsigned got = std::min(nr, 4u);
    hwloc_distances_s* pick = nullptr;
    for (unsigned k = 0; k < got && !pick; ++k)
      if (dists[k]->kind & HWLOC_DISTANCES_KIND_MEANS_LATENCY) pick = dists[k];
    if (!pick && got > 0) pick = dists[0];
    if (pick) {
      size_t n = out.numaNodes.size();
      out.numaDistances.assign(n, std::vector<uint64_t>(n, 0));
      auto pos = [&](hwloc_obj_t o) -> int {
        for (size_t i = 0; i < n; ++i)
          if (o && out.numaNodes[i].osIndex == static_cast<int>(o->os_index))
            return static_cast<int>(i);
        return -1;
      };
      for (unsigned a = 0; a < pick->nbobjs; ++a) {
        int ia = pos(pick->objs[a]);
        if (ia < 0) continue;
        for (unsigned b = 0; b < pick->nbobjs; ++b) {
          int ib = pos(pick->objs[b]);
          if (ib >= 0) out.numaDistances[ia][ib] = pick->values[a * pick->nbobjs + b];
        }
      }
    }
    for (unsigned k = 0; k < got; ++k) hwloc_distances_release(t, dists[k]);
  }
  return out;
}

Status hwlocError(const std::string& what) {
  int err = errno;
  return systemError(fmt::format("{}: {}", what, err ? strerror(err) : "unknown hwloc error"));
}

// A fresh hwloc tree with tutti's filters; the caller adds a source and loads.
Result<std::unique_ptr<HwlocTree>> newTree() {
  auto tree = std::make_unique<HwlocTree>();
  if (hwloc_topology_init(&tree->topo) != 0) {
    tree->topo = nullptr;
    return hwlocError("hwloc_topology_init");
  }
  hwloc_topology_set_io_types_filter(tree->topo, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  return tree;
}

// ---- Tutti* info attributes --------------------------------------------------------

// Removes every info called name from obj, then adds name=value when given.
// hwloc 2.x has no call to remove an info; its strings are malloc'ed and its
// array is resized from the count at each add, so editing the public array
// in place is safe. Only ever done on a tree nobody else sees.
void setInfo(hwloc_obj_t obj, const char* name, const std::optional<std::string>& value) {
  unsigned w = 0;
  for (unsigned i = 0; i < obj->infos_count; ++i) {
    if (obj->infos[i].name && strcmp(obj->infos[i].name, name) == 0) {
      free(obj->infos[i].name);
      free(obj->infos[i].value);
      continue;
    }
    obj->infos[w++] = obj->infos[i];
  }
  obj->infos_count = w;
  if (value) hwloc_obj_add_info(obj, name, value->c_str());
}

std::optional<std::string> formatDouble(const std::optional<double>& v) {
  if (!v) return std::nullopt;
  return fmt::format("{:.17g}", *v);
}

Status parseDouble(hwloc_obj_t root, const char* name, std::optional<double>* out) {
  const char* s = infoOf(root, name);
  if (!s) return Status::ok();
  char* end = nullptr;
  errno = 0;
  double v = strtod(s, &end);
  if (end == s || *end != '\0' || errno == ERANGE || !std::isfinite(v))
    return invalidArgument(fmt::format("attribute {}=\"{}\" is not a number", name, s));
  *out = v;
  return Status::ok();
}

std::string plural(size_t n, const char* one, const char* many) {
  return fmt::format("{} {}", n, n == 1 ? one : many);
}

// "2 packages, 2 NUMA nodes, 16 cores / 32 threads"
std::string countsOf(const Topology& t) {
  return fmt::format("{}, {}, {} / {}", plural(t.packages.size(), "package", "packages"),
                     plural(t.numaNodes.size(), "NUMA node", "NUMA nodes"),
                     plural(t.coreCount, "core", "cores"), plural(t.puCount, "thread", "threads"));
}

std::string summaryOf(const Topology& t) {
  return fmt::format("{}, {}, {}", countsOf(t),
                     plural(t.accelerators().size(), "accelerator", "accelerators"),
                     plural(t.nics().size(), "NIC", "NICs"));
}

// ---- discovery cache -------------------------------------------------------------

std::mutex g_discoverMu;
std::shared_ptr<const Topology> g_discovered;  // hardware only, with its hwloc tree

Result<std::shared_ptr<const Topology>> discoveredHardware() {
  std::lock_guard<std::mutex> lk(g_discoverMu);
  if (g_discovered) return g_discovered;
  auto t0 = std::chrono::steady_clock::now();
  TUTTI_ASSIGN_OR_RETURN(std::unique_ptr<HwlocTree> tree, newTree());
  // hwloc components left out: those that start a vendor runtime (CUDA, NVML,
  // OpenCL, ROCm SMI, Level Zero) or talk to an X server, which is slow and
  // must not happen inside a communicator's init; and libpciaccess ("pci"),
  // which leaks (LeakSanitizer fails every process) and adds nothing: the
  // Linux component reads the same PCI tree from sysfs.
  for (const char* c : {"pci", "opencl", "gl", "cuda", "nvml", "rsmi", "levelzero"})
    (void)hwloc_topology_set_components(tree->topo, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, c);
  if (hwloc_topology_load(tree->topo) != 0) return hwlocError("hwloc topology discovery failed");
  auto topo = std::make_shared<Topology>(extractHardware(tree->topo));
  topo->hwloc = std::shared_ptr<const HwlocTree>(std::move(tree));
  double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  TUTTI_INFO(kTopoLog, "topology: discovered in {:.1f} ms: {}", ms, summaryOf(*topo));
  g_discovered = std::move(topo);
  return g_discovered;
}

// ---- presentation helpers ----------------------------------------------------------

std::string formatBytes(uint64_t b) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  if (std::fabs(v - std::round(v)) < 1e-9) return fmt::format("{:.0f} {}", v, units[u]);
  std::string s = fmt::format("{:.2f}", v);
  while (s.back() == '0') s.pop_back();
  if (s.back() == '.') s.pop_back();
  return s + " " + units[u];
}

const char* cacheTypeSuffix(const Cache& c) {
  if (c.type == CacheType::kData) return "d";
  if (c.type == CacheType::kInstruction) return "i";
  return "";
}

std::string pciLabel(const PciDevice& d) {
  if (d.kind == PciKind::kAccelerator) return (d.classId >> 8) == 0x03 ? "GPU" : "accelerator";
  if (d.kind == PciKind::kNic) return "NIC";
  return "PCI";
}

using base::jsonArray;
using base::jsonString;

std::string jsonNumber(const std::optional<double>& v) {
  return v ? fmt::format("{:.17g}", *v) : "null";
}

struct CpuSetDeleter {
  void operator()(cpu_set_t* s) const { CPU_FREE(s); }
};
using CpuSetPtr = std::unique_ptr<cpu_set_t, CpuSetDeleter>;

}  // namespace

// ---- value types --------------------------------------------------------------------

bool Package::operator==(const Package& o) const {
  return osIndex == o.osIndex && cpuModel == o.cpuModel && cpus == o.cpus;
}
bool NumaNode::operator==(const NumaNode& o) const {
  return osIndex == o.osIndex && cpus == o.cpus && localMemoryBytes == o.localMemoryBytes;
}
bool Cache::operator==(const Cache& o) const {
  return level == o.level && type == o.type && sizeBytes == o.sizeBytes &&
         sharedByPus == o.sharedByPus && count == o.count;
}
bool PciDevice::operator==(const PciDevice& o) const {
  return kind == o.kind && busId == o.busId && vendorId == o.vendorId && deviceId == o.deviceId &&
         classId == o.classId && vendorName == o.vendorName && linkGBs == o.linkGBs &&
         netDevs == o.netDevs && ibDevs == o.ibDevs && otherDevs == o.otherDevs &&
         numaNode == o.numaNode && nearestNuma == o.nearestNuma && nearestNic == o.nearestNic;
}
std::string PciDevice::name() const {
  if (!ibDevs.empty()) return ibDevs.front();
  if (!netDevs.empty()) return netDevs.front();
  if (!otherDevs.empty()) return otherDevs.front();
  return busId;
}

bool Topology::operator==(const Topology& o) const {
  return hostname == o.hostname && bootId == o.bootId && hostId == o.hostId &&
         packages == o.packages && numaNodes == o.numaNodes && numaDistances == o.numaDistances &&
         coreCount == o.coreCount && puCount == o.puCount && caches == o.caches && pci == o.pci &&
         intraLatencyUs == o.intraLatencyUs && intraBandwidthGBs == o.intraBandwidthGBs &&
         interLatencyUs == o.interLatencyUs && interBandwidthGBs == o.interBandwidthGBs;
}

const NumaNode* Topology::numa(int osIndex) const {
  for (const auto& n : numaNodes)
    if (n.osIndex == osIndex) return &n;
  return nullptr;
}

std::vector<int> Topology::accelerators() const {
  std::vector<int> out;
  for (size_t i = 0; i < pci.size(); ++i)
    if (pci[i].kind == PciKind::kAccelerator) out.push_back(static_cast<int>(i));
  return out;
}

std::vector<int> Topology::nics() const {
  std::vector<int> out;
  for (size_t i = 0; i < pci.size(); ++i)
    if (pci[i].kind == PciKind::kNic) out.push_back(static_cast<int>(i));
  return out;
}

// ---- identity ---------------------------------------------------------------------------

std::string localHostName() {
  char buf[256] = {};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

std::string localBootId() {
  std::ifstream boot("/proc/sys/kernel/random/boot_id");
  std::string id;
  std::getline(boot, id);
  return trim(id);
}

uint64_t hostIdOf(const std::string& hostname, const std::string& bootId) {
  std::string h = hostname + "|" + bootId;
  return fnv1a(h.data(), h.size());
}

uint64_t localHostId() {
  if (auto v = params::get("TUTTI_HOST_ID")) return fnv1a(v->data(), v->size());
  return hostIdOf(localHostName(), localBootId());
}

// ---- discovery and files ----------------------------------------------------------------

Result<Topology> discover() {
  TUTTI_ASSIGN_OR_RETURN(std::shared_ptr<const Topology> hw, discoveredHardware());
  Topology t = *hw;
  t.hostname = localHostName();
  t.bootId = localBootId();
  t.hostId = localHostId();
  return t;
}

bool hwlocReadsAnyXml() {
  static const bool full = [] {
    // A comment is enough to defeat hwloc's minimal parser.
    static const char kProbe[] =
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
        "<!DOCTYPE topology SYSTEM \"hwloc2.dtd\">\n"
        "<!-- tutti: can hwloc read hand-written XML? -->\n"
        "<topology version=\"2.0\">\n"
        " <object type=\"Machine\" os_index=\"0\" cpuset=\"0x1\" complete_cpuset=\"0x1\""
        " allowed_cpuset=\"0x1\" nodeset=\"0x1\" complete_nodeset=\"0x1\""
        " allowed_nodeset=\"0x1\" gp_index=\"1\">\n"
        "  <object type=\"NUMANode\" os_index=\"0\" cpuset=\"0x1\" complete_cpuset=\"0x1\""
        " allowed_cpuset=\"0x1\" nodeset=\"0x1\" complete_nodeset=\"0x1\""
        " allowed_nodeset=\"0x1\" gp_index=\"2\" local_memory=\"1048576\"/>\n"
        "  <object type=\"PU\" os_index=\"0\" cpuset=\"0x1\" complete_cpuset=\"0x1\""
        " allowed_cpuset=\"0x1\" nodeset=\"0x1\" complete_nodeset=\"0x1\""
        " allowed_nodeset=\"0x1\" gp_index=\"3\"/>\n"
        " </object>\n"
        "</topology>\n";
    hwloc_topology_t topo;
    if (hwloc_topology_init(&topo) != 0) return false;
    bool ok = hwloc_topology_set_xmlbuffer(topo, kProbe, static_cast<int>(sizeof(kProbe))) == 0 &&
              hwloc_topology_load(topo) == 0;
    hwloc_topology_destroy(topo);
    return ok;
  }();
  return full;
}

// The XML hwloc writes of `t` (its tree, with tutti's identity and link
// figures as info attributes of the root): what dumpXml writes.
static Result<std::string> exportXml(const Topology& t);

static Result<Topology> loadXmlImpl(const std::string& path, bool apart);

// Reads a topology file (`path`), or, with `buffer`, that text (hwloc's own
// export of a file read before; `path` then only names it in errors). With
// `apart`, another process reads the file first (xml_guard.h).
static Result<Topology> readXml(const std::string& path, const std::string* buffer,
                                bool apart = false) {
  auto fail = [&](const std::string& why) {
    return invalidArgument(fmt::format("cannot load topology file '{}': {}", path, why));
  };
  std::string stripped;  // the file without its memory attributes (xml_guard.h)
  const std::string* source = buffer;
  if (!buffer) {
    struct stat st {};
    if (path.empty()) return fail("empty path");
    if (stat(path.c_str(), &st) != 0) return fail(strerror(errno));
    if (S_ISDIR(st.st_mode)) return fail("is a directory");
    std::ifstream probe(path, std::ios::binary);
    if (!probe) return fail(strerror(errno));
    // A file this hwloc would crash on is refused before it reads it.
    constexpr std::streamsize kMaxBytes = std::streamsize{64} << 20;
    std::string text(static_cast<size_t>(std::min<std::streamsize>(st.st_size, kMaxBytes)), '\0');
    probe.read(text.data(), static_cast<std::streamsize>(text.size()));
    text.resize(static_cast<size_t>(probe.gcount()));
    if (auto why = hwlocCrashReason(text))
      return fail(fmt::format(
          "malformed: {} (hwloc 2.9 crashes, or works for seconds, on such files; "
          "topology/xml_guard.h)",
          *why));
    if (auto without = withoutMemattrs(text)) {
      if (text.size() != static_cast<size_t>(st.st_size))
        return fail("larger than 64 MiB, with memory attributes (memattr elements)");
      stripped = std::move(*without);
      source = &stripped;
    }
  } else if (auto why = hwlocCrashReason(*buffer)) {
    return fail(fmt::format("hwloc wrote of it what it would crash on: {}", *why));
  }
  TUTTI_ASSIGN_OR_RETURN(std::unique_ptr<HwlocTree> tree, newTree());
  errno = 0;
  const int set = source ? hwloc_topology_set_xmlbuffer(tree->topo, source->data(),
                                                        static_cast<int>(source->size()) + 1)
                         : hwloc_topology_set_xml(tree->topo, path.c_str());
  if (set != 0)
    return fail(fmt::format("hwloc refused it ({})", errno ? strerror(errno) : "unknown reason"));
  if (apart)
    if (auto crashed = hwlocCrashesApart(path, [&path] { return loadXmlImpl(path, false).isOk(); }))
      return fail(*crashed);
  errno = 0;
  if (hwloc_topology_load(tree->topo) != 0) {
    const char* why = errno ? strerror(errno) : "invalid content";
    if (!hwlocReadsAnyXml())
      return fail(fmt::format(
          "hwloc could not parse it as topology XML ({}): this hwloc has only its minimal XML "
          "parser, which reads nothing but files hwloc wrote itself (no comments, no hand edits); "
          "install hwloc's libxml2 reader (Debian: libhwloc-plugins), or give a file written by "
          "`tutti-topo --dump` or `lstopo --of xml` on this hwloc",
          why));
    return fail(fmt::format(
        "hwloc could not parse it as topology XML ({}; HWLOC_XML_VERBOSE=1 shows hwloc's parser "
        "messages)",
        why));
  }

  // What hwloc accepted may still describe no machine: a NUMA node or PU
  // without an index (hwloc's "unknown", which tutti would read as -1 and
  // a dump would write as bit 4,294,967,295: 134 MB of XML, found by fuzzing)
  // or sets without end. Indices are bounded by what Linux supports.
  // Two nodes or PUs of one index are no machine either (found by fuzzing).
  constexpr unsigned kMaxOsIndex = 1u << 16;
  for (hwloc_obj_type_t type : {HWLOC_OBJ_NUMANODE, HWLOC_OBJ_PU}) {
    std::set<unsigned> seen;
    for (hwloc_obj_t o = nullptr; (o = hwloc_get_next_obj_by_type(tree->topo, type, o));) {
      if (o->os_index == HWLOC_UNKNOWN_INDEX || o->os_index >= kMaxOsIndex)
        return fail(fmt::format("a {} object (gp_index {}) without a valid os_index",
                                hwloc_obj_type_string(type), o->gp_index));
      if (!seen.insert(o->os_index).second)
        return fail(fmt::format("two {} objects with os_index {}", hwloc_obj_type_string(type),
                                o->os_index));
    }
  }
  {
    // Every set of every object within [0, kMaxOsIndex): hwloc keeps the
    // index of a node it dropped for having none (4,294,967,295) in the
    // machine's complete_nodeset, and a set may be infinite ("0xf...f").
    hwloc_bitmap_t range = hwloc_bitmap_alloc();
    hwloc_bitmap_set_range(range, 0, static_cast<int>(kMaxOsIndex) - 1);
    std::function<bool(hwloc_obj_t)> bounded = [&](hwloc_obj_t o) {
      for (hwloc_const_bitmap_t set :
           {o->cpuset, o->complete_cpuset, o->nodeset, o->complete_nodeset})
        if (set && !hwloc_bitmap_isincluded(set, range)) return false;
      for (hwloc_obj_t c = nullptr; (c = hwloc_get_next_child(tree->topo, o, c));)
        if (!bounded(c)) return false;
      return true;
    };
    const bool ok = bounded(hwloc_get_root_obj(tree->topo));
    hwloc_bitmap_free(range);
    if (!ok) return fail("a cpu or node set without end, or with indices beyond 65535");
  }

  Topology t = extractHardware(tree->topo);
  hwloc_obj_t root = hwloc_get_root_obj(tree->topo);
  if (const char* h = infoOf(root, kInfoHostname))
    t.hostname = keptByXml(h);
  else if (const char* h2 = infoOf(root, "HostName"))
    t.hostname = keptByXml(h2);
  if (const char* b = infoOf(root, kInfoBootId)) t.bootId = keptByXml(b);
  if (auto v = params::get("TUTTI_HOST_ID")) {
    t.hostId = fnv1a(v->data(), v->size());
  } else if (const char* id = infoOf(root, kInfoHostId)) {
    char* end = nullptr;
    errno = 0;
    unsigned long long x = strtoull(id, &end, 16);
    if (end == id || *end != '\0' || errno == ERANGE)
      return fail(fmt::format("attribute {}=\"{}\" is not a hex number", kInfoHostId, id));
    t.hostId = x;
  } else {
    t.hostId = hostIdOf(t.hostname, t.bootId);
  }
  for (auto [name, field] :
       {std::pair{kInfoIntraLat, &t.intraLatencyUs}, std::pair{kInfoIntraBw, &t.intraBandwidthGBs},
        std::pair{kInfoInterLat, &t.interLatencyUs},
        std::pair{kInfoInterBw, &t.interBandwidthGBs}}) {
    Status s = parseDouble(root, name, field);
    if (!s.isOk()) return fail(s.message());
  }
  t.hwloc = std::shared_ptr<const HwlocTree>(std::move(tree));
  return t;
}

static Result<Topology> loadXmlImpl(const std::string& path, bool apart) {
  TUTTI_ASSIGN_OR_RETURN(Topology t, readXml(path, nullptr, apart));
  // hwloc 2.9 takes some inconsistent files (a PU whose complete_cpuset
  // holds another PU's bit, say) and makes of them a tree it then writes and
  // reads back otherwise: such a file is refused, so that what is loaded is
  // what a dump of it loads again (found by fuzzing).
  TUTTI_ASSIGN_OR_RETURN(std::string xml, exportXml(t));
  auto again = readXml(path + " (as hwloc writes it back)", &xml);
  if (!again || !(*again == t))
    return invalidArgument(fmt::format(
        "cannot load topology file '{}': inconsistent: hwloc reads back another topology than "
        "the one it made of this file ({}; HWLOC_XML_VERBOSE=1 shows hwloc's complaints)",
        path, again ? "the machines differ" : again.status().message()));
  return t;
}

Result<Topology> loadXml(const std::string& path) {
  TUTTI_ASSIGN_OR_RETURN(Topology t, loadXmlImpl(path, true));
  TUTTI_INFO(kTopoLog, "topology: loaded {} (host {}): {}", path, t.hostname, summaryOf(t));
  return t;
}

Result<Topology> loadXmlHere(const std::string& path) { return loadXmlImpl(path, false); }

static Result<std::string> exportXml(const Topology& t) {
  if (!t.hwloc || !t.hwloc->topo)
    return invalidArgument("dumpXml: this Topology was not built by discover() or loadXml()");
  hwloc_topology_t dup = nullptr;
  if (hwloc_topology_dup(&dup, t.hwloc->topo) != 0) return hwlocError("hwloc_topology_dup");
  HwlocTree dupOwner;
  dupOwner.topo = dup;
  hwloc_obj_t root = hwloc_get_root_obj(dup);
  setInfo(root, kInfoHostname, t.hostname);
  setInfo(root, kInfoBootId, t.bootId);
  setInfo(root, kInfoHostId, fmt::format("0x{:016x}", t.hostId));
  setInfo(root, kInfoIntraLat, formatDouble(t.intraLatencyUs));
  setInfo(root, kInfoIntraBw, formatDouble(t.intraBandwidthGBs));
  setInfo(root, kInfoInterLat, formatDouble(t.interLatencyUs));
  setInfo(root, kInfoInterBw, formatDouble(t.interBandwidthGBs));

  char* buf = nullptr;
  int len = 0;
  if (hwloc_topology_export_xmlbuffer(dup, &buf, &len, 0) != 0 || !buf)
    return hwlocError("hwloc_topology_export_xmlbuffer");
  std::string xml(buf, len > 0 && buf[len - 1] == '\0' ? len - 1 : std::max(len, 0));
  hwloc_free_xmlbuffer(dup, buf);
  return xml;
}

Status dumpXml(const Topology& t, const std::string& path) {
  TUTTI_ASSIGN_OR_RETURN(std::string xml, exportXml(t));
  if (path == "-") {
    if (fwrite(xml.data(), 1, xml.size(), stdout) != xml.size() || fflush(stdout) != 0)
      return errnoError("writing topology XML to stdout", errno);
    return Status::ok();
  }
  std::string tmp =
      fmt::format("{}.tmp.{}.{:x}", path, getpid(),
                  static_cast<uint64_t>(std::hash<std::thread::id>()(std::this_thread::get_id())));
  FILE* f = fopen(tmp.c_str(), "w");
  if (!f) return errnoError(fmt::format("cannot write topology file '{}'", path), errno);
  bool ok = fwrite(xml.data(), 1, xml.size(), f) == xml.size();
  int err = errno;
  if (fclose(f) != 0 && ok) {
    ok = false;
    err = errno;
  }
  if (!ok) {
    unlink(tmp.c_str());
    return errnoError(fmt::format("cannot write topology file '{}'", path), err);
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    err = errno;
    unlink(tmp.c_str());
    return errnoError(fmt::format("cannot write topology file '{}'", path), err);
  }
  return Status::ok();
}

std::string expandPathTemplate(const std::string& tmpl) {
  std::string out;
  for (size_t i = 0; i < tmpl.size(); ++i) {
    if (tmpl[i] == '%' && i + 1 < tmpl.size()) {
      char c = tmpl[i + 1];
      if (c == 'h') {
        out += localHostName();
        ++i;
        continue;
      }
      if (c == 'p') {
        out += std::to_string(getpid());
        ++i;
        continue;
      }
      if (c == '%') {
        out += '%';
        ++i;
        continue;
      }
    }
    out += tmpl[i];
  }
  return out;
}

Result<Topology> forThisProcess() {
  if (auto nccl = params::get("NCCL_TOPO_FILE")) {
    static std::once_flag once;
    std::call_once(once, [&] {
      TUTTI_INFO(log::kInit | log::kEnv,
                 "NCCL_TOPO_FILE={} is ignored: it is NVIDIA's topology format; tutti reads hwloc "
                 "XML from TUTTI_TOPO_FILE (write one with tutti-topo --dump FILE)",
                 *nccl);
    });
  }
  std::optional<std::string> file = params::get("TUTTI_TOPO_FILE");
  Result<Topology> r = (file && !file->empty()) ? loadXml(*file) : discover();
  if (!r.isOk()) {
    if (file && !file->empty()) return r.status().withContext("TUTTI_TOPO_FILE");
    return r.status().withContext("topology discovery");
  }
  if (auto dump = params::get("TUTTI_TOPO_DUMP_FILE"); dump && !dump->empty()) {
    std::string path = expandPathTemplate(*dump);
    Status s = dumpXml(r.value(), path);
    if (s.isOk())
      TUTTI_INFO(kTopoLog | log::kEnv, "topology written to {} (TUTTI_TOPO_DUMP_FILE)", path);
    else
      TUTTI_WARN("TUTTI_TOPO_DUMP_FILE: {}", s.message());
  }
  return r;
}

// ---- presentation -----------------------------------------------------------------------

std::string formatCpuList(std::vector<int> cpus) {
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += j == i ? fmt::format("{}", cpus[i]) : fmt::format("{}-{}", cpus[i], cpus[j]);
    i = j + 1;
  }
  return out;
}

const char* pciKindName(PciKind kind) {
  switch (kind) {
    case PciKind::kAccelerator:
      return "accelerator";
    case PciKind::kNic:
      return "NIC";
    default:
      return "other";
  }
}

std::string describe(const Topology& t) {
  std::string s;
  s += fmt::format("host {} (host id 0x{:016x}, boot id {})\n",
                   t.hostname.empty() ? "?" : t.hostname, t.hostId,
                   t.bootId.empty() ? "unknown" : t.bootId);
  s += countsOf(t) + "\n";
  for (const auto& p : t.packages) {
    s += fmt::format("  package {}: ", p.osIndex);
    if (!p.cpuModel.empty()) s += p.cpuModel + ", ";
    s += fmt::format("cpus {}\n", p.cpus.empty() ? "none" : formatCpuList(p.cpus));
  }
  for (const auto& n : t.numaNodes)
    s += fmt::format("  NUMA {}: cpus {}, {}\n", n.osIndex,
                     n.cpus.empty() ? "none" : formatCpuList(n.cpus),
                     formatBytes(n.localMemoryBytes));
  if (!t.numaDistances.empty()) {
    s += "  NUMA distances:";
    for (size_t i = 0; i < t.numaDistances.size(); ++i) {
      s += fmt::format(" {}:[", t.numaNodes[i].osIndex);
      for (size_t j = 0; j < t.numaDistances[i].size(); ++j)
        s += fmt::format("{}{}", j ? " " : "", t.numaDistances[i][j]);
      s += "]";
    }
    s += "\n";
  }
  for (const auto& c : t.caches)
    s += fmt::format("  L{}{} {} shared by {} ({} in all)\n", c.level, cacheTypeSuffix(c),
                     formatBytes(c.sizeBytes), plural(c.sharedByPus, "thread", "threads"), c.count);
  for (const auto& d : t.pci) {
    s += fmt::format("  {} {}{}{} {:04x}:{:04x}", pciLabel(d), d.busId,
                     d.vendorName.empty() ? "" : " ", d.vendorName, d.vendorId, d.deviceId);
    if (d.kind == PciKind::kOther) s += fmt::format(" class {:04x}", d.classId);
    std::vector<std::string> names = d.ibDevs;
    names.insert(names.end(), d.netDevs.begin(), d.netDevs.end());
    names.insert(names.end(), d.otherDevs.begin(), d.otherDevs.end());
    for (const auto& n : names) s += " " + n;
    if (d.linkGBs > 0) s += fmt::format(" ({:g} GB/s link)", d.linkGBs);
    if (d.numaNode >= 0)
      s += fmt::format(" near NUMA {}", d.numaNode);
    else if (d.nearestNuma >= 0)
      s += fmt::format(" nearest NUMA {}", d.nearestNuma);
    if (d.kind == PciKind::kAccelerator) {
      if (d.nearestNic >= 0 && static_cast<size_t>(d.nearestNic) < t.pci.size())
        s += fmt::format(", nearest NIC {} ({})", t.pci[d.nearestNic].name(),
                         t.pci[d.nearestNic].busId);
      else
        s += ", no NIC";
    }
    s += "\n";
  }
  if (t.accelerators().empty()) s += "  no accelerators\n";
  if (t.nics().empty()) s += "  no NICs\n";
  if (t.intraLatencyUs || t.intraBandwidthGBs || t.interLatencyUs || t.interBandwidthGBs) {
    auto fig = [](const std::optional<double>& lat, const std::optional<double>& bw) {
      return fmt::format("{} us, {} GB/s", lat ? fmt::format("{:g}", *lat) : "?",
                         bw ? fmt::format("{:g}", *bw) : "?");
    };
    s += fmt::format("  measured: intra-node {}; inter-node {}\n",
                     fig(t.intraLatencyUs, t.intraBandwidthGBs),
                     fig(t.interLatencyUs, t.interBandwidthGBs));
  }
  return s;
}

std::string toJson(const Topology& t) {
  auto ints = [](const std::vector<int>& v) {
    return jsonArray(v, [](int x) { return std::to_string(x); });
  };
  auto strs = [](const std::vector<std::string>& v) { return jsonArray(v, jsonString); };
  std::string s = "{";
  s += "\"hostname\":" + jsonString(t.hostname);
  s += ",\"bootId\":" + jsonString(t.bootId);
  s += fmt::format(",\"hostId\":\"0x{:016x}\"", t.hostId);
  s += fmt::format(",\"cores\":{},\"pus\":{}", t.coreCount, t.puCount);
  s += ",\"packages\":" + jsonArray(t.packages, [&](const Package& p) {
         return fmt::format("{{\"osIndex\":{},\"cpuModel\":{},\"cpus\":{}}}", p.osIndex,
                            jsonString(p.cpuModel), ints(p.cpus));
       });
  s += ",\"numaNodes\":" + jsonArray(t.numaNodes, [&](const NumaNode& n) {
         return fmt::format("{{\"osIndex\":{},\"cpus\":{},\"localMemoryBytes\":{}}}", n.osIndex,
                            ints(n.cpus), n.localMemoryBytes);
       });
  s += ",\"numaDistances\":" + jsonArray(t.numaDistances, [](const std::vector<uint64_t>& row) {
         return jsonArray(row, [](uint64_t x) { return std::to_string(x); });
       });
  s += ",\"caches\":" + jsonArray(t.caches, [](const Cache& c) {
         return fmt::format(
             "{{\"level\":{},\"type\":\"{}\",\"sizeBytes\":{},\"sharedByPus\":{},\"count\":{}}}",
             c.level,
             c.type == CacheType::kData          ? "data"
             : c.type == CacheType::kInstruction ? "instruction"
                                                 : "unified",
             c.sizeBytes, c.sharedByPus, c.count);
       });
  s +=
      ",\"pci\":" + jsonArray(t.pci, [&](const PciDevice& d) {
        return fmt::format(
            "{{\"kind\":\"{}\",\"busId\":\"{}\",\"vendorId\":\"{:04x}\",\"deviceId\":\"{:04x}\","
            "\"classId\":\"{:04x}\",\"vendorName\":{},\"linkGBs\":{:g},\"netDevs\":{},"
            "\"ibDevs\":{},\"otherDevs\":{},\"numaNode\":{},\"nearestNuma\":{},\"nearestNic\":{}}}",
            pciKindName(d.kind), d.busId, d.vendorId, d.deviceId, d.classId,
            jsonString(d.vendorName), d.linkGBs, strs(d.netDevs), strs(d.ibDevs), strs(d.otherDevs),
            d.numaNode, d.nearestNuma, d.nearestNic);
      });
  s += ",\"intraLatencyUs\":" + jsonNumber(t.intraLatencyUs);
  s += ",\"intraBandwidthGBs\":" + jsonNumber(t.intraBandwidthGBs);
  s += ",\"interLatencyUs\":" + jsonNumber(t.interLatencyUs);
  s += ",\"interBandwidthGBs\":" + jsonNumber(t.interBandwidthGBs);
  return s + "}";
}

// ---- placement -----------------------------------------------------------------------------

Status bindThisThreadNear(const Topology& t, int numaNode) {
  if (numaNode < 0) {
    TUTTI_TRACE(kTopoLog, "topology: no NUMA node given, thread left unbound");
    return Status::ok();
  }
  const NumaNode* node = t.numa(numaNode);
  if (!node) {
    std::vector<int> have;
    for (const auto& n : t.numaNodes) have.push_back(n.osIndex);
    return invalidArgument(fmt::format("bindThisThreadNear: no NUMA node {} (nodes: {})", numaNode,
                                       have.empty() ? "none" : formatCpuList(have)));
  }
  // The process's allowed set: its main thread's mask (this thread may have
  // been narrowed already). Grow the set until the kernel accepts its size.
  int maxCpu = node->cpus.empty() ? 0 : node->cpus.back();
  long conf = sysconf(_SC_NPROCESSORS_CONF);
  int ncpu = std::max({1024, maxCpu + 1, conf > 0 ? static_cast<int>(conf) : 0});
  CpuSetPtr allowed;
  size_t size = 0;
  for (;;) {
    allowed.reset(CPU_ALLOC(ncpu));
    if (!allowed) return systemError("bindThisThreadNear: out of memory");
    size = CPU_ALLOC_SIZE(ncpu);
    CPU_ZERO_S(size, allowed.get());
    if (sched_getaffinity(getpid(), size, allowed.get()) == 0) break;
    if (errno != EINVAL || ncpu >= (1 << 22))
      return errnoError("bindThisThreadNear: sched_getaffinity", errno);
    ncpu *= 2;
  }
  CpuSetPtr want(CPU_ALLOC(ncpu));
  if (!want) return systemError("bindThisThreadNear: out of memory");
  CPU_ZERO_S(size, want.get());
  std::vector<int> chosen;
  for (int cpu : node->cpus) {
    if (cpu >= 0 && cpu < ncpu && CPU_ISSET_S(cpu, size, allowed.get())) {
      CPU_SET_S(cpu, size, want.get());
      chosen.push_back(cpu);
    }
  }
  if (chosen.empty()) {
    TUTTI_TRACE(kTopoLog,
                "topology: NUMA {} has no CPU this process may use (node cpus {}); thread left "
                "as it is",
                numaNode, node->cpus.empty() ? "none" : formatCpuList(node->cpus));
    return Status::ok();
  }
  int rc = pthread_setaffinity_np(pthread_self(), size, want.get());
  if (rc != 0) return errnoError("bindThisThreadNear: pthread_setaffinity_np", rc);
  TUTTI_TRACE(kTopoLog, "topology: thread bound near NUMA {}: cpus {}", numaNode,
              formatCpuList(chosen));
  return Status::ok();
}

int numaNodeCovering(const Topology& t, const std::vector<int>& cpus) {
  int found = -1;
  for (int cpu : cpus) {
    int node = -1;
    for (const NumaNode& n : t.numaNodes)
      if (std::binary_search(n.cpus.begin(), n.cpus.end(), cpu)) node = n.osIndex;
    if (node < 0 || (found >= 0 && node != found)) return -1;
    found = node;
  }
  return found;
}

int homeNumaNode(const Topology& t) {
  if (t.numaNodes.size() < 2) return -1;
  int ncpu = 1024;
  for (const NumaNode& n : t.numaNodes)
    if (!n.cpus.empty()) ncpu = std::max(ncpu, n.cpus.back() + 1);
  for (;;) {
    CpuSetPtr mask(CPU_ALLOC(ncpu));
    if (!mask) return -1;
    const size_t size = CPU_ALLOC_SIZE(ncpu);
    CPU_ZERO_S(size, mask.get());
    if (pthread_getaffinity_np(pthread_self(), size, mask.get()) == 0) {
      std::vector<int> cpus;
      for (int c = 0; c < ncpu; ++c)
        if (CPU_ISSET_S(c, size, mask.get())) cpus.push_back(c);
      const int home = numaNodeCovering(t, cpus);
      TUTTI_TRACE(kTopoLog, "topology: thread cpus {} -> home NUMA node {}", formatCpuList(cpus),
                  home);
      return home;
    }
    if (ncpu >= (1 << 22)) return -1;
    ncpu *= 2;  // EINVAL: the kernel's mask is wider
  }
}

void placeOnNode(void* p, size_t bytes, int numaNode) {
  if (!p || bytes == 0) return;
  if (numaNode < 0) {
    TUTTI_TRACE(log::kAlloc, "placeOnNode: no NUMA node given, {} bytes at {} left where they are",
                bytes, p);
    return;
  }
  auto hw = discoveredHardware();
  if (!hw.isOk()) {
    TUTTI_INFO(log::kAlloc, "placeOnNode: {}; memory left where it is", hw.status().message());
    return;
  }
  hwloc_topology_t topo = hw.value()->hwloc->topo;
  hwloc_obj_t node = hwloc_get_numanode_obj_by_os_index(topo, static_cast<unsigned>(numaNode));
  if (!node) {
    TUTTI_INFO(log::kAlloc,
               "placeOnNode: this machine has no NUMA node {}; memory left where it is", numaNode);
    return;
  }
  errno = 0;
  if (hwloc_set_area_membind(topo, p, bytes, node->nodeset, HWLOC_MEMBIND_BIND,
                             HWLOC_MEMBIND_BYNODESET | HWLOC_MEMBIND_MIGRATE) != 0) {
    TUTTI_INFO(log::kAlloc, "placeOnNode: binding {} bytes at {} to NUMA {} failed: {}", bytes, p,
               numaNode, errno ? strerror(errno) : "unsupported");
    return;
  }
  TUTTI_TRACE(log::kAlloc, "placeOnNode: {} bytes at {} bound to NUMA {}", bytes, p, numaNode);
}

std::optional<uint64_t> parsePciBusId(const std::string& busId) {
  // Fields from the right: function after '.', then device, bus, domain.
  const size_t dot = busId.rfind('.');
  if (dot == std::string::npos) return std::nullopt;
  std::vector<std::string> parts;
  size_t pos = 0;
  const std::string head = busId.substr(0, dot);
  for (;;) {
    const size_t colon = head.find(':', pos);
    parts.push_back(head.substr(pos, colon == std::string::npos ? std::string::npos : colon - pos));
    if (colon == std::string::npos) break;
    pos = colon + 1;
  }
  if (parts.size() == 2) parts.insert(parts.begin(), "0");
  if (parts.size() != 3) return std::nullopt;
  parts.push_back(busId.substr(dot + 1));
  const size_t maxDigits[4] = {8, 2, 2, 1};
  const uint64_t maxValue[4] = {0xffffffffu, 0xff, 0x1f, 0x7};
  uint64_t v[4] = {};
  for (int i = 0; i < 4; ++i) {
    const std::string& f = parts[static_cast<size_t>(i)];
    if (f.empty() || f.size() > maxDigits[i] ||
        f.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos)
      return std::nullopt;
    v[i] = std::stoull(f, nullptr, 16);
    if (v[i] > maxValue[i]) return std::nullopt;
  }
  return v[0] << 32 | v[1] << 16 | v[2] << 8 | v[3];
}

const PciDevice* findPciDevice(const Topology& t, const std::string& busId) {
  const std::optional<uint64_t> want = parsePciBusId(busId);
  if (!want) return nullptr;
  for (const PciDevice& d : t.pci)
    if (parsePciBusId(d.busId) == want) return &d;
  return nullptr;
}

const PciDevice* findNetDevice(const Topology& t, const std::string& ifName) {
  if (ifName.empty()) return nullptr;
  for (const PciDevice& d : t.pci)
    if (std::find(d.netDevs.begin(), d.netDevs.end(), ifName) != d.netDevs.end()) return &d;
  return nullptr;
}

int numaNodeNear(const PciDevice& d) { return d.numaNode >= 0 ? d.numaNode : d.nearestNuma; }

}  // namespace tutti::topo
