#include "base/params.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <set>

#include "base/log.h"

namespace tutti::params {
namespace {

// The process's parameter state. Allocated once and never destroyed: threads
// tutti detaches (the bootstrap root) may look a parameter up while the
// process exits, after static destructors would have run.
struct State {
  std::mutex mu;
  bool loaded = false;
  std::map<std::string, Setting> file;  // values from config files, with their file
  std::vector<std::string> unreadable;  // "VAR=path (reason)": named config files not read
  std::set<std::string> warned;         // names warned about (bad value, below minimum)
  std::set<std::string> read;           // names looked up through get()
  bool reported = false;                // reportEnvironment() has run
};
State& state() {
  static State* s = new State();
  return *s;
}

// True the first time `key` enters `seen` (one of State's sets), under the
// lock: each "once per process" message of this file goes through it.
bool firstTime(std::set<std::string> State::*seen, std::string key) {
  std::lock_guard<std::mutex> lk(state().mu);
  return (state().*seen).insert(std::move(key)).second;
}

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

}  // namespace

std::vector<std::pair<std::string, std::string>> parseConfigText(std::string_view text) {
  std::vector<std::pair<std::string, std::string>> out;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    std::string line(text.substr(0, nl));
    text.remove_prefix(nl == std::string_view::npos ? text.size() : nl + 1);
    auto hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string key = trim(line.substr(0, eq));
    std::string val = trim(line.substr(eq + 1));
    if (key.empty()) continue;
    out.emplace_back(std::move(key), std::move(val));
  }
  return out;
}

namespace {

// `namedBy`: the variable that names this file (its absence is then an error
// worth a warning); nullptr for the default locations, which may be missing.
void loadFile(const std::string& path, const char* namedBy) {
  std::ifstream in(path);
  if (!in) {
    if (namedBy)
      state().unreadable.push_back(std::string(namedBy) + "=" + path + " (" + std::strerror(errno) +
                                   ")");
    return;
  }
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The first file read wins (highest precedence first).
  for (auto& [key, val] : parseConfigText(text))
    state().file.emplace(std::move(key), Setting{std::move(val), path});
}

void ensureLoaded() {
  if (state().loaded) return;
  state().loaded = true;
  if (const char* p = std::getenv("TUTTI_CONF_FILE"); p && *p) loadFile(p, "TUTTI_CONF_FILE");
  if (const char* p = std::getenv("NCCL_CONF_FILE"); p && *p) loadFile(p, "NCCL_CONF_FILE");
  if (const char* home = std::getenv("HOME")) {
    loadFile(std::string(home) + "/.tutti.conf", nullptr);
    loadFile(std::string(home) + "/.nccl.conf", nullptr);
  }
  loadFile("/etc/tutti.conf", nullptr);
  loadFile("/etc/nccl.conf", nullptr);
}

// The first lookup of a set name prints NCCL's line; names with no effect are
// left to reportEnvironment()'s WARN (a "set by" line would suggest they work).
void announce(const char* name, const std::optional<Setting>& s) {
  if (!firstTime(&State::read, name) || !s) return;
  const Known* k = findKnown(name);
  if (k && k->effect == Effect::kNoEffect) return;
  if (s->file.empty())
    TUTTI_INFO(log::kEnv, "{} set by environment to {}.", name, s->value);
  else
    TUTTI_INFO(log::kEnv, "{} set by config file {} to {}.", name, s->file, s->value);
}

constexpr const char* kNoIb = "tutti has no InfiniBand transport (shared memory and TCP only)";
constexpr const char* kGpuKernel =
    "it tunes NCCL's GPU kernels and protocols; tutti's host transports have none";
constexpr const char* kPyTorch = "read by PyTorch's ProcessGroupNCCL, not by the library";
constexpr const char* kBuild = "a build or module-system variable, not a runtime setting";

const std::vector<Known> kRegistry = {
    // ---- NCCL names tutti honours
    {"NCCL_DEBUG", false, Effect::kHonoured, "log level: VERSION, WARN, INFO, ABORT, TRACE"},
    {"NCCL_DEBUG_SUBSYS", false, Effect::kHonoured, "log subsystems; ^ negates"},
    {"NCCL_DEBUG_FILE", false, Effect::kHonoured, "log file (%h host, %p pid)"},
    {"NCCL_CONF_FILE", false, Effect::kHonoured, "config file read after TUTTI_CONF_FILE"},
    {"NCCL_COMM_ID", false, Effect::kHonoured, "host:port of the bootstrap root"},
    {"NCCL_SOCKET_IFNAME", false, Effect::kHonoured, "interfaces for bootstrap and TCP"},
    {"NCCL_SOCKET_FAMILY", false, Effect::kHonoured, "AF_INET or AF_INET6"},
    {"NCCL_SOCKET_SNDBUF", false, Effect::kHonoured, "TCP send buffer size"},
    {"NCCL_SOCKET_RCVBUF", false, Effect::kHonoured, "TCP receive buffer size"},
    {"NCCL_SHM_DISABLE", false, Effect::kHonoured,
     "1: ranks of one host use TCP instead of shared memory"},
    {"NCCL_BUFFSIZE", false, Effect::kDifferent,
     "bytes of each shared-memory ring per direction and channel (at least 64K); also bounds "
     "TUTTI_CHUNK_SIZE"},
    {"NCCL_MIN_NCHANNELS", false, Effect::kDifferent,
     "lower bound on TUTTI_NCHANNELS (connections per peer)"},
    {"NCCL_MAX_NCHANNELS", false, Effect::kDifferent,
     "upper bound on TUTTI_NCHANNELS (connections per peer)"},
    {"NCCL_ALGO", false, Effect::kDifferent,
     "forces the all-reduce algorithm: ring, tree (recursive doubling), 2dring, hierarchical, "
     "rabenseifner; other names leave the choice to the cost model"},
    {"NCCL_P2P_DISABLE", false, Effect::kDifferent,
     "1: no device-to-device IPC path (device backends); collectives are staged through host "
     "memory"},
    // ---- NCCL names accepted with no effect (one WARN each when set)
    {"NCCL_PROTO", false, Effect::kNoEffect,
     "NCCL's protocols (LL, LL128, Simple) are GPU-kernel concepts; tutti's host transports "
     "have one protocol"},
    {"NCCL_TOPO_FILE", false, Effect::kNoEffect,
     "it names a file in NCCL's own XML topology format, which tutti does not read; tutti reads "
     "hwloc XML from TUTTI_TOPO_FILE (write one with tutti-topo --dump FILE)"},
    {"NCCL_TOPO_DUMP_FILE", false, Effect::kNoEffect,
     "NCCL writes its own XML topology format there, which tutti does not write; "
     "TUTTI_TOPO_DUMP_FILE writes tutti's topology as hwloc XML"},
    {"NCCL_TOPO_DUMP_FILE_RANK", false, Effect::kNoEffect,
     "goes with NCCL_TOPO_DUMP_FILE, which tutti does not write"},
    {"NCCL_GRAPH_FILE", false, Effect::kNoEffect,
     "NCCL's channel-graph XML; tutti builds no such graphs (its algorithm choice is logged at "
     "INFO, subsystem TUNING)"},
    {"NCCL_GRAPH_DUMP_FILE", false, Effect::kNoEffect,
     "NCCL's channel-graph XML; tutti builds no such graphs (its algorithm choice is logged at "
     "INFO, subsystem TUNING)"},
    {"NCCL_GRAPH_DUMP_FILE_RANK", false, Effect::kNoEffect,
     "goes with NCCL_GRAPH_DUMP_FILE, which tutti does not write"},
    {"NCCL_IB_", true, Effect::kNoEffect, kNoIb},
    {"NCCL_NET", false, Effect::kDifferent,
     "the network for peers shared memory does not carry: Socket (tutti's TCP) or the name of "
     "the loaded NCCL net plugin, case-insensitive; IB has no effect (no InfiniBand transport "
     "yet: TCP)"},
    {"NCCL_NET_PLUGIN", false, Effect::kHonoured,
     "the NCCL net plugin to load: none, a name X (libnccl-net-X.so) or a file; unset: "
     "libnccl-net.so if the loader finds one"},
    {"NCCL_NET_", true, Effect::kNoEffect,
     "it tunes NCCL's network transports (GPUDirect RDMA, net plugins); tutti's TCP transport "
     "has no such setting"},
    {"NCCL_GDRCOPY_", true, Effect::kNoEffect,
     "GDRCopy is for GPU memory behind a NIC; tutti has none"},
    {"NCCL_CROSS_NIC", false, Effect::kNoEffect,
     "it shapes NCCL's multi-NIC rings; tutti's TCP transport uses the interfaces of "
     "NCCL_SOCKET_IFNAME"},
    {"NCCL_COLLNET_", true, Effect::kNoEffect,
     "CollNet needs an in-network reduction plugin; tutti has none"},
    {"NCCL_NVLS_", true, Effect::kNoEffect, "NVLink SHARP: tutti has no NVLink transport"},
    {"NCCL_MNNVL_", true, Effect::kNoEffect, "multi-node NVLink: tutti has no NVLink transport"},
    {"NCCL_NVB_DISABLE", false, Effect::kNoEffect, "tutti has no NVLink transport"},
    {"NCCL_PXN_DISABLE", false, Effect::kNoEffect,
     "PXN routes through NVLink to a NIC; tutti has no NVLink transport"},
    {"NCCL_CUMEM_ENABLE", false, Effect::kNoEffect,
     "tutti's device backends decide how device memory is allocated"},
    {"NCCL_P2P_", true, Effect::kNoEffect,
     "it tunes NCCL's GPU peer-to-peer transport; tutti's device path is set by "
     "TUTTI_DEVICE_IPC and TUTTI_IPC_* (NCCL_P2P_DISABLE=1 turns it off)"},
    {"NCCL_SHM_", true, Effect::kNoEffect,
     "it tunes NCCL's shared-memory transport; tutti's rings are sized by NCCL_BUFFSIZE "
     "(NCCL_SHM_DISABLE=1 turns them off)"},
    {"NCCL_NTHREADS", false, Effect::kNoEffect,
     "tutti's host kernels do not use it (in NCCL it sets the CUDA threads per block)"},
    {"NCCL_SOCKET_NTHREADS", false, Effect::kNoEffect,
     "tutti's TCP transport opens TUTTI_NCHANNELS connections per peer, driven by its own "
     "progress thread"},
    {"NCCL_NSOCKS_PERTHREAD", false, Effect::kNoEffect,
     "tutti's TCP transport opens TUTTI_NCHANNELS connections per peer, driven by its own "
     "progress thread"},
    {"NCCL_NCHANNELS", false, Effect::kNoEffect,
     "the channel count is TUTTI_NCHANNELS, bounded by NCCL_MIN_NCHANNELS and NCCL_MAX_NCHANNELS"},
    {"NCCL_MIN_NRINGS", false, Effect::kNoEffect, "an old name; tutti reads NCCL_MIN_NCHANNELS"},
    {"NCCL_MAX_NRINGS", false, Effect::kNoEffect, "an old name; tutti reads NCCL_MAX_NCHANNELS"},
    {"NCCL_MIN_CTAS", false, Effect::kNoEffect,
     "tutti reads config.minCTAs and NCCL_MIN_NCHANNELS, not this variable"},
    {"NCCL_MAX_CTAS", false, Effect::kNoEffect,
     "tutti reads config.maxCTAs and NCCL_MAX_NCHANNELS, not this variable"},
    {"NCCL_CGA_CLUSTER_SIZE", false, Effect::kNoEffect, kGpuKernel},
    {"NCCL_LL_", true, Effect::kNoEffect, kGpuKernel},
    {"NCCL_LL128_", true, Effect::kNoEffect, kGpuKernel},
    {"NCCL_TREE_THRESHOLD", false, Effect::kNoEffect, kGpuKernel},
    {"NCCL_LAUNCH_MODE", false, Effect::kNoEffect, kGpuKernel},
    {"NCCL_WORK_FIFO_DEPTH", false, Effect::kNoEffect, kGpuKernel},
    {"NCCL_GRAPH_REGISTER", false, Effect::kNoEffect, "tutti registers no user buffers"},
    {"NCCL_LOCAL_REGISTER", false, Effect::kNoEffect, "tutti registers no user buffers"},
    {"NCCL_DMABUF_ENABLE", false, Effect::kNoEffect, "tutti registers no GPU memory with a NIC"},
    {"NCCL_TUNER_PLUGIN", false, Effect::kNoEffect,
     "tutti loads no NCCL tuner plugins (its cost model picks the algorithm; NCCL_ALGO forces "
     "one)"},
    {"NCCL_PROFILER_PLUGIN", false, Effect::kNoEffect, "tutti loads no NCCL profiler plugins"},
    {"NCCL_COMM_BLOCKING", false, Effect::kNoEffect,
     "not implemented: pass config.blocking to ncclCommInitRankConfig"},
    {"NCCL_IGNORE_CPU_AFFINITY", false, Effect::kNoEffect, "not implemented"},
    {"NCCL_CHECK_POINTERS", false, Effect::kNoEffect, "not implemented"},
    {"NCCL_RAS_ENABLE", false, Effect::kNoEffect, "not implemented"},
    {"NCCL_RUNTIME_CONNECT", false, Effect::kNoEffect, "not implemented"},
    {"NCCL_SET_STACK_SIZE", false, Effect::kNoEffect, "not implemented"},
    {"NCCL_SET_THREAD_NAME", false, Effect::kNoEffect, "not implemented"},
    // ---- NCCL_* names other programs read (never WARNed)
    {"NCCL_TESTS_", true, Effect::kNotLibrary, "read by nccl-tests and tutti-perf"},
    {"NCCL_ASYNC_ERROR_HANDLING", false, Effect::kNotLibrary, kPyTorch},
    {"NCCL_BLOCKING_WAIT", false, Effect::kNotLibrary, kPyTorch},
    {"NCCL_DESYNC_DEBUG", false, Effect::kNotLibrary, kPyTorch},
    {"NCCL_ENABLE_TIMING", false, Effect::kNotLibrary, kPyTorch},
    {"NCCL_HOME", false, Effect::kNotLibrary, kBuild},
    {"NCCL_ROOT", false, Effect::kNotLibrary, kBuild},
    {"NCCL_ROOT_DIR", false, Effect::kNotLibrary, kBuild},
    {"NCCL_DIR", false, Effect::kNotLibrary, kBuild},
    {"NCCL_INCLUDE_DIR", false, Effect::kNotLibrary, kBuild},
    {"NCCL_LIB_DIR", false, Effect::kNotLibrary, kBuild},
    {"NCCL_LIBRARY", false, Effect::kNotLibrary, kBuild},
    {"NCCL_VERSION", false, Effect::kNotLibrary, kBuild},
    // ---- tutti's own (docs/env.md has the details)
    {"TUTTI_PERF_", true, Effect::kNotLibrary, "read by tutti-perf (docs/tutti-perf.md)"},
    {"TUTTI_CONF_FILE", false, Effect::kHonoured, "config file read first"},
    {"TUTTI_NCHANNELS", false, Effect::kHonoured, "channels (connections) per peer"},
    {"TUTTI_CHUNK_SIZE", false, Effect::kHonoured, "largest message of a pipelined collective"},
    {"TUTTI_RD_MAX", false, Effect::kHonoured, "all-reduce up to this size by recursive doubling"},
    {"TUTTI_LINK_PROBE", false, Effect::kHonoured,
     "measure the ring's inter-node links at init (cost model, balanced ring)"},
    {"TUTTI_BALANCE", false, Effect::kHonoured,
     "0: equal ring segments; default 1: large ring all-reduces share the vector by the "
     "measured link rates (rank 0's value holds)"},
    {"TUTTI_REPLAN_BYTES", false, Effect::kHonoured,
     "re-plan the balanced shares from the links' measured rates after every this many bytes of "
     "all-reduce (default 64 MiB; 0: keep the plan made at init; rank 0's value holds)"},
    {"TUTTI_TUNE", false, Effect::kHonoured,
     "run-time tuning of large collectives: 1 (default) or a list of algo, channels, chunk; 0: "
     "off (rank 0's value holds)"},
    {"TUTTI_TUNE_MIN_BYTES", false, Effect::kHonoured,
     "smallest collective tuned at run time (default 1 MiB; rank 0's value holds)"},
    {"TUTTI_ONESHOT_MAX", false, Effect::kHonoured, "one-shot path for small collectives"},
    {"TUTTI_CMA", false, Effect::kHonoured, "single-copy collectives by cross-memory attach"},
    {"TUTTI_CMA_MIN_BYTES", false, Effect::kHonoured, "smallest single-copy collective"},
    {"TUTTI_COMPRESSION", false, Effect::kHonoured, "fp16/bf16 inter-node all-reduce"},
    {"TUTTI_COMPRESSION_MIN_BYTES", false, Effect::kHonoured, "smallest compressed all-reduce"},
    {"TUTTI_POWERSGD_NODE_FEEDBACK", false, Effect::kHonoured, "PowerSGD residual per node"},
    {"TUTTI_POWERSGD_STAGING", false, Effect::kHonoured, "PowerSGD shared-memory stage"},
    {"TUTTI_POWERSGD_SHARE_MIN_BYTES", false, Effect::kHonoured,
     "smallest PowerSGD matrix whose residual is shared per node"},
    {"TUTTI_TIMEOUT", false, Effect::kHonoured, "seconds without progress before an error"},
    {"TUTTI_DEBUG_DUMP", false, Effect::kHonoured,
     "file the flight recorder appends to when a communicator fails"},
    {"TUTTI_NET", false, Effect::kHonoured,
     "the network for peers shared memory does not carry: tcp, ucx or ofi (plugins in "
     "lib/tutti; ibverbs: not written yet); unset: an NCCL net plugin if one is loaded, else tcp"},
    {"TUTTI_INIT_TIMEOUT", false, Effect::kHonoured, "seconds for every rank to join at init"},
    {"TUTTI_HOST_ID", false, Effect::kHonoured, "node identity"},
    {"TUTTI_TEST_NODES", false, Effect::kHonoured, "testing: ranks per pretend node"},
    {"TUTTI_TEST_THROTTLE", false, Effect::kHonoured, "testing: throttle one channel"},
    {"TUTTI_TEST_LINK_MBPS", false, Effect::kHonoured,
     "testing: from:to:MBps,... (* any rank), network links that run at those rates"},
    {"TUTTI_TOPO_FILE", false, Effect::kHonoured, "hwloc XML topology instead of discovery"},
    {"TUTTI_TOPO_DUMP_FILE", false, Effect::kHonoured, "write the topology as hwloc XML"},
    {"TUTTI_TOPO_READER", false, Effect::kHonoured,
     "the program that reads a topology file first in a process with threads"},
    {"TUTTI_BOOTSTRAP_SECRET", false, Effect::kHonoured,
     "with NCCL_COMM_ID: the secret every connection's key is derived from"},
    {"TUTTI_BOOTSTRAP_SECRET_FILE", false, Effect::kHonoured,
     "with NCCL_COMM_ID: a file whose bytes the key is derived from"},
    {"TUTTI_PLUGIN_PATH", false, Effect::kHonoured, "plugin search directories"},
    {"TUTTI_BACKEND_PLUGIN", false, Effect::kHonoured, "the process's device backend"},
    {"TUTTI_DEVICE_IPC", false, Effect::kHonoured, "0: stage device collectives through host"},
    {"TUTTI_IPC_CHUNK_BYTES", false, Effect::kHonoured, "device-to-device round size"},
    {"TUTTI_IPC_MIN_BYTES", false, Effect::kHonoured, "smallest device-to-device collective"},
    {"TUTTI_ZE_DEVICE", false, Effect::kHonoured, "Level Zero backend: the device to use"},
    {"TUTTI_TORCH_TRACE", false, Effect::kHonoured, "tutti_torch: JSON trace file prefix"},
    {"TUTTI_TORCH_TERMINATE_TRACE", false, Effect::kHonoured,
     "tutti_torch: 1 prints the stack of a thread that calls std::terminate"},
    {"TUTTI_CPU_ISA", false, Effect::kHonoured, "force the CPU kernels' instruction set"},
};

}  // namespace

const std::vector<Known>& registry() { return kRegistry; }

const Known* findKnown(const std::string& name) {
  const Known* best = nullptr;
  size_t bestLen = 0;
  for (const Known& k : kRegistry) {
    const size_t len = std::strlen(k.name);
    if (!k.prefix) {
      if (name == k.name) return &k;
    } else if (name.size() > len && name.compare(0, len, k.name) == 0 && len > bestLen) {
      best = &k;
      bestLen = len;
    }
  }
  return best;
}

std::optional<Setting> lookup(const char* name) {
  if (const char* v = std::getenv(name)) return Setting{v, ""};
  std::lock_guard<std::mutex> lk(state().mu);
  ensureLoaded();
  auto it = state().file.find(name);
  if (it == state().file.end()) return std::nullopt;
  return it->second;
}

std::optional<std::string> get(const char* name) {
  std::optional<Setting> s = lookup(name);
  announce(name, s);
  if (!s) return std::nullopt;
  return s->value;
}

std::optional<int64_t> parseInt(const std::string& raw) {
  std::string s = trim(raw);
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(s.c_str(), &end, 0);
  if (end == s.c_str() || errno == ERANGE) return std::nullopt;
  int64_t mult = 1;
  if (*end) {
    switch (std::toupper(static_cast<unsigned char>(*end))) {
      case 'K':
        mult = 1LL << 10;
        break;
      case 'M':
        mult = 1LL << 20;
        break;
      case 'G':
        mult = 1LL << 30;
        break;
      default:
        return std::nullopt;
    }
    ++end;
    if (*end == 'B' || *end == 'b') ++end;
    if (*end) return std::nullopt;
  }
  const int64_t value = static_cast<int64_t>(v);
  // "9223372036854775807K" does not fit: malformed, not wrapped around.
  if (value > INT64_MAX / mult || value < INT64_MIN / mult) return std::nullopt;
  return value * mult;
}

std::string formatSize(int64_t bytes) {
  if (bytes != 0) {
    if (bytes % (int64_t{1} << 30) == 0) return std::to_string(bytes >> 30) + "G";
    if (bytes % (int64_t{1} << 20) == 0) return std::to_string(bytes >> 20) + "M";
    if (bytes % (int64_t{1} << 10) == 0) return std::to_string(bytes >> 10) + "K";
  }
  return std::to_string(bytes);
}

int64_t getInt(const char* name, int64_t dflt) {
  auto v = get(name);
  if (!v) return dflt;
  auto parsed = parseInt(*v);
  if (!parsed) {
    if (firstTime(&State::warned, name))
      TUTTI_WARN("Invalid value '{}' for {}, using default {}", *v, name, dflt);
    return dflt;
  }
  return *parsed;
}

int64_t getIntAtLeast(const char* name, int64_t dflt, int64_t min) {
  const int64_t v = getInt(name, dflt);
  if (v >= min) return v;
  if (firstTime(&State::warned, std::string(name) + "<min")) {
    const auto set = lookup(name);  // the value as written, "1K"
    TUTTI_WARN("{}={} is below the minimum tutti accepts; using {} ({} bytes)", name,
               set ? set->value : std::to_string(v), formatSize(min), min);
  }
  return min;
}

std::string getStr(const char* name, const std::string& dflt) {
  auto v = get(name);
  return v ? *v : dflt;
}

bool getBool(const char* name, bool dflt) {
  auto v = get(name);
  if (!v) return dflt;
  std::string s = trim(*v);
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off" || s.empty()) return false;
  return getInt(name, dflt ? 1 : 0) != 0;
}

std::vector<std::string> ineffectiveSettings() {
  // Every NCCL_* name set anywhere, with the value that wins.
  std::map<std::string, Setting> set;
  for (char** e = environ; e && *e; ++e) {
    const char* eq = std::strchr(*e, '=');
    if (!eq || std::strncmp(*e, "NCCL_", 5) != 0) continue;
    set.emplace(std::string(*e, static_cast<size_t>(eq - *e)), Setting{eq + 1, ""});
  }
  {
    std::lock_guard<std::mutex> lk(state().mu);
    ensureLoaded();
    for (const auto& [name, s] : state().file)
      if (name.compare(0, 5, "NCCL_") == 0) set.emplace(name, s);  // the environment wins
  }
  std::vector<std::string> out;
  for (const auto& [name, s] : set) {
    const Known* k = findKnown(name);
    if (k && k->effect != Effect::kNoEffect) continue;
    const std::string origin = s.file.empty() ? "" : " (from config file " + s.file + ")";
    out.push_back(
        name + "=" + s.value + origin + " has no effect: " +
        (k ? k->note : "tutti does not know this variable (docs/env.md lists those it reads)"));
  }
  return out;
}

void reportEnvironment() {
  {
    std::lock_guard<std::mutex> lk(state().mu);
    if (state().reported) return;
    state().reported = true;
  }
  // The logger reads these itself (without recording them, to avoid
  // recursion); their "set by" lines are printed here.
  for (const char* n :
       {"TUTTI_CONF_FILE", "NCCL_CONF_FILE", "NCCL_DEBUG", "NCCL_DEBUG_SUBSYS", "NCCL_DEBUG_FILE"})
    (void)get(n);
  std::vector<std::string> unreadable;
  {
    std::lock_guard<std::mutex> lk(state().mu);
    ensureLoaded();
    unreadable = state().unreadable;
  }
  for (const std::string& u : unreadable)
    TUTTI_WARN("config file {} cannot be read; none of its settings apply", u);
  for (const std::string& m : ineffectiveSettings()) TUTTI_WARN("{}", m);
}

void resetForTesting() {
  std::lock_guard<std::mutex> lk(state().mu);
  state().loaded = false;
  state().file.clear();
  state().unreadable.clear();
  state().warned.clear();
  state().read.clear();
  state().reported = false;
}

}  // namespace tutti::params
