#include "core/comm.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <mutex>

#include "algo/balance.h"
#include "algo/cost_model.h"
#include "base/backoff.h"
#include "base/log.h"
#include "base/params.h"
#include "base/thread.h"
#include "core/device_ipc.h"
#include "core/engine.h"
#include "core/link_probe.h"
#include "core/plugins.h"
#include "topology/topology.h"
#include "transports/ncclnet/nccl_net.h"
#include "transports/net_stream.h"
#include "transports/rate_limit.h"

namespace tutti::core {
namespace {

// The node layout the algorithms see: by host id, or TUTTI_TEST_NODES
// ("2,2": ranks 0-1 on one node, 2-3 on another) to exercise two-level
// algorithms inside one host.
Result<algo::NodeMap> nodeMapFor(const std::vector<uint64_t>& hostIds) {
  const std::string spec = params::getStr("TUTTI_TEST_NODES", "");
  if (spec.empty()) return algo::NodeMap::fromHostIds(hostIds);
  std::vector<uint64_t> fake;
  size_t pos = 0;
  while (pos <= spec.size()) {
    size_t comma = std::min(spec.find(',', pos), spec.size());
    const std::string item = spec.substr(pos, comma - pos);
    char* end = nullptr;
    long k = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || k < 1)
      return invalidArgument("TUTTI_TEST_NODES='" + spec +
                             "': expected ranks per node, like 2,2 or 1,2,3");
    const uint64_t node = fake.empty() ? 0 : fake.back() + 1;
    fake.insert(fake.end(), static_cast<size_t>(k), node);
    pos = comma + 1;
  }
  if (fake.size() != hostIds.size())
    return invalidArgument(
        fmt::format("TUTTI_TEST_NODES='{}' covers {} ranks, the communicator has {}", spec,
                    fake.size(), hostIds.size()));
  return algo::NodeMap::fromHostIds(fake);
}

// The NUMA node of the NIC this rank's TCP traffic leaves through
// (Comm::nicNuma): the bootstrap's interface (net::selectInterface's choice:
// NCCL_SOCKET_IFNAME, else the first one up; the data connections use its
// address), found among the topology's PCI devices; -1 when it is not
// (loopback, a virtual interface). Logged at INFO; never an error.
int nicNumaNode(const topo::Topology& t, const std::string& ifName, int rank) {
  const topo::PciDevice* nic = topo::findNetDevice(t, ifName);
  const int node = nic ? topo::numaNodeNear(*nic) : -1;
  if (node < 0)
    TUTTI_INFO(log::kInit,
               "rank {}: interface {} is {} in the topology; the engine thread keeps the "
               "caller's CPU mask",
               rank, ifName, nic ? "near no NUMA node" : "on no PCI device");
  else
    TUTTI_INFO(log::kInit,
               "rank {}: interface {} (NIC {}) is near NUMA node {}; the engine thread runs there",
               rank, ifName, nic->busId, node);
  return node;
}

// The NUMA node nearest to `device` (Comm::deviceNuma), -1 when unknown. The
// reason it is not known is logged at INFO; nothing here fails the init.
int deviceNumaNode(const topo::Topology& t, Backend& backend, int device, int rank) {
  if (backend.hostOnly()) return -1;
  if (!backend.hasPciBusId()) {
    TUTTI_INFO(log::kInit,
               "rank {}: backend {} gives no PCI bus id (no devicePciBusId); the engine thread "
               "keeps the caller's CPU mask",
               rank, backend.name());
    return -1;
  }
  auto busId = backend.pciBusId(device);
  if (!busId || busId.value().empty()) {
    TUTTI_INFO(log::kInit,
               "rank {}: device {} has no known PCI bus id{}{}; the engine thread keeps the "
               "caller's CPU mask",
               rank, device, busId ? "" : ": ", busId ? "" : busId.status().message());
    return -1;
  }
  const topo::PciDevice* pci = topo::findPciDevice(t, busId.value());
  const int node = pci ? topo::numaNodeNear(*pci) : -1;
  if (node < 0) {
    TUTTI_INFO(log::kInit,
               "rank {}: device {} (PCI {}) is {} in the topology; the engine thread keeps the "
               "caller's CPU mask",
               rank, device, busId.value(), pci ? "near no NUMA node" : "not found");
    return -1;
  }
  TUTTI_INFO(log::kInit,
             "rank {}: device {} (PCI {}) is near NUMA node {}; the engine thread runs there", rank,
             device, busId.value(), node);
  return node;
}

// TUTTI_TEST_LINK_MBPS="from:to:MBps,..." (a rank or * for any; later
// entries override earlier ones; a rank the communicator does not have
// matches nothing): the rate of this rank's link to each peer (0: not
// limited).
Result<std::vector<double>> linkRates(const std::string& spec, int rank, int nranks) {
  std::vector<double> out(nranks, 0);
  auto rankOf = [&](const std::string& f, int* r) {
    if (f == "*") return *r = -1, true;
    char* end = nullptr;
    const long v = std::strtol(f.c_str(), &end, 10);
    return !f.empty() && *end == 0 && v >= 0 && v < (1 << 24) && (*r = static_cast<int>(v), true);
  };
  for (size_t at = 0; at <= spec.size();) {
    const size_t comma = std::min(spec.find(',', at), spec.size());
    const std::string e = spec.substr(at, comma - at);
    at = comma + 1;
    const size_t c1 = e.find(':'), c2 = c1 == std::string::npos ? c1 : e.find(':', c1 + 1);
    int from = -1, to = -1;
    char* end = nullptr;
    const double mbps = c2 == std::string::npos ? 0 : std::strtod(e.c_str() + c2 + 1, &end);
    if (c2 == std::string::npos || *end != 0 || !(mbps > 0) || !rankOf(e.substr(0, c1), &from) ||
        !rankOf(e.substr(c1 + 1, c2 - c1 - 1), &to))
      return invalidArgument("TUTTI_TEST_LINK_MBPS='" + spec + "': '" + e +
                             "' is not from:to:MBps (ranks or *, a rate above 0)");
    if (from < 0 || from == rank)
      for (int q = 0; q < nranks; ++q)
        if (to < 0 || to == q) out[q] = mbps;
  }
  return out;
}

}  // namespace

Result<std::unique_ptr<Comm>> Comm::create(const UniqueIdData& id, int rank, int nranks,
                                           const CommConfig& config, Backend* backend, int device,
                                           std::atomic<bool>* abortFlag) {
  std::unique_ptr<Comm> c(new Comm());
  c->abort_ = abortFlag;
  c->rank_ = rank;
  c->nranks_ = nranks;
  c->config_ = config;
  c->backend_ = backend;
  c->device_ = device;
  c->telemetry_ = std::make_unique<Telemetry>(c.get());
  log::setThreadRank(rank);
  // Once per process: NCCL_* settings that do nothing here are named at WARN.
  params::reportEnvironment();

  const int64_t buff = params::getIntAtLeast("NCCL_BUFFSIZE", 4 << 20, 64 << 10);
  c->bufferBytes_ = static_cast<size_t>(buff);
  int64_t chunk = params::getInt("TUTTI_CHUNK_SIZE", 512 << 10);
  chunk = std::clamp<int64_t>(chunk, 4 << 10, buff / 2);
  c->chunkBytes_ = static_cast<size_t>(chunk);
  c->timeoutSec_ = static_cast<double>(params::getInt("TUTTI_TIMEOUT", 300));
  c->rdMaxBytes_ = static_cast<size_t>(
      std::clamp<int64_t>(params::getInt("TUTTI_RD_MAX", 64 << 10), 0, int64_t{1} << 30));

  int64_t nch = params::getInt("TUTTI_NCHANNELS", 2);
  int64_t minCh = params::getInt("NCCL_MIN_NCHANNELS", 1);
  int64_t maxCh = params::getInt("NCCL_MAX_NCHANNELS", 32);
  if (config.minChannels > 0) minCh = std::max<int64_t>(minCh, config.minChannels);
  if (config.maxChannels > 0) maxCh = std::min<int64_t>(maxCh, config.maxChannels);
  nch = std::clamp<int64_t>(nch, std::max<int64_t>(1, minCh), std::max<int64_t>(1, maxCh));
  c->nChannels_ = static_cast<int>(std::clamp<int64_t>(nch, 1, 16));

  std::string throttle = params::getStr("TUTTI_TEST_THROTTLE", "");
  if (!throttle.empty()) {
    auto colon = throttle.find(':');
    if (colon != std::string::npos) {
      c->throttledChannel_ = std::atoi(throttle.substr(0, colon).c_str());
      c->throttleUs_ = std::atoi(throttle.substr(colon + 1).c_str());
    }
  }

  c->replanBytes_ = static_cast<uint64_t>(
      std::max<int64_t>(0, params::getInt("TUTTI_REPLAN_BYTES", int64_t{64} << 20)));
  if (auto rates = params::get("TUTTI_TEST_LINK_MBPS")) {
    TUTTI_ASSIGN_OR_RETURN(c->linkMBps_, linkRates(*rates, rank, nranks));
  }

  c->algoEnv_ = params::getStr("NCCL_ALGO", "");
  c->forcedAlgo_ = algo::parseAlgo(c->algoEnv_);
  // Run-time tuning (core/tuner.h): what the environment sets stays as set.
  const std::string tune = params::getStr("TUTTI_TUNE", "");
  if (!Tuner::parseKnobs(tune, &c->tuneKnobs_)) {
    TUTTI_WARN("TUTTI_TUNE={} is not 0, 1, or a list of algo, channels, chunk; every knob tunes",
               tune);
    c->tuneKnobs_ = Tuner::kAll;
  }
  if (c->forcedAlgo_ != algo::CollArgs::Algo::kAuto) c->tuneKnobs_ &= ~Tuner::kAlgo;
  if (params::get("TUTTI_NCHANNELS") || params::get("NCCL_MIN_NCHANNELS") ||
      params::get("NCCL_MAX_NCHANNELS") || config.minChannels > 0 || config.maxChannels > 0)
    c->tuneKnobs_ &= ~Tuner::kChannels;
  if (params::get("TUTTI_CHUNK_SIZE")) c->tuneKnobs_ &= ~Tuner::kChunk;
  c->tuneMinBytes_ = static_cast<uint64_t>(
      std::max<int64_t>(0, params::getInt("TUTTI_TUNE_MIN_BYTES", int64_t{1} << 20)));
  TUTTI_RETURN_IF_ERROR(c->readCompressionEnv());
  if (rank == 0) {
    // NCCL_PROTO has no effect: params::reportEnvironment() names it at WARN.
    if (auto algo = params::get("NCCL_ALGO"))
      TUTTI_INFO(log::kEnv,
                 "NCCL_ALGO={}: all-reduce honours ring, tree (recursive doubling), 2dring and "
                 "hierarchical, all-gather and reduce-scatter ring and hierarchical; other "
                 "collectives have one algorithm each (chain or direct)",
                 *algo);
  }
  // A bad TUTTI_TEST_NODES fails on every rank before anyone waits for it.
  if (params::get("TUTTI_TEST_NODES"))
    TUTTI_RETURN_IF_ERROR(nodeMapFor(std::vector<uint64_t>(nranks, 0)).status());
  TUTTI_ASSIGN_OR_RETURN(c->bootstrap_, Bootstrap::init(id, rank, nranks, c->abort_));
  c->shm_ = transport::makeShmTransport();
  c->tcp_ = transport::makeTcpTransport();
  TUTTI_RETURN_IF_ERROR(c->chooseNetwork());
  c->channels_.resize(nranks);
  for (auto& v : c->channels_) v.resize(c->nChannels_);
  c->sendSeq_.assign(nranks, 0);
  c->recvSeq_.assign(nranks, 0);

  int local = 0;
  std::vector<uint64_t> hosts;
  for (int r = 0; r < nranks; ++r) {
    hosts.push_back(c->peer(r).hostId);
    // CPUs are shared by the ranks of one machine, whatever node identity
    // TUTTI_HOST_ID gives them (emulated nodes share this machine's CPUs).
    local += strncmp(c->peer(r).hostname, c->peer(rank).hostname, sizeof(PeerInfo::hostname)) == 0;
  }
  TUTTI_ASSIGN_OR_RETURN(c->nodeMap_, nodeMapFor(hosts));
  // Ring neighbours as the rings run (a node's ranks adjacent).
  const std::vector<int> ring = c->nodeMap_.ringOrder();
  const int pos = static_cast<int>(std::find(ring.begin(), ring.end(), rank) - ring.begin());
  const int next = ring[(pos + 1) % nranks], prev = ring[(pos + nranks - 1) % nranks];
  // Read once: the home node (before connecting: the rings are placed as
  // they are made) and the cost model's recorded link figures.
  TUTTI_ASSIGN_OR_RETURN(topo::Topology topology, topo::forThisProcess());
  c->homeNuma_ = topo::homeNumaNode(topology);
  if (c->homeNuma_ >= 0)
    TUTTI_INFO(log::kInit | log::kAlloc,
               "rank {}: runs on NUMA node {}; shared-memory rings it reads and its one-shot "
               "slots are placed there",
               rank, c->homeNuma_);
  c->deviceNuma_ = deviceNumaNode(topology, *backend, device, rank);
  c->topology_ = std::make_shared<const topo::Topology>(topology);
  c->oversubscribed_ = local > base::usableCpus();
  // The node arena before the first connection: shared-memory connections
  // ring their peer's doorbell in it.
  TUTTI_ASSIGN_OR_RETURN(c->oneShot_, OneShot::create(c.get()));
  if (nranks > 1) TUTTI_RETURN_IF_ERROR(c->ensureConnected({next, prev}));
  const int nodes = c->nodeMap_.nNodes();
  // After the ring connections: across nodes the selection measures the
  // ring's inter-node links over them.
  TUTTI_RETURN_IF_ERROR(c->agreeOnSelection(topology));
  // Host memory over TCP: the engine runs near the NIC the traffic takes.
  if (backend->hostOnly() && nranks > 1 && !c->sharedMemory_)
    c->nicNuma_ = nicNumaNode(topology, c->bootstrap_->interfaceName(), rank);
  if (nranks >= 2 && c->allOnOneHost()) {
    auto ipc = DeviceIpc::negotiate(c.get(), backend, device);
    if (!ipc) return ipc.status().withContext("device IPC set-up");
    c->ipc_ = std::move(ipc.value());
  }
  TUTTI_INFO(log::kInit,
             "comm {:#x} rank {} nranks {} nodes {} channels {} chunk {} buffsize {} ring next {} "
             "via {} - Init COMPLETE",
             c->commHash(), rank, nranks, nodes, c->nChannels_, c->chunkBytes_, c->bufferBytes_,
             next, nranks > 1 ? c->transportName(next) : "self");
  return c;
}

// What every rank must agree on to pick the same algorithm for the same call:
// rank 0's cost model, TUTTI_RD_MAX, NCCL_ALGO, TUTTI_COMPRESSION and
// TUTTI_BALANCE, and the balanced ring's plan. Each link figure comes from
// the topology (figures recorded in a TUTTI_TOPO_FILE), else, for the
// inter-node links of a communicator spanning nodes, from the link probe run
// here (unless TUTTI_LINK_PROBE=0: the upper median of the ring's
// inter-node links), else from the defaults.
Status Comm::agreeOnSelection(const topo::Topology& t) {
  struct Choice {
    double intraLatencyUs, intraBandwidthGBs, interLatencyUs, interBandwidthGBs;
    uint64_t rdMaxBytes;
    int32_t forcedAlgo;
    int32_t compression;  // TUTTI_COMPRESSION: 0 off, 1 fp16, 2 bf16
    uint64_t compressionMinBytes;
    int32_t sharedMemory;  // every peer through shared memory (as this rank connects)
    int32_t interKnown;    // the inter-node bandwidth was measured or given, not a default
    int32_t balance;       // TUTTI_BALANCE
    int32_t tuneKnobs;     // TUTTI_TUNE, less what the environment fixes
    uint64_t replanBytes;  // TUTTI_REPLAN_BYTES
    uint64_t tuneMinBytes;  // TUTTI_TUNE_MIN_BYTES
  };
  static_assert(std::is_trivially_copyable_v<Choice>, "Choice crosses processes");
  algo::CostModel mine;
  mine.intra.latencyUs = t.intraLatencyUs.value_or(mine.intra.latencyUs);
  mine.intra.bandwidthGBs = t.intraBandwidthGBs.value_or(mine.intra.bandwidthGBs);
  mine.inter.latencyUs = t.interLatencyUs.value_or(mine.inter.latencyUs);
  mine.inter.bandwidthGBs = t.interBandwidthGBs.value_or(mine.inter.bandwidthGBs);
  // Measured figures fill what the topology leaves out (every rank has them
  // all; only rank 0's choice counts).
  std::vector<LinkFigures> links;
  TUTTI_RETURN_IF_ERROR(probeRingLinks(!(t.interLatencyUs && t.interBandwidthGBs), &links));
  std::vector<double> lat, bw;
  for (const LinkFigures& l : links)
    if (l.bandwidthGBs > 0) lat.push_back(l.latencyUs), bw.push_back(l.bandwidthGBs);
  // The upper median: what most links do (with two slow links of four, the
  // fast ones' figure; the balanced ring plans around the slow ones).
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const bool measured = !bw.empty();
  if (measured) {
    if (!t.interLatencyUs) mine.inter.latencyUs = median(lat);
    if (!t.interBandwidthGBs) mine.inter.bandwidthGBs = median(bw);
  }
  std::vector<Choice> all(nranks_);
  const int32_t compression = compressionEnv_.empty() ? 0 : compressionEnv_ == "fp16" ? 1 : 2;
  const bool shm = allOnOneHost() && !params::getBool("NCCL_SHM_DISABLE", false);
  all[rank_] = {mine.intra.latencyUs,
                mine.intra.bandwidthGBs,
                mine.inter.latencyUs,
                mine.inter.bandwidthGBs,
                rdMaxBytes_,
                static_cast<int32_t>(forcedAlgo_),
                compression,
                compressionMinBytes_,
                static_cast<int32_t>(shm),
                static_cast<int32_t>(t.interBandwidthGBs.has_value() || measured),
                static_cast<int32_t>(params::getBool("TUTTI_BALANCE", true)),
                static_cast<int32_t>(tuneKnobs_),
                replanBytes_,
                tuneMinBytes_};
  TUTTI_RETURN_IF_ERROR(bootstrap_->allGather(all.data(), sizeof(Choice)));
  const Choice& c = all[0];
  costModel_.intra = {c.intraLatencyUs, c.intraBandwidthGBs};
  costModel_.inter = {c.interLatencyUs, c.interBandwidthGBs};
  knownInterMBps_ = c.interKnown ? c.interBandwidthGBs * 1000 : 0;
  if (c.rdMaxBytes != rdMaxBytes_ || c.forcedAlgo != static_cast<int32_t>(forcedAlgo_) ||
      c.balance != all[rank_].balance || c.replanBytes != replanBytes_ ||
      c.tuneKnobs != all[rank_].tuneKnobs || c.tuneMinBytes != tuneMinBytes_)
    TUTTI_WARN(
        "TUTTI_RD_MAX, NCCL_ALGO, TUTTI_BALANCE, TUTTI_REPLAN_BYTES, TUTTI_TUNE (or what fixes its "
        "knobs) or TUTTI_TUNE_MIN_BYTES differ from rank 0's; rank 0's settings apply so that "
        "every rank picks the same algorithm");
  replanBytes_ = c.replanBytes;
  rdMaxBytes_ = c.rdMaxBytes;
  forcedAlgo_ = static_cast<algo::CollArgs::Algo>(c.forcedAlgo);
  tuneKnobs_ = static_cast<unsigned>(c.tuneKnobs);
  tuneMinBytes_ = c.tuneMinBytes;
  Tuner::Options tune;
  tune.knobs = tuneKnobs_;
  tune.minBytes = tuneMinBytes_;
  tune.nranks = nranks_;
  tune.channels = nChannels_;
  tune.chunkBytes = chunkBytes_;
  tune.maxChunkBytes = bufferBytes_ / 2;
  tuner_ = Tuner(tune);
  if (rank_ == 0 && nranks_ > 1)
    TUTTI_INFO(log::kTuning,
               "tuning: all-reduce, all-gather and reduce-scatter of {} bytes and more tune at run "
               "time: {} (TUTTI_TUNE; NCCL_ALGO, TUTTI_NCHANNELS, NCCL_MIN/MAX_NCHANNELS and "
               "TUTTI_CHUNK_SIZE fix theirs)",
               tuneMinBytes_, Tuner::knobNames(tuneKnobs_));
  // Feeds the algorithm choice, which every rank must make alike.
  sharedMemory_ = c.sharedMemory != 0;
  // Compressed and plain messages do not mix: rank 0's TUTTI_COMPRESSION holds.
  if (c.compression != compression || c.compressionMinBytes != compressionMinBytes_)
    TUTTI_WARN(
        "TUTTI_COMPRESSION or TUTTI_COMPRESSION_MIN_BYTES differ from rank 0's; rank 0's "
        "settings apply");
  compressionEnv_ = c.compression == 0 ? "" : c.compression == 1 ? "fp16" : "bf16";
  compressionMinBytes_ = c.compressionMinBytes;
  if (rank_ == 0) {
    // Where each figure of a link class came from.
    auto from = [](bool topo, bool measured) {
      return topo ? "the topology file" : measured ? "measured at init" : "defaults";
    };
    auto sources = [&](bool latTopo, bool bwTopo, bool measured) {
      if (latTopo == bwTopo) return std::string(from(latTopo, measured));
      return fmt::format("latency {}, bandwidth {}", from(latTopo, measured),
                         from(bwTopo, measured));
    };
    TUTTI_INFO(log::kTuning,
               "cost model: intra-node {:.4g} us {:.4g} GB/s ({}), inter-node {:.4g} us {:.4g} "
               "GB/s ({})",
               costModel_.intra.latencyUs, costModel_.intra.bandwidthGBs,
               sources(t.intraLatencyUs.has_value(), t.intraBandwidthGBs.has_value(), false),
               costModel_.inter.latencyUs, costModel_.inter.bandwidthGBs,
               sources(t.interLatencyUs.has_value(), t.interBandwidthGBs.has_value(), measured));
  }
  planBalance(links, c.balance != 0);
  return Status::ok();
}

// Every ring link between two nodes is measured from its sending rank (the
// last rank of a node) to its receiving one (the first of the next node),
// over the ring connection made at init (channel 0). Link k (k-th node
// boundary along the ring) runs in round k % 2, the last one of an odd count
// in round 2: the links of a round share no node, so each is measured alone
// on its nodes' network links. Whether to measure is the sending rank's
// decision (its TUTTI_LINK_PROBE and topology): when it does not, it sends
// only the probe's stop command, so the two never disagree about what
// crosses the connection.
Status Comm::probeRingLinks(bool needed, std::vector<LinkFigures>* out) {
  out->assign(nranks_, LinkFigures{0, 0});
  if (nodeMap_.nNodes() < 2) return Status::ok();
  const std::vector<int> ring = nodeMap_.ringOrder();
  const int boundaries = nodeMap_.nNodes();
  const int pos = static_cast<int>(std::find(ring.begin(), ring.end(), rank_) - ring.begin());
  const int next = ring[(pos + 1) % nranks_], prev = ring[(pos + nranks_ - 1) % nranks_];
  // This rank's part: the link it sends on (round, peer) and the one it answers.
  int sendRound = -1, serveRound = -1, k = 0;
  for (int p = 0; p < nranks_; ++p) {
    const int from = ring[p], to = ring[(p + 1) % nranks_];
    if (nodeMap_.nodeOf[from] == nodeMap_.nodeOf[to]) continue;
    const int round = boundaries % 2 && k == boundaries - 1 ? 2 : k % 2;
    if (from == rank_) sendRound = round;
    if (to == rank_) serveRound = round;
    ++k;
  }
  const bool enabled = params::getBool("TUTTI_LINK_PROBE", true);
  if (rank_ == 0 && (!enabled || !needed))
    TUTTI_INFO(log::kTuning, "link probe: off ({})",
               enabled ? "the topology file gives both inter-node figures" : "TUTTI_LINK_PROBE=0");
  for (int round = 0; round < 3; ++round) {
    if (round != sendRound && round != serveRound) continue;
    const bool sending = round == sendRound;
    const int peer = sending ? next : prev;
    transport::Connection* conn = channels_[peer][0].conn.get();
    if (!conn)
      return internalError(fmt::format("link probe: no connection to {}", describePeer(peer)));
    LinkProbeOptions opt;
    opt.deadline = bootstrap_->deadline();
    opt.abortFlag = abort_;
    opt.oversubscribed = oversubscribed_;
    if (sameHost(peer) && transportFor(peer) == shm_.get()) {
      // Pretend nodes (TUTTI_TEST_NODES) over shared memory: no rate limiter
      // or slow start to wait out, and a fresh ring costs page faults per
      // byte, so fewer bytes do (the figures mean little there anyway).
      opt.warmupBytes = 256 << 10;
      opt.bulkBytes = 512 << 10;
    }
    auto context = [&] {
      return fmt::format("measuring the link {} {} over {} at init", sending ? "to" : "from",
                         describePeer(peer), transportName(peer));
    };
    if (!sending) {
      TUTTI_RETURN_IF_ERROR(serveLinkProbe(*conn, opt).withContext(context()));
      continue;
    }
    if (!enabled || !needed) {
      TUTTI_RETURN_IF_ERROR(skipLinkProbe(*conn, opt).withContext(context()));
      continue;
    }
    auto r = probeLink(*conn, opt);
    if (!r) return r.status().withContext(context());
    TUTTI_INFO(log::kTuning,
               "link probe: rank {} (node {}) -> rank {} (node {}) over {}: latency {:.3g} us "
               "(median of {} round trips / 2), bandwidth {:.4g} GB/s (best of {} x {} KiB after "
               "{} KiB), {:.1f} ms",
               rank_, nodeMap_.nodeOf[rank_], peer, nodeMap_.nodeOf[peer], transportName(peer),
               r->latencyUs, r->pings, r->bandwidthGBs, r->transfers, opt.bulkBytes >> 10,
               opt.warmupBytes >> 10, r->elapsedMs);
    (*out)[rank_] = {r->latencyUs, r->bandwidthGBs};
  }
  return bootstrap_->allGather(out->data(), sizeof(LinkFigures));
}

// The balanced plans (algo/balance.h) over the rates of the ring's links:
// the measured ones between nodes, the cost model's intra-node figure inside
// one. Every rank computes them from the same gathered figures; the
// operation's fingerprint carries the weights, so ranks that planned
// differently fail their first balanced call instead of mixing segments.
void Comm::planBalance(const std::vector<LinkFigures>& links, bool enabled) {
  balance_ = algo::Balance();
  nodeRateGBs_.clear();
  if (nodeMap_.nNodes() < 2) return;
  const std::vector<int> ring = nodeMap_.ringOrder();
  std::vector<double> nodeRate(nodeMap_.nNodes(), 0);
  std::string rates;
  for (int p = 0; p < nranks_; ++p) {
    const int from = ring[p], to = ring[(p + 1) % nranks_];
    if (nodeMap_.nodeOf[from] == nodeMap_.nodeOf[to]) continue;
    if (!(links[from].bandwidthGBs > 0)) {
      if (rank_ == 0 && enabled)
        TUTTI_INFO(log::kTuning, "balance: off (the link from rank {} to rank {} was not measured)",
                   from, to);
      return;
    }
    nodeRate[nodeMap_.nodeOf[from]] = links[from].bandwidthGBs;
    rates += fmt::format("{}{}->{} {:.4g}", rates.empty() ? "" : ", ", from, to,
                         links[from].bandwidthGBs);
  }
  algo::Balance plan = algo::planBalance(
      nodeMap_, algo::ringRates(nodeMap_, nodeRate, costModel_.intra.bandwidthGBs));
  if (rank_ == 0) {
    const std::string detail =
        fmt::format("{}; inter-node links GB/s: {}", algo::describeBalance(nodeMap_, plan), rates);
    if (!enabled)
      TUTTI_INFO(log::kTuning, "balance: off (TUTTI_BALANCE=0); would be {}", detail);
    else
      TUTTI_INFO(log::kTuning, "balance: all-reduces of {} KiB or more: {}",
                 algo::kBalanceMinBytes >> 10, detail);
  }
  if (!enabled) return;
  balance_ = std::move(plan);
  if (replanBytes_ == 0) return;
  balance_.live = true;
  ceilingGBs_ = *std::max_element(nodeRate.begin(), nodeRate.end());
  nodeRateGBs_ = std::move(nodeRate);
  // What the telemetry sums for the re-plan: the links to the next node.
  const int mine = nodeMap_.nodeOf[rank_], next = (mine + 1) % nodeMap_.nNodes();
  std::vector<uint8_t> where(nranks_, Telemetry::kOtherNode);
  for (int q = 0; q < nranks_; ++q)
    if (nodeMap_.nodeOf[q] == mine)
      where[q] = Telemetry::kThisNode;
    else if (nodeMap_.nodeOf[q] == next)
      where[q] = Telemetry::kNextNode;
  telemetry_->watchNextNode(std::move(where));
}

bool Comm::replanDue(uint64_t bytes) {
  if (nodeRateGBs_.empty()) return false;
  sinceReplan_ += bytes;
  if (sinceReplan_ < replanBytes_) return false;
  sinceReplan_ = 0;
  return true;
}

bool Comm::replanBalance(const std::vector<algo::LinkLoad>& all, uint64_t call, bool* sharesMoved) {
  const int nodes = nodeMap_.nNodes();
  std::vector<double> rate = nodeRateGBs_;
  std::string what;  // per node, what moved its rate
  bool mineJudged = false;
  for (int k = 0; k < nodes; ++k) {
    algo::LinkLoad node;
    for (int r : nodeMap_.nodes[k]) {
      node.bytes += all[r].bytes;
      node.busyUs = std::max(node.busyUs, all[r].busyUs);
      node.opUs = std::max(node.opUs, all[r].opUs);
    }
    bool judged = false;
    const auto u = algo::updateRate(&rate[k], node, ceilingGBs_, &judged);
    if (judged && k == nodeMap_.nodeOf[rank_]) mineJudged = true;
    if (u != algo::RateUpdate::kMeasured && u != algo::RateUpdate::kRaised) continue;
    what += fmt::format("{}node {} -> {}: {:.4g} GB/s ({} {:.4g} GB/s, busy {:.0f}%)",
                        what.empty() ? "" : ", ", k, (k + 1) % nodes, rate[k],
                        u == algo::RateUpdate::kMeasured ? "was" : "at least, was", nodeRateGBs_[k],
                        std::min(100.0, 100.0 * static_cast<double>(node.busyUs) /
                                            static_cast<double>(std::max<uint64_t>(node.opUs, 1))));
  }
  if (mineJudged) telemetry_->clearNextNodeLoad();
  nodeRateGBs_ = std::move(rate);
  bool changed = false;
  algo::Balance next = algo::replan(
      nodeMap_, balance_, algo::ringRates(nodeMap_, nodeRateGBs_, costModel_.intra.bandwidthGBs),
      &changed);
  // A kept plan's gain moves with the rates, and the algorithm chosen with it.
  const bool moved = changed || next.ring.timeEqual != balance_.ring.timeEqual ||
                     next.ring.timeBalanced != balance_.ring.timeBalanced ||
                     next.net.timeEqual != balance_.net.timeEqual ||
                     next.net.timeBalanced != balance_.net.timeBalanced;
  balance_ = std::move(next);
  if (sharesMoved) *sharesMoved = changed;
  if (rank_ == 0 && changed)
    TUTTI_INFO(log::kTuning, "balance: re-planned after call {}: {}; {}", call,
               what.empty() ? std::string("rates unchanged") : what,
               algo::describeBalance(nodeMap_, balance_));
  else if (rank_ == 0 && !what.empty())
    TUTTI_TRACE(log::kTuning, "balance: after call {}: {}; plans kept", call, what);
  return moved;
}

bool Comm::setTestLinkRate(int peer, double mbps) {
  if (peer < 0 || peer >= nranks_ || static_cast<size_t>(peer) >= testLinks_.size() ||
      !testLinks_[peer] || !(mbps > 0))
    return false;
  testLinks_[peer]->setRate(mbps);
  return true;
}

Comm::~Comm() {
  abort_->store(true);
  engineSeen_.store(nullptr);
  if (engine_) engine_->interrupt();  // a wait for a stream ends now
  engine_.reset();                    // first: its jobs use everything below (they fail fast now)
  ipc_.reset();  // first: it waits through its own arena for peers still reading its buffers
  if (backend_) freePinned(backend_, &pinned_);
  oneShot_.reset();  // peers waiting on this rank there see it closed
  channels_.clear();
  bootstrap_.reset();
}

Engine& Comm::engine() {
  std::lock_guard<std::mutex> lk(engineMu_);
  if (!engine_) {
    engine_ = std::make_unique<Engine>(this);
    engineSeen_.store(engine_.get(), std::memory_order_release);
  }
  return *engine_;
}

void Comm::drainEngine() {
  // A communicator that never queued anything pays one load here.
  if (Engine* e = engineSeen_.load(std::memory_order_acquire)) e->drain();
}

int Comm::createPreMulSum(const void* scalar, int dt, int residence) {
  UserRedOp u;
  u.live = true;
  u.dt = dt;
  u.residence = residence;
  u.ptr = scalar;
  if (residence == ncclScalarHostImmediate) {
    u.value = kernels().scalarValue(scalar, dt);
    memcpy(&u.raw, scalar, dataTypeSize(static_cast<DataType>(dt)));
  }
  drainEngine();
  size_t idx = 0;
  while (idx < userOps_.size() && userOps_[idx].live) ++idx;
  if (idx == userOps_.size())
    userOps_.push_back(u);
  else
    userOps_[idx] = u;
  return ncclNumOps + static_cast<int>(idx);
}

Status Comm::checkRedOp(int op, int dt) const {
  if (op >= 0 && op < ncclNumOps) return Status::ok();
  const size_t idx = static_cast<size_t>(op) - ncclNumOps;
  if (op < 0 || idx >= userOps_.size() || !userOps_[idx].live)
    return invalidArgument(fmt::format(
        "invalid reduction op {} (not built-in and not created on this communicator)", op));
  if (userOps_[idx].dt != dt)
    return invalidArgument(
        fmt::format("reduction op {} was created for datatype {} but the call uses {}", op,
                    dataTypeName(static_cast<DataType>(userOps_[idx].dt)),
                    dataTypeName(static_cast<DataType>(dt))));
  return Status::ok();
}

bool Comm::destroyUserOp(int op) {
  const size_t idx = static_cast<size_t>(op) - ncclNumOps;
  if (op < ncclNumOps || idx >= userOps_.size() || !userOps_[idx].live) return false;
  drainEngine();
  userOps_[idx].live = false;
  return true;
}

bool Comm::engineBusy() const {
  const Engine* e = engineSeen_.load(std::memory_order_acquire);
  return e && !e->idle();
}

Status Comm::usable() const {
  if (asyncErrorCode() != 0) return error().withContext("communicator is in error state after");
  if (aborted()) return invalidUsage("communicator was aborted");
  if (revoked()) return revokedError();
  return Status::ok();
}

Status Comm::revokedError() {
  return invalidUsage(
      "communicator was revoked (ncclCommRevoke): only ncclCommDestroy, ncclCommAbort, "
      "ncclCommSplit and ncclCommShrink may follow");
}

Status Comm::revoke(int flags) {
  if (flags != NCCL_REVOKE_DEFAULT)
    return invalidArgument(
        fmt::format("invalid revokeFlags {} (must be NCCL_REVOKE_DEFAULT, 0)", flags));
  if (revoked_.exchange(true)) return Status::ok();  // revoked before
  // An operation running on another thread sees the flag at its next step;
  // one asleep on this rank's doorbell is woken.
  if (Engine* e = engineSeen_.load(std::memory_order_acquire)) e->interrupt();
  if (oneShot_) {
    oneShot_->markFailed();  // local peers waiting on this rank look for the notice
    oneShot_->wake();
  }
  noticeFailure(
      invalidUsage(fmt::format("rank {} revoked the communicator (ncclCommRevoke)", rank_)));
  drainEngine();
  return Status::ok();
}

Result<Comm::SplitPlan> Comm::split(int color, int key) {
  // In call order with the operations still queued on the engine: one that a
  // peer has started would otherwise wait for this rank's, held behind the
  // split, while the peer's split waits for this one.
  drainEngine();
  return splitExchange(color, key);
}

Result<Comm::SplitPlan> Comm::shrink(const int* exclude, int count, int flags) {
  if (flags != NCCL_SHRINK_DEFAULT && flags != NCCL_SHRINK_ABORT)
    return invalidArgument(fmt::format("invalid shrinkFlags {}", flags));
  if (count < 0 || (count > 0 && !exclude))
    return invalidArgument(fmt::format("excludeRanksList is {} with excludeRanksCount {}",
                                       exclude ? "set" : "NULL", count));
  std::vector<uint8_t> out(nranks_, 0);
  for (int i = 0; i < count; ++i) {
    const int r = exclude[i];
    if (r < 0 || r >= nranks_)
      return invalidArgument(
          fmt::format("excludeRanksList[{}] is {}: not a rank of {}", i, r, nranks_));
    if (out[r]) return invalidArgument(fmt::format("rank {} is excluded twice", r));
    if (r == rank_)
      return invalidArgument(fmt::format(
          "rank {} excludes itself: an excluded rank does not call ncclCommShrink", r));
    out[r] = 1;
  }
  if (flags == NCCL_SHRINK_ABORT && error().isOk())
    setError(invalidUsage("its operations were ended by ncclCommShrink (NCCL_SHRINK_ABORT)"));
  drainEngine();
  std::lock_guard<std::mutex> lk(mu_);
  std::vector<int> kept;
  for (int r = 0; r < nranks_; ++r)
    if (!out[r]) kept.push_back(r);
  SplitPlan plan;
  plan.nranks = static_cast<int>(kept.size());
  plan.rank = static_cast<int>(std::find(kept.begin(), kept.end(), rank_) - kept.begin());
  // Splits and shrinks share the count: every survivor made the same ones.
  const uint64_t tag = kShrinkTagBase | (splitSeq_++ << 20);
  if (plan.rank == 0) {
    TUTTI_RETURN_IF_ERROR(createFreshId(plan.id));
    for (size_t i = 1; i < kept.size(); ++i)
      TUTTI_RETURN_IF_ERROR(bootstrap_->send(kept[i], tag, plan.id, sizeof(plan.id)));
  } else {
    auto got = recvWhileAlive(kept[0], tag);
    if (!got) return got.status().withContext("waiting for the shrunk communicator's id");
    if (got->size() != sizeof(plan.id))
      return internalError(fmt::format("the new communicator's id from {} has {} bytes",
                                       describePeer(kept[0]), got->size()));
    std::memcpy(plan.id, got->data(), sizeof(plan.id));
  }
  expectMembers(plan.id, localMembers(kept));
  return plan;
}

void Comm::splitQueued(int color, int key, std::function<void(Result<SplitPlan>)> then) {
  // Hands `then` its answer exactly once: from the job, or, when the engine
  // drops the job without running it, from the destructor of the job's state.
  struct Once {
    Comm* comm = nullptr;
    std::function<void(Result<SplitPlan>)> then;
    void answer(Result<SplitPlan> r) {
      auto f = std::move(then);
      then = nullptr;
      if (f) f(std::move(r));
    }
    ~Once() {
      if (!then) return;
      const Status why = comm->error();
      answer(why.isOk() ? invalidUsage("the parent communicator was aborted before the split ran")
                        : why.withContext("the parent communicator failed before the split ran"));
    }
  };
  auto once = std::make_shared<Once>();
  once->comm = this;
  once->then = std::move(then);
  Status queued = engine().submit(
      {},
      [this, color, key, once](Queue) {
        once->answer(splitExchange(color, key));
        return Status::ok();  // an exchange that failed fails the child, not this communicator
      },
      false);
  // `once` is still held here: answer with why
  if (!queued) once->answer(queued.withContext("queueing ncclCommSplit's exchange"));
}

Result<Comm::SplitPlan> Comm::splitExchange(int color, int key) {
  std::lock_guard<std::mutex> lk(mu_);
  struct Entry {
    int32_t color, key, rank, pad;
  };
  std::vector<Entry> all(nranks_);
  all[rank_] = {color, key, rank_, 0};
  TUTTI_RETURN_IF_ERROR(bootstrap_->allGather(all.data(), sizeof(Entry)));
  const uint64_t seq = splitSeq_++;
  SplitPlan plan;
  if (color < 0) return plan;
  std::vector<Entry> mine;
  for (const Entry& e : all)
    if (e.color == color) mine.push_back(e);
  std::stable_sort(mine.begin(), mine.end(), [](const Entry& a, const Entry& b) {
    return a.key != b.key ? a.key < b.key : a.rank < b.rank;
  });
  for (size_t i = 0; i < mine.size(); ++i)
    if (mine[i].rank == rank_) plan.rank = static_cast<int>(i);
  plan.nranks = static_cast<int>(mine.size());
  const uint64_t tag = kSplitTagBase | (seq << 20);
  if (plan.rank == 0) {
    TUTTI_RETURN_IF_ERROR(createFreshId(plan.id));
    for (size_t i = 1; i < mine.size(); ++i)
      TUTTI_RETURN_IF_ERROR(bootstrap_->send(mine[i].rank, tag, plan.id, sizeof(plan.id)));
  } else {
    auto got = recvWhileAlive(mine[0].rank, tag);
    if (!got) return got.status().withContext("waiting for the split communicator's id");
    if (got->size() != sizeof(plan.id))
      return internalError(fmt::format("the new communicator's id from {} has {} bytes",
                                       describePeer(mine[0].rank), got->size()));
    std::memcpy(plan.id, got->data(), sizeof(plan.id));
  }
  std::vector<int> members;
  for (const Entry& e : mine) members.push_back(e.rank);
  expectMembers(plan.id, localMembers(members));
  return plan;
}

std::vector<JoinMember> Comm::localMembers(const std::vector<int>& ranks) const {
  std::vector<JoinMember> out;
  for (int r : ranks)
    if (r != rank_ && sameHost(r)) out.push_back({r, peer(r).pid});
  return out;
}

Result<std::vector<uint8_t>> Comm::recvWhileAlive(int from, uint64_t tag) {
  constexpr auto kSlice = std::chrono::milliseconds(100);
  const auto dl = bootstrap_->deadline();
  for (;;) {
    const auto until = std::min(dl, std::chrono::steady_clock::now() + kSlice);
    auto got = bootstrap_->recvUntil(from, tag, until, abort_);
    if (got) return got;
    // Failed before its slice ended (an abort, the service's end), or out of time.
    if (std::chrono::steady_clock::now() < until || until >= dl) return got.status();
    if (sameHost(from) && base::processDead(static_cast<pid_t>(peer(from).pid)))
      return remoteError(
          fmt::format("{} is gone: its process no longer exists", describePeer(from)));
  }
}

void* Comm::registerRange(void* base, size_t bytes) {
  auto r = std::make_unique<Registration>(Registration{base, bytes});
  void* handle = r.get();
  registrations_.emplace(handle, std::move(r));
  return handle;
}

bool Comm::deregister(void* handle) { return registrations_.erase(handle) != 0; }

std::string Comm::describePeer(int r) const {
  const PeerInfo& p = peer(r);
  return fmt::format("rank {} (host {}, pid {})", r, p.hostname, p.pid);
}

const char* Comm::transportName(int peer) const {
  if (peer == rank_) return "self";
  const auto& ch = channels_[peer];
  if (!ch.empty() && ch[0].conn) return ch[0].conn->name();
  return transportFor(peer)->name();
}

transport::Transport* Comm::transportFor(int peer) const {
  bool shm = sameHost(peer) && !params::getBool("NCCL_SHM_DISABLE", false);
  if (shm) return shm_.get();
  return net_ ? net_.get() : tcp_.get();
}

namespace {
std::string lower(std::string s) {
  for (char& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return s;
}
}  // namespace

Status Comm::chooseNetwork() {
  const std::string tuttiNet = lower(params::getStr("TUTTI_NET", ""));
  const std::string ncclNet = params::getStr("NCCL_NET", "");
  if (!tuttiNet.empty() && tuttiNet != "tcp" && tuttiNet != "ucx" && tuttiNet != "ofi" &&
      tuttiNet != "ibverbs")
    return invalidArgument(
        fmt::format("TUTTI_NET={}: expected one of ucx, ofi, ibverbs, tcp", tuttiNet));
  bool network = false;  // some peer is not reached through shared memory
  for (int r = 0; r < nranks_ && !network; ++r)
    network = r != rank_ && transportFor(r) != shm_.get();
  if (tuttiNet == "tcp" || !network) return Status::ok();
  if (!tuttiNet.empty()) {
    // tutti's own network transports: plugins with the NCCL net ABI in the
    // plugin folders (lib/tutti/libtutti-net-<name>.so).
    auto path = findPlugin("net", tuttiNet);
    if (!path)
      return invalidArgument(fmt::format(
          "TUTTI_NET={}: this installation of tutti has no {} transport ({}); use TUTTI_NET=tcp, "
          "or an NCCL net plugin (NCCL_NET_PLUGIN)",
          tuttiNet, tuttiNet, path.status().message()));
    // The interfaces tutti's TCP would use: NCCL_SOCKET_IFNAME, else
    // loopback when every rank is on this host, else the bootstrap's.
    transport::ncclnet::PluginOptions options;
    options.ifname = params::getStr("NCCL_SOCKET_IFNAME", "");
    if (options.ifname.empty())
      options.ifname = allOnOneHost() ? "=lo" : "=" + bootstrap_->interfaceName();
    auto plugin = transport::ncclnet::loadPlugin(*path, options);
    if (!plugin) return plugin.status().withContext("TUTTI_NET=" + tuttiNet);
    net_ = transport::makeStreamTransport(*plugin);
    return Status::ok();
  }
  if (lower(ncclNet) == "socket") return Status::ok();  // NCCL's name for its TCP network
  if (lower(ncclNet) == "ib") {
    // Set by habit on InfiniBand clusters: a program keeps running, over TCP.
    static std::once_flag once;
    std::call_once(once, [&] {
      TUTTI_WARN(
          "NCCL_NET={} has no effect: this build of tutti has no InfiniBand transport; ranks "
          "that shared memory does not carry use TCP",
          ncclNet);
    });
    return Status::ok();
  }
  const std::string setting = transport::ncclnet::pluginSetting();
  auto plugin = transport::ncclnet::loadPlugin(setting);
  if (!plugin) {
    if (!ncclNet.empty()) return plugin.status().withContext("NCCL_NET=" + ncclNet);
    if (rank_ == 0)
      TUTTI_WARN("{}; peers that shared memory does not carry use TCP", plugin.status().message());
    return Status::ok();
  }
  transport::NetTransport* net = *plugin;
  if (!ncclNet.empty() && (!net || lower(ncclNet) != lower(net->name())))
    return invalidArgument(
        fmt::format("NCCL_NET={}: no network of that name (available: Socket{}{})", ncclNet,
                    net ? ", " : "", net ? net->name() : ""));
  if (net) net_ = transport::makeStreamTransport(net);
  return Status::ok();
}

Status Comm::ensureConnected(const std::vector<int>& wanted) {
  if (std::all_of(wanted.begin(), wanted.end(),
                  [this](int p) { return p == rank_ || channels_[p][0].conn; }))
    return Status::ok();
  std::vector<int> peers = wanted;
  // Global order of pairs (min, max): every rank walks the pairs it needs in
  // the same order, so the lowest unconnected pair always makes progress.
  std::sort(peers.begin(), peers.end(), [this](int a, int b) {
    auto key = [this](int p) { return std::make_pair(std::min(p, rank_), std::max(p, rank_)); };
    return key(a) < key(b);
  });
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  for (int p : peers) {
    if (p == rank_ || channels_[p][0].conn) continue;
    TUTTI_RETURN_IF_ERROR(connectPair(p));
  }
  return Status::ok();
}

Status Comm::connectPair(int peer) {
  transport::Transport* t = transportFor(peer);
  std::shared_ptr<transport::TokenBucket> link;  // TUTTI_TEST_LINK_MBPS: one per link
  if (!linkMBps_.empty() && linkMBps_[peer] > 0 && t != shm_.get())
    link = std::make_shared<transport::TokenBucket>(linkMBps_[peer]);
  if (link) {
    testLinks_.resize(nranks_);
    testLinks_[peer] = link;
  }
  // Best effort (the handshakes report a peer that cannot be reached): a
  // peer waiting in awaitAnySource connects when it sees this.
  const uint64_t hello = connectTag(std::min(rank_, peer), std::max(rank_, peer), kHelloChannel);
  (void)bootstrap_->sendUntil(peer, hello, nullptr, 0, bootstrap_->deadline());
  for (int ch = 0; ch < nChannels_; ++ch) {
    transport::ConnectContext ctx;
    ctx.rank = rank_;
    ctx.peer = peer;
    ctx.channel = ch;
    ctx.isLower = rank_ < peer;
    ctx.peerSameHost = sameHost(peer);
    ctx.commHash = commHash();
    ctx.secret = bootstrap_->secret();
    ctx.bufferBytes = bufferBytes_;
    ctx.control = bootstrap_.get();
    ctx.deadline = bootstrap_->deadline();
    ctx.abortFlag = abort_;
    ctx.tagBase = connectTag(std::min(rank_, peer), std::max(rank_, peer), ch);
    if (oneShot_) ctx.peerBell = oneShot_->bell(peer);  // all on one host
    if (homeNuma_ >= 0)
      ctx.placeNear = [node = homeNuma_](void* p, size_t bytes) {
        topo::placeOnNode(p, bytes, node);
      };
    ctx.localIfAddr = bootstrap_->localAddr().str();
    // localAddr().str() is "ip:port"; the transport wants the address only.
    auto colon = ctx.localIfAddr.rfind(':');
    if (colon != std::string::npos) ctx.localIfAddr.resize(colon);
    if (!ctx.localIfAddr.empty() && ctx.localIfAddr.front() == '[')
      ctx.localIfAddr = ctx.localIfAddr.substr(1, ctx.localIfAddr.size() - 2);
    auto conn = t->connect(ctx);
    if (!conn)
      return conn.status().withContext(
          fmt::format("connecting to {} over {} (channel {})", describePeer(peer), t->name(), ch));
    channels_[peer][ch].conn = std::move(conn.value());
    if (link)
      channels_[peer][ch].conn = std::make_unique<transport::RateLimitedConnection>(
          std::move(channels_[peer][ch].conn), link);
  }
  TUTTI_INFO(log::kInit | log::kNet, "rank {} -> rank {} via {} ({}, {} channels)", rank_, peer,
             t->name(), describePeer(peer), nChannels_);
  // The peer's hello, when it has come: read, so that the mailbox does not
  // keep it (one that comes later stays, at most one per pair).
  (void)bootstrap_->recvUntil(peer, hello, std::chrono::steady_clock::now(), nullptr);
  return Status::ok();
}

Result<uint8_t*> Comm::scratch(size_t bytes) {
  if (bytes > scratchCap_) {
    scratch_.reset();
    scratchCap_ = 0;
    scratch_.reset(new (std::nothrow) uint8_t[bytes]);
    if (!scratch_) return systemError(fmt::format("cannot allocate {} bytes of scratch", bytes));
    scratchCap_ = bytes;
  }
  return scratch_.get();
}

void Comm::abort() {
  // The flag: the thread driving this communicator sees it before its next
  // message (or within one 50 ms slice of a control-plane wait). And, for
  // peers on this host, the arena state (one atomic word in shared memory,
  // safe from any thread): a peer waiting on this rank ends at once, saying
  // that this rank was aborted, instead of at its next 100 ms check.
  // The arena first: whatever this rank does once it sees the flag (its
  // executor failing the operation, its failure notice) comes after the
  // mark, so a peer that observes it and then reads the arena finds the
  // abort there, not this rank's notice ("gave up ...: communicator
  // aborted"), which peers on other hosts still get.
  if (ipc_) ipc_->markAborted();
  if (oneShot_) oneShot_->markAborted();
  abort_->store(true);
  if (Engine* e = engineSeen_.load(std::memory_order_acquire)) e->interrupt();
  if (oneShot_) oneShot_->wake();  // a thread asleep on this rank's doorbell
  // An abort of a communicator that still waits (a watchdog's, say) is the
  // moment to say on what.
  for (const auto& e : recorder_.entries())
    if (e.state == FlightRecorder::State::kPending) {
      dumpFlightRecorder("aborted (ncclCommAbort) with an operation pending");
      break;
    }
}

void Comm::dumpFlightRecorder(const std::string& reason) {
  if (dumped_.exchange(true)) return;  // once per communicator: its first failure
  FlightDump d;
  d.commHash = bootstrap_ ? commHash() : 0;
  d.rank = rank_;
  d.nranks = nranks_;
  d.host = bootstrap_ ? bootstrap_->peers()[rank_].hostname : "";
  d.pid = static_cast<int>(getpid());
  d.reason = reason;
  d.waitingOn = waitingOn();
  d.recorded = recorder_.recorded();
  d.at = recorder_.now();
  d.entries = recorder_.entries();
  const auto lines = dumpLines(d);
  // The summary at WARN (shown by default); every operation at INFO.
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i < 2)
      TUTTI_WARN("{}", lines[i]);
    else
      TUTTI_INFO(log::kColl, "{}", lines[i]);
  }
  const std::string pattern = params::getStr("TUTTI_DEBUG_DUMP", "");
  if (pattern.empty()) return;
  const std::string path = dumpPath(pattern, d);
  const std::string line = dumpJson(d) + "\n";
  // One write of one line, appended: ranks of one host may share the file.
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0 || ::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size()))
    TUTTI_WARN("TUTTI_DEBUG_DUMP: cannot write the flight recorder to {}: {}", path,
               strerror(errno));
  if (fd >= 0) ::close(fd);
}

void Comm::setError(const Status& st) {
  // After a revoke, what fails fails because of it: not an error state.
  bool first = false;
  {
    std::lock_guard<std::mutex> lk(errMu_);
    first = error_.isOk() && !st.isOk() && !revoked();
    if (first) {
      error_ = st;
      asyncError_.store(static_cast<int>(st.code()));
      if (oneShot_) oneShot_->markFailed();
    }
  }
  if (first) dumpFlightRecorder(st.message());
}

Status Comm::error() const {
  std::lock_guard<std::mutex> lk(errMu_);
  return error_;
}

void Comm::noteWaiting(const std::vector<int>& peers) {
  std::lock_guard<std::mutex> lk(waitingMu_);
  waitingOn_ = peers;
  std::sort(waitingOn_.begin(), waitingOn_.end());
  waitingNoted_.store(true, std::memory_order_relaxed);
}

void Comm::clearWaitingNow() {
  std::lock_guard<std::mutex> lk(waitingMu_);
  waitingOn_.clear();
  waitingNoted_.store(false, std::memory_order_relaxed);
}

std::vector<int> Comm::waitingOn() const {
  std::lock_guard<std::mutex> lk(waitingMu_);
  return waitingOn_;
}

std::vector<uint64_t> Comm::channelMessages() const {
  std::vector<uint64_t> out(nChannels_, 0);
  for (auto& v : channels_)
    for (int c = 0; c < nChannels_ && c < static_cast<int>(v.size()); ++c)
      out[c] += v[c].messagesSent;
  return out;
}

}  // namespace tutti::core

namespace tutti::core {

void Comm::noticeFailure(const Status& cause) {
  if (!bootstrap_) return;
  std::string text = cause.message();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  // Every peer, connected or not: one that is not may be about to connect
  // to this rank for its next operation, and would wait for the handshake
  // until its deadline (Bootstrap::recvUntil ends such waits on a notice).
  // First the peers this rank holds a connection to (the notice leaves at
  // once), then the others, each given at most kConnectFor: a dead peer's
  // refused connection must not use up the time the live ones need (their
  // waits for this notice are short: explainPeerFailure). A peer on this
  // host whose process is gone gets none.
  constexpr auto kConnectFor = std::chrono::milliseconds(200);
  std::vector<int> unconnected;
  for (int p = 0; p < nranks_; ++p) {
    if (p == rank_) continue;
    if (!bootstrap_->connectedTo(p)) {
      unconnected.push_back(p);
      continue;
    }
    (void)bootstrap_->sendUntil(p, kFailureNoticeTag, text.data(), text.size(), deadline);
  }
  for (int p : unconnected) {
    if (sameHost(p) && base::processDead(static_cast<pid_t>(peer(p).pid))) continue;
    const auto by = std::min(deadline, std::chrono::steady_clock::now() + kConnectFor);
    (void)bootstrap_->sendUntil(p, kFailureNoticeTag, text.data(), text.size(), by);
  }
}

Status Comm::peerAbortedError(int peer, std::string_view detail, Code code) const {
  return Status(code, fmt::format("{} aborted its communicator (ncclCommAbort){}",
                                  describePeer(peer), detail));
}

Status Comm::noticeFrom(int peer) {
  if (!bootstrap_ || peer < 0 || peer >= nranks_ || peer == rank_) return Status::ok();
  auto got = bootstrap_->recvUntil(peer, kFailureNoticeTag, std::chrono::steady_clock::now(),
                                   nullptr);
  if (!got) return Status::ok();
  std::string why(got->begin(), got->end());
  return remoteError(gaveUpMessage(describePeer(peer), why));
}

Status Comm::explainPeerFailure(int peer, const Status& observed, std::chrono::milliseconds wait) {
  if (!bootstrap_ || peer < 0 || peer >= nranks_ || peer == rank_) return observed;
  // An aborted peer on this host says so in the arena (read before its
  // notice, which says no more than "communicator aborted").
  if ((oneShot_ && oneShot_->peerAborted(peer)) || (ipc_ && ipc_->peerAborted(peer)))
    return peerAbortedError(peer, ": " + observed.message(), observed.code());
  auto got = bootstrap_->recvUntil(peer, kFailureNoticeTag, std::chrono::steady_clock::now() + wait,
                                   nullptr);
  if (!got) return observed;  // no notice: the observation is the root cause
  std::string why(got->begin(), got->end());
  return Status(observed.code(), gaveUpMessage(describePeer(peer), why));
}

}  // namespace tutti::core

namespace tutti::core {

Status Comm::readCompressionEnv() {
  std::string mode = params::getStr("TUTTI_COMPRESSION", "");
  std::transform(mode.begin(), mode.end(), mode.begin(),
                 [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  if (mode == "off" || mode == "none" || mode == "0") mode.clear();
  if (!mode.empty() && mode != "fp16" && mode != "bf16") {
    // 1-bit and PowerSGD keep state across calls: they need a compressor
    // (tuttiCompressorCreate), not a switch on plain ncclAllReduce.
    TUTTI_WARN("TUTTI_COMPRESSION={} is not one of fp16, bf16, off; compression stays off{}", mode,
               mode == "onebit" || mode == "1bit" || mode == "powersgd"
                   ? " (1-bit and PowerSGD need a compressor: tuttiCompressorCreate)"
                   : "");
    mode.clear();
  }
  compressionEnv_ = mode;
  const int64_t minBytes = params::getInt("TUTTI_COMPRESSION_MIN_BYTES", 256 << 10);
  compressionMinBytes_ = minBytes < 0 ? 0 : static_cast<size_t>(minBytes);
  if (!mode.empty() && rank_ == 0)
    TUTTI_INFO(log::kInit | log::kTuning,
               "TUTTI_COMPRESSION={}: float32 sum/avg all-reduces of {} bytes and more travel as "
               "{} between nodes",
               mode, compressionMinBytes_, mode);
  return Status::ok();
}

}  // namespace tutti::core
