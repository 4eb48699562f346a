// Topology: what this machine is made of and who it is, as plain data.
//
// Contract
// - discover() asks hwloc (2.x) about this machine: packages, NUMA nodes
//   (CPUs, local memory, distances), cores, PUs (hardware threads), caches,
//   and the PCI devices that matter to tutti (accelerators, NICs; others are
//   listed as kOther). The hardware part is discovered once per process and
//   cached (hwloc takes tens of milliseconds); the identity (hostname, boot
//   id, host id) is re-read at every call, so TUTTI_HOST_ID set later counts.
//   Discovery never starts a vendor runtime: hwloc's CUDA, NVML, OpenCL,
//   ROCm SMI, Level Zero and GL components are off (PCI comes from sysfs).
// - loadXml()/dumpXml() use hwloc's own XML format. tutti's additions are info
//   attributes on the root object, all named Tutti*: TuttiHostname,
//   TuttiBootId, TuttiHostId (0x-prefixed hex), and the optional measured link
//   figures TuttiIntraLatencyUs, TuttiIntraBandwidthGBs, TuttiInterLatencyUs,
//   TuttiInterBandwidthGBs (decimal doubles). A dumped file loads back to an
//   equal Topology (operator==). A loaded file reports the identity it
//   records, so tests can fake machines; TUTTI_HOST_ID, when set, still
//   decides the host id. A file without Tutti* attributes (plain lstopo
//   output) takes its hostname from hwloc's HostName attribute.
// - forThisProcess() is what the communicator calls at init: TUTTI_TOPO_FILE
//   (load instead of discovering), TUTTI_TOPO_DUMP_FILE (write what was used),
//   NCCL_TOPO_FILE (NVIDIA's format: one INFO line, otherwise ignored).
// - A Topology is a value. Copies are cheap: the hwloc tree behind one is
//   shared, never modified after construction, and freed with the last copy.
//   Any number of threads may read one Topology and call every function here
//   concurrently.
// - NUMA nodes are named by their OS index everywhere (fields and arguments
//   called numaNode); -1 means unknown or none. CPUs are PU OS indices, the
//   numbers sched_setaffinity and taskset use.
// - Nothing here blocks except on file I/O and hwloc discovery (bounded by
//   reading /sys and /proc). Errors are returned as Status/Result, never thrown.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"

namespace tutti::topo {

namespace detail {
struct HwlocTree;  // the hwloc topology a Topology was built from (topology.cc)
}  // namespace detail

struct Package {
  int osIndex = -1;
  std::string cpuModel;   // hwloc's CPUModel, trailing blanks removed; may be empty
  std::vector<int> cpus;  // PU OS indices, ascending
  bool operator==(const Package& o) const;
};

struct NumaNode {
  int osIndex = -1;
  std::vector<int> cpus;  // PU OS indices, ascending; empty for memory-only nodes
  uint64_t localMemoryBytes = 0;
  bool operator==(const NumaNode& o) const;
};

enum class CacheType { kUnified, kData, kInstruction };

// One kind of cache: every cache object with the same level, type, size and
// sharing is counted once here.
struct Cache {
  int level = 0;  // 1, 2, 3, ...
  CacheType type = CacheType::kUnified;
  uint64_t sizeBytes = 0;
  int sharedByPus = 0;  // PUs (hardware threads) sharing one such cache
  int count = 0;        // how many of them the machine has
  bool operator==(const Cache& o) const;
};

enum class PciKind {
  kAccelerator,  // class 0x12xx (processing accelerator), or 0x03xx from NVIDIA, AMD or Intel
  kNic,          // class 0x02xx (Ethernet, InfiniBand, ...)
  kOther,
};

struct PciDevice {
  PciKind kind = PciKind::kOther;
  std::string busId;  // "dddd:bb:dd.f", lower-case hex
  uint16_t vendorId = 0;
  uint16_t deviceId = 0;
  uint16_t classId = 0;                // class << 8 | subclass, e.g. 0x0302
  std::string vendorName;              // "NVIDIA", "Mellanox", ...; empty when unknown
  double linkGBs = 0;                  // PCIe link bandwidth hwloc reports (GB/s, 0: unknown)
  std::vector<std::string> netDevs;    // OS network interfaces (eth0, ib0)
  std::vector<std::string> ibDevs;     // ibverbs devices (mlx5_0)
  std::vector<std::string> otherDevs;  // other OS devices hwloc names (card0, renderD128, vda)
  // The NUMA node the device is attached under; -1 when its locality spans
  // several nodes or none is known.
  int numaNode = -1;
  // The NUMA node closest in the hwloc tree: deepest common ancestor, then
  // fewest hops, then lowest OS index.
  int nearestNuma = -1;
  // Accelerators only: index in Topology::pci of the NIC closest in the tree
  // (same rule; ties: lowest index); -1 when there is none.
  int nearestNic = -1;
  bool operator==(const PciDevice& o) const;

  // What to call it: the first ibverbs name, else the first netdev, else the
  // first other OS device, else the bus id.
  std::string name() const;
};

struct Topology {
  // Identity.
  std::string hostname;
  std::string bootId;   // /proc/sys/kernel/random/boot_id; empty when unknown
  uint64_t hostId = 0;  // equal on every process of one node (see localHostId)

  // Hardware.
  std::vector<Package> packages;
  std::vector<NumaNode> numaNodes;  // ascending OS index
  // numaDistances[i][j]: hwloc's relative distance (latency-like, 10 = local)
  // from numaNodes[i] to numaNodes[j]; empty when the machine reports none.
  std::vector<std::vector<uint64_t>> numaDistances;
  int coreCount = 0;
  int puCount = 0;
  std::vector<Cache> caches;   // ascending level, then type, size
  std::vector<PciDevice> pci;  // hwloc's order (depth-first, by bus id under each bridge)

  // Measured link figures, when someone measured and recorded them.
  std::optional<double> intraLatencyUs;
  std::optional<double> intraBandwidthGBs;
  std::optional<double> interLatencyUs;
  std::optional<double> interBandwidthGBs;

  // Set by discover()/loadXml(); dumpXml() needs it. A hand-built Topology
  // has none. Not compared by operator==.
  std::shared_ptr<const detail::HwlocTree> hwloc;

  // Every field above except hwloc.
  bool operator==(const Topology& o) const;
  bool operator!=(const Topology& o) const { return !(*this == o); }

  const NumaNode* numa(int osIndex) const;  // nullptr when absent
  std::vector<int> accelerators() const;    // indices into pci
  std::vector<int> nics() const;            // indices into pci
};

// ---- node identity -----------------------------------------------------------
std::string localHostName();  // gethostname()
std::string localBootId();    // boot_id, trimmed; empty when unreadable
// FNV-1a of "hostname|bootId": the host id of a machine without an override.
uint64_t hostIdOf(const std::string& hostname, const std::string& bootId);
// TUTTI_HOST_ID (hashed) when set, else hostIdOf(localHostName(), localBootId()).
uint64_t localHostId();

// ---- discovery and files -------------------------------------------------------
// This machine, through hwloc with I/O discovery on (important devices only).
Result<Topology> discover();
// An hwloc XML file (lstopo --of xml, dumpXml, tutti-topo --dump). Errors name
// the path and the reason. Refused besides what hwloc refuses: files that
// hwloc 2.9 would crash on (topology/xml_guard.h), that describe no machine,
// and that hwloc reads back otherwise once it has written them (checked by
// writing and reading it again: what loads is what its dump loads). hwloc
// reads it in another process first, so that a crash of hwloc is the file's
// error (topology/xml_guard.h).
Result<Topology> loadXml(const std::string& path);

// loadXml without reading the file in another process first: what that
// process runs (`tutti-topo --read-apart`, topology/xml_guard.h). A file
// hwloc 2.9 crashes on crashes the caller.
Result<Topology> loadXmlHere(const std::string& path);

// Whether hwloc can read XML it did not write itself (comments, hand-made
// files such as tests/unit/data/*.xml): true when hwloc's libxml2 reader is
// installed (Debian: libhwloc-plugins). Without it hwloc falls back to its
// minimal parser, which reads only hwloc's own output; loadXml's error then
// says so. Probed once per process by loading a tiny hand-written topology.
bool hwlocReadsAnyXml();
// Writes t as hwloc XML plus the Tutti* root attributes, atomically (a
// temporary file renamed over path); "-" writes to stdout. t must come from
// discover() or loadXml() (invalidArgument otherwise).
Status dumpXml(const Topology& t, const std::string& path);

// The topology the communicator uses. Call once at init (cheap after the
// first call in a process):
//   TUTTI_ASSIGN_OR_RETURN(topo::Topology topo, topo::forThisProcess());
// - TUTTI_TOPO_FILE set and non-empty: loadXml(that file); a missing or
//   unparsable file is an error naming the variable, the path and the reason.
// - else discover().
// - TUTTI_TOPO_DUMP_FILE set: the result is also written there, with %h
//   replaced by this host's name and %p by the pid; a failed write is a WARN,
//   not an error.
// - NCCL_TOPO_FILE set: one INFO line per process saying it is NVIDIA's
//   format and ignored (use TUTTI_TOPO_FILE).
// Thread-safe.
Result<Topology> forThisProcess();

// "%h" -> this host's name, "%p" -> pid, "%%" -> "%". Exposed for tests.
std::string expandPathTemplate(const std::string& tmpl);

// ---- presentation ----------------------------------------------------------------
// Multi-line human-readable summary; the first lines are the identity and
// "N packages, N NUMA nodes, N cores / N threads".
std::string describe(const Topology& t);
// The same content as one JSON object (tutti-topo --json).
std::string toJson(const Topology& t);
// {0,1,2,3,8,10,11} -> "0-3,8,10-11"; "" for none. Input need not be sorted.
std::string formatCpuList(std::vector<int> cpus);
const char* pciKindName(PciKind kind);  // "accelerator", "NIC", "other"

// ---- placement of tutti's own threads and buffers --------------------------------
// Restricts the calling thread to the PUs of NUMA node numaNode (OS index)
// that the process may use (the affinity mask of the process's main thread,
// as set by taskset, numactl or a launcher). Never leaves the thread with an
// empty mask: when no such PU exists the thread is left as it is (logged at
// TRACE) and ok is returned, as it is for numaNode < 0. A numaNode not in t
// is invalidArgument; a failing pthread_setaffinity_np is a system error.
Status bindThisThreadNear(const Topology& t, int numaNode);
// Best effort: asks that the pages of [p, p+bytes) live on NUMA node
// numaNode of this machine (hwloc_set_area_membind, migrating pages already
// touched). Failure, an unknown node or numaNode < 0 changes nothing and is
// logged at INFO (subsystem ALLOC).
void placeOnNode(void* p, size_t bytes, int numaNode);
// The NUMA node (OS index) whose CPUs include every one of `cpus`; -1 when
// cpus is empty, names a CPU no node of t has, or spans several nodes.
int numaNodeCovering(const Topology& t, const std::vector<int>& cpus);
// Where a rank driven by the calling thread lives: numaNodeCovering() of the
// thread's affinity mask, as a launcher, taskset or numactl set it. -1 (leave
// memory to first touch) when t has fewer than two NUMA nodes, when the mask
// spans nodes (an unbound thread goes wherever the scheduler puts it) or when
// the mask cannot be read. tutti's shared-memory transport and one-shot arena
// place the memory each rank reads or writes most on this node (docs/topology.md,
// "Placement").
int homeNumaNode(const Topology& t);

// ---- devices by PCI address ----------------------------------------------------
// Parses a PCI bus id "[domain:]bus:device.function" (hex, either case; the
// domain up to 8 digits, 0 when left out, so "17:00.0", "0000:17:00.0" and
// CUDA's "00000000:17:00.0" are the same address) into
// domain << 32 | bus << 16 | device << 8 | function; nullopt when it is not
// one (bus up to 0xff, device up to 0x1f, function up to 7).
std::optional<uint64_t> parsePciBusId(const std::string& busId);
// The PCI device of t at busId (compared as parsePciBusId values); nullptr
// when busId does not parse or t has no device there.
const PciDevice* findPciDevice(const Topology& t, const std::string& busId);
// The PCI device of t that carries the network interface `ifName` (one of
// its netDevs); nullptr when none does (a virtual interface, loopback).
const PciDevice* findNetDevice(const Topology& t, const std::string& ifName);
// The NUMA node to place work for that device on: its numaNode, else its
// nearestNuma; -1 when neither is known.
int numaNodeNear(const PciDevice& d);

}  // namespace tutti::topo
