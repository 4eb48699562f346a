// tutti-sim: predicted collective times at scales we cannot run, from the
// library's own schedules over a model of links (docs/simulator.md).
//
// Exit codes: 0 success, 1 a simulation failed (inconsistent schedules or a
// deadlock; the message names rank, peer and tag), 2 bad flags.
#include <getopt.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "algo/balance.h"
#include "common/cli_parse.h"
#include "sim.h"

namespace tutti::sim {
namespace {

using bench::endsWith;
using bench::flagName;
using bench::parseLong;
using bench::parseSize;

using algo::CollArgs;
using algo::Collective;

constexpr const char* kProg = "tutti-sim";

struct CollChoice {
  const char* name;
  Collective coll;
  bool hasRoot;
};
const CollChoice kColls[] = {
    {"all_reduce", Collective::kAllReduce, false},
    {"reduce_scatter", Collective::kReduceScatter, false},
    {"all_gather", Collective::kAllGather, false},
    {"broadcast", Collective::kBroadcast, true},
    {"reduce", Collective::kReduce, true},
    {"alltoall", Collective::kAllToAll, false},
    {"gather", Collective::kGather, true},
    {"scatter", Collective::kScatter, true},
};

struct AlgoChoice {
  const char* name;
  CollArgs::Algo algo;
};
const AlgoChoice kAlgos[] = {
    {"ring", CollArgs::Algo::kRing},     {"tree", CollArgs::Algo::kRecursiveDoubling},
    {"2dring", CollArgs::Algo::k2DRing}, {"hierarchical", CollArgs::Algo::kHierarchical},
    {"rabenseifner", CollArgs::Algo::kRabenseifner}, {"auto", CollArgs::Algo::kAuto},
};

struct TypeChoice {
  const char* name;
  DataType dt;
};
const TypeChoice kTypes[] = {
    {"int8", DataType::kInt8},         {"uint8", DataType::kUint8},
    {"int32", DataType::kInt32},       {"uint32", DataType::kUint32},
    {"int64", DataType::kInt64},       {"uint64", DataType::kUint64},
    {"half", DataType::kFloat16},      {"float16", DataType::kFloat16},
    {"bfloat16", DataType::kBfloat16}, {"float", DataType::kFloat32},
    {"float32", DataType::kFloat32},   {"double", DataType::kFloat64},
    {"float64", DataType::kFloat64},
};

struct Options {
  std::vector<int> layout;  // ranks per node
  int nodes = 1, ppn = 8;
  bool layoutGiven = false, nodesGiven = false;
  const CollChoice* coll = &kColls[0];
  size_t minBytes = size_t{32} << 20, maxBytes = size_t{32} << 20;
  size_t stepBytes = size_t{1} << 20, stepFactor = 1;
  bool sizesGiven = false;
  const TypeChoice* type = &kTypes[9];
  int root = 0;
  bool inPlace = false;
  std::vector<const AlgoChoice*> algos;
  SimConfig cfg;
  size_t chunk = size_t{512} << 10;
  size_t rdMax = size_t{64} << 10;
  double computeMs = -1;
  size_t gradBytes = 0;
  bool gradGiven = false;
  bool balance = false;  // --balance
};

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool parseDouble(const char* text, double lo, double* out) {
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(text, &end);
  if (end == text || *end != '\0' || errno != 0 || !(v >= lo) || std::isinf(v)) return false;
  *out = v;
  return true;
}

// Bandwidth in GB/s (1e9 bytes/s). A plain number is GB/s; a decimal prefix
// (k, M, G, T) then "bit", "bit/s", "b/s" or "b" is bits per second (25gbit,
// the tc syntax the netns harness takes; 25Gb/s); "B/s", "B", "byte", "byte/s"
// is bytes (12.5GB/s). The case of a lone b/B decides. "bps" is refused: tc
// reads it as bytes, most people as bits.
bool parseBandwidth(const char* text, double* gbs) {
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(text, &end);
  if (end == text || errno != 0 || !(v > 0) || std::isinf(v)) return false;
  std::string suffix(end);
  if (suffix.empty()) {
    *gbs = v;
    return true;
  }
  double scale;
  switch (std::tolower(static_cast<unsigned char>(suffix[0]))) {
    case 'k':
      scale = 1e-6;
      break;
    case 'm':
      scale = 1e-3;
      break;
    case 'g':
      scale = 1;
      break;
    case 't':
      scale = 1e3;
      break;
    default:
      return false;
  }
  const std::string rest = suffix.substr(1), lrest = lower(rest);
  bool bits;
  if (lrest == "bit" || lrest == "bits" || lrest == "bit/s" || lrest == "bits/s" || rest == "b" ||
      rest == "b/s")
    bits = true;
  else if (lrest == "byte" || lrest == "bytes" || lrest == "byte/s" || lrest == "bytes/s" ||
           rest == "B" || rest == "B/s")
    bits = false;
  else
    return false;
  *gbs = v * scale / (bits ? 8 : 1);
  return true;
}

bool parseLayout(const char* text, std::vector<int>* out) {
  out->clear();
  std::string s(text);
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    long v;
    if (!parseLong(item.c_str(), 1, 1 << 16, &v)) return false;
    out->push_back(static_cast<int>(v));
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return !out->empty();
}

bool parseAlgos(const char* text, std::vector<const AlgoChoice*>* out) {
  out->clear();
  std::string s = lower(text);
  if (s == "all") {
    for (const auto& a : kAlgos) out->push_back(&a);
    return true;
  }
  size_t pos = 0;
  while (pos <= s.size()) {
    size_t comma = s.find(',', pos);
    std::string item = s.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (item == "rd" || item == "recursive_doubling" || item == "recursive-doubling") item = "tree";
    if (item == "2d" || item == "2d_ring" || item == "2d-ring") item = "2dring";
    if (item == "hier") item = "hierarchical";
    const AlgoChoice* found = nullptr;
    for (const auto& a : kAlgos)
      if (item == a.name) found = &a;
    if (!found) return false;
    out->push_back(found);
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return !out->empty();
}

const CollChoice* findColl(const std::string& name) {
  std::string key;
  for (char c : lower(name))
    if (c != '_' && c != '-') key += c;
  if (endsWith(key, "perf")) key.resize(key.size() - 4);
  for (const auto& c : kColls) {
    std::string k;
    for (const char* p = c.name; *p; ++p)
      if (*p != '_') k += *p;
    if (k == key) return &c;
  }
  return nullptr;
}

void printUsage() {
  std::printf(
      "usage: %s [flags]\n"
      "\n"
      "Predicts collective times by simulating tutti's own schedules over a model of links\n"
      "(docs/simulator.md). Ranks are numbered node by node.\n"
      "\n"
      "  --nodes <n>              nodes (default 1)\n"
      "  --ppn <k>                ranks per node (default 8)\n"
      "  --layout <k1,k2,...>     ranks on each node, for unequal nodes (instead of "
      "--nodes/--ppn)\n"
      "  --coll <name>            all_reduce (default), reduce_scatter, all_gather, broadcast,\n"
      "                           reduce, alltoall, gather, scatter\n"
      "  -b, --minbytes <size>    smallest size (default 32M; K, M, G are binary multiples)\n"
      "  -e, --maxbytes <size>    largest size (default 32M)\n"
      "  -f, --stepfactor <n>     multiply the size by n each step (default 1: use -i)\n"
      "  -i, --stepbytes <size>   add this to the size each step (default 1M)\n"
      "  -d, --datatype <type>    float (default), half, bfloat16, double, int8, int32, int64, "
      "...\n"
      "  -r, --root <rank>        root of broadcast, reduce, gather, scatter (default 0)\n"
      "      --inplace            simulate the in-place variant (default out-of-place)\n"
      "  --algo <list>            ring, tree (recursive doubling), 2dring, hierarchical,\n"
      "                           rabenseifner, auto,\n"
      "                           a comma list, or all (one column group each; default auto)\n"
      "  --intra-lat <us>         same-node latency per message (default 1)\n"
      "  --intra-bw <bw>          same-node bandwidth per rank and direction (default 5 GB/s)\n"
      "  --inter-lat <us>         network latency per message (default 20)\n"
      "  --inter-bw <bw>          NIC bandwidth per node and direction (default 1.25 GB/s)\n"
      "                           <bw>: a plain number is GB/s (1e9 bytes/s); 25gbit, 25Gb/s\n"
      "                           are bits per second (as tc); 12.5GB/s is bytes\n"
      "  --node-bw <k:bw,...>     node k's NIC at bw instead (both directions), e.g. 2:250mbit\n"
      "  --balance                all-reduces of 1 MiB or more run balanced (ring, hierarchical,\n"
      "                           2dring): shares planned from the model's link rates as tutti\n"
      "                           plans them at init from measured ones\n"
      "                           (docs/topology-algorithms.md)\n"
      "  --chunk <size>           slice size of the schedules (default 512K)\n"
      "  --rd-max <size>          auto all-reduce: recursive doubling up to this (default 64K)\n"
      "  --compute-bw <GB/s>      per-rank reduce/copy throughput (default 0: free)\n"
      "  --msg-overhead <us>      per-message CPU cost at the sender (default 0)\n"
      "  --compute-ms <T>         compute time per training step, with --grad-bytes: prints\n"
      "  --grad-bytes <size>      communication time per step and scaling efficiency\n"
      "  -h, --help               this text\n",
      kProg);
}

enum : int {
  kOptNodes = 256,
  kOptPpn,
  kOptLayout,
  kOptColl,
  kOptAlgo,
  kOptIntraLat,
  kOptIntraBw,
  kOptInterLat,
  kOptInterBw,
  kOptChunk,
  kOptRdMax,
  kOptComputeBw,
  kOptMsgOverhead,
  kOptComputeMs,
  kOptGradBytes,
  kOptInPlace,
  kOptNodeBw,
  kOptBalance,
};

const option kLongOpts[] = {
    {"nodes", required_argument, nullptr, kOptNodes},
    {"ppn", required_argument, nullptr, kOptPpn},
    {"layout", required_argument, nullptr, kOptLayout},
    {"coll", required_argument, nullptr, kOptColl},
    {"minbytes", required_argument, nullptr, 'b'},
    {"maxbytes", required_argument, nullptr, 'e'},
    {"stepfactor", required_argument, nullptr, 'f'},
    {"stepbytes", required_argument, nullptr, 'i'},
    {"datatype", required_argument, nullptr, 'd'},
    {"root", required_argument, nullptr, 'r'},
    {"inplace", no_argument, nullptr, kOptInPlace},
    {"algo", required_argument, nullptr, kOptAlgo},
    {"intra-lat", required_argument, nullptr, kOptIntraLat},
    {"intra-bw", required_argument, nullptr, kOptIntraBw},
    {"inter-lat", required_argument, nullptr, kOptInterLat},
    {"inter-bw", required_argument, nullptr, kOptInterBw},
    {"chunk", required_argument, nullptr, kOptChunk},
    {"rd-max", required_argument, nullptr, kOptRdMax},
    {"compute-bw", required_argument, nullptr, kOptComputeBw},
    {"msg-overhead", required_argument, nullptr, kOptMsgOverhead},
    {"compute-ms", required_argument, nullptr, kOptComputeMs},
    {"grad-bytes", required_argument, nullptr, kOptGradBytes},
    {"node-bw", required_argument, nullptr, kOptNodeBw},
    {"balance", no_argument, nullptr, kOptBalance},
    {"help", no_argument, nullptr, 'h'},
    {nullptr, 0, nullptr, 0},
};

// 0: run; 1: help printed; 2: bad flags (message printed).
int parseOptions(int argc, char** argv, Options* o) {
  auto bad = [&](int key, const char* value, const char* expected) {
    std::fprintf(stderr, "%s: invalid value '%s' for %s: expected %s\n", kProg, value,
                 flagName(key, kLongOpts).c_str(), expected);
    return 2;
  };
  bool bSet = false, eSet = false;
  opterr = 0;
  optind = 1;
  int c;
  while ((c = getopt_long(argc, argv, ":b:e:f:i:d:r:h", kLongOpts, nullptr)) != -1) {
    long v;
    double d;
    switch (c) {
      case 'h':
        printUsage();
        return 1;
      case kOptNodes:
        if (!parseLong(optarg, 1, 1 << 16, &v)) return bad(c, optarg, "an integer from 1 to 65536");
        o->nodes = static_cast<int>(v);
        o->nodesGiven = true;
        break;
      case kOptPpn:
        if (!parseLong(optarg, 1, 1 << 16, &v)) return bad(c, optarg, "an integer from 1 to 65536");
        o->ppn = static_cast<int>(v);
        o->nodesGiven = true;
        break;
      case kOptLayout:
        if (!parseLayout(optarg, &o->layout))
          return bad(c, optarg, "ranks per node, comma separated, such as 8,8,4");
        o->layoutGiven = true;
        break;
      case kOptColl:
        o->coll = findColl(optarg);
        if (!o->coll)
          return bad(c, optarg,
                     "all_reduce, reduce_scatter, all_gather, broadcast, reduce, alltoall, gather "
                     "or scatter");
        break;
      case 'b':
        if (!parseSize(optarg, &o->minBytes)) return bad(c, optarg, "a size such as 8, 1K, 256M");
        bSet = true;
        break;
      case 'e':
        if (!parseSize(optarg, &o->maxBytes)) return bad(c, optarg, "a size such as 8, 1K, 256M");
        eSet = true;
        break;
      case 'f':
        if (!parseLong(optarg, 1, 1 << 20, &v)) return bad(c, optarg, "an integer >= 1");
        o->stepFactor = static_cast<size_t>(v);
        break;
      case 'i':
        if (!parseSize(optarg, &o->stepBytes) || o->stepBytes == 0)
          return bad(c, optarg, "a size > 0 such as 1M");
        break;
      case 'd': {
        o->type = nullptr;
        for (const auto& t : kTypes)
          if (lower(optarg) == t.name) o->type = &t;
        if (!o->type)
          return bad(c, optarg,
                     "int8, uint8, int32, uint32, int64, uint64, half, bfloat16, float "
                     "or double");
        break;
      }
      case 'r':
        if (!parseLong(optarg, 0, 1 << 24, &v)) return bad(c, optarg, "a rank >= 0");
        o->root = static_cast<int>(v);
        break;
      case kOptInPlace:
        o->inPlace = true;
        break;
      case kOptAlgo:
        if (!parseAlgos(optarg, &o->algos))
          return bad(c, optarg, "ring, tree, 2dring, hierarchical, auto, a comma list, or all");
        break;
      case kOptIntraLat:
      case kOptInterLat:
        if (!parseDouble(optarg, 0, &d)) return bad(c, optarg, "microseconds >= 0");
        (c == kOptIntraLat ? o->cfg.cost.intra : o->cfg.cost.inter).latencyUs = d;
        break;
      case kOptIntraBw:
      case kOptInterBw:
        if (!parseBandwidth(optarg, &d))
          return bad(c, optarg, "a bandwidth > 0: GB/s, or with a unit: 25gbit, 25Gb/s, 12.5GB/s");
        (c == kOptIntraBw ? o->cfg.cost.intra : o->cfg.cost.inter).bandwidthGBs = d;
        break;
      case kOptChunk:
        if (!parseSize(optarg, &o->chunk) || o->chunk == 0)
          return bad(c, optarg, "a size > 0 such as 512K");
        break;
      case kOptRdMax:
        if (!parseSize(optarg, &o->rdMax)) return bad(c, optarg, "a size such as 64K");
        break;
      case kOptComputeBw:
        if (!parseDouble(optarg, 0, &d)) return bad(c, optarg, "GB/s >= 0 (0: free)");
        o->cfg.computeGBs = d;
        break;
      case kOptMsgOverhead:
        if (!parseDouble(optarg, 0, &d)) return bad(c, optarg, "microseconds >= 0");
        o->cfg.msgOverheadUs = d;
        break;
      case kOptNodeBw: {
        // k:bw[,k:bw...]
        std::string text = optarg;
        for (size_t at = 0; at <= text.size();) {
          const size_t comma = std::min(text.find(',', at), text.size());
          const std::string item = text.substr(at, comma - at);
          at = comma + 1;
          const size_t colon = item.find(':');
          double gbs = 0;
          if (colon == std::string::npos ||
              !parseLong(item.substr(0, colon).c_str(), 0, (1 << 16) - 1, &v) ||
              !parseBandwidth(item.c_str() + colon + 1, &gbs) || !(gbs > 0))
            return bad(c, optarg, "node:bandwidth pairs, comma separated, such as 2:250mbit");
          if (o->cfg.nodeInterGBs.size() <= static_cast<size_t>(v))
            o->cfg.nodeInterGBs.resize(v + 1, 0.0);
          o->cfg.nodeInterGBs[v] = gbs;
        }
        break;
      }
      case kOptBalance:
        o->balance = true;
        break;
      case kOptComputeMs:
        if (!parseDouble(optarg, 0, &d) || d <= 0) return bad(c, optarg, "milliseconds > 0");
        o->computeMs = d;
        break;
      case kOptGradBytes:
        if (!parseSize(optarg, &o->gradBytes) || o->gradBytes == 0)
          return bad(c, optarg, "a size > 0 such as 100M");
        o->gradGiven = true;
        break;
      case ':':
        std::fprintf(stderr, "%s: option %s needs a value; see %s -h\n", kProg,
                     optopt ? flagName(optopt, kLongOpts).c_str() : argv[optind - 1], kProg);
        return 2;
      default:
        if (optopt > 0 && optopt < 256)
          std::fprintf(stderr, "%s: unknown option '-%c'; see %s -h\n", kProg, optopt, kProg);
        else
          std::fprintf(stderr, "%s: unknown option '%s'; see %s -h\n", kProg, argv[optind - 1],
                       kProg);
        return 2;
    }
  }
  if (optind < argc) {
    // A positional collective, as tutti-perf takes it.
    const CollChoice* cc = findColl(argv[optind]);
    if (!cc || optind + 1 < argc) {
      std::fprintf(stderr, "%s: unexpected argument '%s'; see %s -h\n", kProg, argv[optind], kProg);
      return 2;
    }
    o->coll = cc;
  }
  if (o->layoutGiven && o->nodesGiven) {
    std::fprintf(stderr, "%s: give either --layout or --nodes/--ppn, not both\n", kProg);
    return 2;
  }
  if (!o->layoutGiven) o->layout.assign(o->nodes, o->ppn);
  if (o->cfg.nodeInterGBs.size() > o->layout.size()) {
    std::fprintf(stderr, "%s: --node-bw names node %zu; there are %zu nodes\n", kProg,
                 o->cfg.nodeInterGBs.size() - 1, o->layout.size());
    return 2;
  }
  long total = 0;
  for (int k : o->layout) total += k;
  if (total > (1 << 16)) {
    std::fprintf(stderr, "%s: %ld ranks: at most 65536 are simulated\n", kProg, total);
    return 2;
  }
  if (o->coll->hasRoot && o->root >= total) {
    std::fprintf(stderr, "%s: -r/--root %d: there are only %ld ranks\n", kProg, o->root, total);
    return 2;
  }
  if ((o->computeMs > 0) != o->gradGiven) {
    std::fprintf(stderr, "%s: --compute-ms and --grad-bytes go together\n", kProg);
    return 2;
  }
  if (o->gradGiven && !bSet && !eSet) o->minBytes = o->maxBytes = o->gradBytes;
  // One end given: the default of the other follows it (-b 100M alone is one size).
  if (bSet && !eSet && o->minBytes > o->maxBytes) o->maxBytes = o->minBytes;
  if (eSet && !bSet && o->minBytes > o->maxBytes) o->minBytes = o->maxBytes;
  if (o->minBytes > o->maxBytes) {
    std::fprintf(stderr, "%s: -b/--minbytes (%zu) is larger than -e/--maxbytes (%zu)\n", kProg,
                 o->minBytes, o->maxBytes);
    return 2;
  }
  if (o->algos.empty()) o->algos.push_back(&kAlgos[4]);
  return 0;
}

// nccl-tests' element counts: count per rank for the gathering and scattering
// collectives, so that size = count * elem * nranks.
size_t countFor(Collective c, size_t bytes, size_t elem, int n) {
  const size_t count = bytes / elem;
  switch (c) {
    case Collective::kAllGather:
    case Collective::kReduceScatter:
    case Collective::kAllToAll:
    case Collective::kGather:
    case Collective::kScatter:
      return count / static_cast<size_t>(n);
    default:
      return count;
  }
}

std::string gbsText(double gbs) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g GB/s (%g Gbit/s)", gbs, gbs * 8);
  return buf;
}

struct Runner {
  const Options& o;
  algo::NodeMap nodes;
  int n = 0;
  double slowestSec = 0, totalSec = 0;
  int runs = 0;
  bool failed = false;
  std::map<std::string, std::set<std::string>> generators;  // requested -> produced

  CollArgs args(const AlgoChoice& a, size_t bytes) const {
    CollArgs c{};
    c.coll = o.coll->coll;
    c.rank = 0;
    c.nranks = n;
    c.elemSize = dataTypeSize(o.type->dt);
    c.count = countFor(c.coll, bytes, c.elemSize, n);
    c.spec.dt = o.type->dt;
    c.root = o.coll->hasRoot ? o.root : 0;
    c.inPlace = o.inPlace;
    c.chunkBytes = o.chunk;
    c.rdMaxBytes = o.rdMax;
    c.algo = a.algo;
    c.nodes = &nodes;
    c.cost = &o.cfg.cost;
    if (planned && c.coll == Collective::kAllReduce && bytes >= algo::kBalanceMinBytes)
      c.balance = &balance;
    return c;
  }

  // --balance: the plans tutti makes at init (Comm::planBalance), from the
  // model's rates: a ring link inside a node at the intra-node figure, one
  // between nodes at the slower of the two NICs.
  algo::Balance balance;
  bool planned = false;
  std::string planBalance() {
    const std::vector<int> ring = nodes.ringOrder();
    auto nic = [&](int node) {
      const auto& v = o.cfg.nodeInterGBs;
      return static_cast<size_t>(node) < v.size() && v[node] > 0 ? v[node]
                                                                 : o.cfg.cost.inter.bandwidthGBs;
    };
    std::vector<double> rate(n);
    for (int p = 0; p < n; ++p) {
      const int a = nodes.nodeOf[ring[p]], b = nodes.nodeOf[ring[(p + 1) % n]];
      rate[p] = a == b ? o.cfg.cost.intra.bandwidthGBs : std::min(nic(a), nic(b));
    }
    balance = algo::planBalance(nodes, rate);
    balance.live = true;  // tutti re-plans by default (TUTTI_REPLAN_BYTES)
    planned = true;
    return algo::describeBalance(nodes, balance);
  }

  std::map<std::pair<std::string, size_t>, SimResult> done;  // the scaling rows reuse the table's

  Result<SimResult> run(const AlgoChoice& a, size_t bytes) {
    auto hit = done.find({a.name, bytes});
    if (hit != done.end()) return hit->second;
    auto t0 = std::chrono::steady_clock::now();
    auto r = simulate(args(a, bytes), o.cfg);
    double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    slowestSec = std::max(slowestSec, sec);
    totalSec += sec;
    ++runs;
    if (r) {
      generators[a.name].insert(r->algorithm);
      done.emplace(std::make_pair(std::string(a.name), bytes), *r);
    } else {
      failed = true;
      std::fprintf(stderr, "%s: %s, %s, %zu bytes: %s\n", kProg, o.coll->name, a.name, bytes,
                   r.status().message().c_str());
    }
    return r;
  }
};

int mainImpl(int argc, char** argv) {
  Options o;
  int pr = parseOptions(argc, argv, &o);
  if (pr == 1) return 0;
  if (pr != 0) return 2;
  Runner run{o, makeNodeMap(o.layout), 0, 0.0, 0.0, 0, false, {}, {}, false, {}};
  run.n = static_cast<int>(run.nodes.nodeOf.size());
  const int n = run.n;

  bool uniform = true;
  for (int k : o.layout) uniform = uniform && k == o.layout[0];
  std::string layoutText;
  if (uniform) {
    layoutText = std::to_string(o.layout.size()) + " node" + (o.layout.size() == 1 ? "" : "s") +
                 " x " + std::to_string(o.layout[0]) + " ranks";
  } else {
    layoutText = std::to_string(o.layout.size()) + " nodes (";
    for (size_t i = 0; i < o.layout.size(); ++i)
      layoutText += (i ? "," : "") + std::to_string(o.layout[i]);
    layoutText += " ranks)";
  }
  std::printf("# %s: %s, %d ranks on %s, %s, %s, chunk %zu B, rd-max %zu B\n", kProg, o.coll->name,
              n, layoutText.c_str(), o.type->name, o.inPlace ? "in-place" : "out-of-place", o.chunk,
              o.rdMax);
  std::printf("# intra: %g us, %s per rank port and direction\n", o.cfg.cost.intra.latencyUs,
              gbsText(o.cfg.cost.intra.bandwidthGBs).c_str());
  std::printf("# inter: %g us, %s per node NIC and direction; FIFO per resource\n",
              o.cfg.cost.inter.latencyUs, gbsText(o.cfg.cost.inter.bandwidthGBs).c_str());
  for (size_t k = 0; k < o.cfg.nodeInterGBs.size(); ++k)
    if (o.cfg.nodeInterGBs[k] > 0)
      std::printf("# node %zu: NIC at %s\n", k, gbsText(o.cfg.nodeInterGBs[k]).c_str());
  if (o.balance && n > 1 && run.nodes.nNodes() > 1)
    std::printf("# balance (all-reduces of 1 MiB or more): %s\n", run.planBalance().c_str());
  else if (o.balance)
    std::printf("# balance: one node, nothing to plan\n");
  if (o.cfg.computeGBs > 0 || o.cfg.msgOverheadUs > 0)
    std::printf("# cpu: compute %g GB/s, %g us per message\n", o.cfg.computeGBs,
                o.cfg.msgOverheadUs);
  std::printf("#\n");

  // Header: one column group per algorithm.
  std::printf("# %10s  %12s", "", "");
  for (const AlgoChoice* a : o.algos) std::printf("  %40s", a->name);
  std::printf("\n# %10s  %12s", "size", "count");
  for (size_t i = 0; i < o.algos.size(); ++i)
    std::printf("  %10s  %7s  %7s  %10s", "time", "algbw", "busbw", "xnode");
  std::printf("\n# %10s  %12s", "(B)", "(elements)");
  for (size_t i = 0; i < o.algos.size(); ++i)
    std::printf("  %10s  %7s  %7s  %10s", "(us)", "(GB/s)", "(GB/s)", "(MB)");
  std::printf("\n");
  std::fflush(stdout);

  for (size_t size = o.minBytes; size <= o.maxBytes;) {
    CollArgs proto = run.args(kAlgos[0], size);
    std::printf("%12zu  %12zu", collSizeBytes(proto), proto.count);
    for (const AlgoChoice* a : o.algos) {
      auto r = run.run(*a, size);
      if (r)
        std::printf("  %10.1f  %7.3f  %7.3f  %10.3f", r->timeUs, r->algBwGBs, r->busBwGBs,
                    static_cast<double>(r->interNodeBytes) / 1e6);
      else
        std::printf("  %10s  %7s  %7s  %10s", "error", "-", "-", "-");
    }
    std::printf("\n");
    std::fflush(stdout);
    size_t next = o.stepFactor > 1 ? (size == 0 ? 1 : size * o.stepFactor) : size + o.stepBytes;
    if (next <= size) break;
    size = next;
  }
  std::printf("#\n# generators:");
  for (const AlgoChoice* a : o.algos) {
    std::string made;
    for (const auto& g : run.generators[a->name]) made += (made.empty() ? "" : "/") + g;
    std::printf(" %s -> %s;", a->name, made.empty() ? "?" : made.c_str());
  }
  std::printf("\n");

  if (o.gradGiven) {
    const double T = o.computeMs * 1e3;  // us
    std::printf("#\n# scaling: %s of %zu bytes per step, %g ms compute per step\n", o.coll->name,
                o.gradBytes, o.computeMs);
    std::printf("# %14s  %12s  %12s  %14s\n", "algorithm", "comm (ms)", "no overlap",
                "full overlap");
    for (const AlgoChoice* a : o.algos) {
      auto r = run.run(*a, o.gradBytes);
      if (!r) {
        std::printf("  %14s  %12s\n", a->name, "error");
        continue;
      }
      const double C = r->timeUs;
      std::printf("  %14s  %12.3f  %11.1f%%  %13.1f%%\n", a->name, C / 1e3, 100 * T / (T + C),
                  100 * T / std::max(T, C));
    }
  }
  std::printf("#\n# %d simulation%s in %.2f s (slowest %.2f s)\n", run.runs,
              run.runs == 1 ? "" : "s", run.totalSec, run.slowestSec);
  return run.failed ? 1 : 0;
}

}  // namespace
}  // namespace tutti::sim

int main(int argc, char** argv) { return tutti::sim::mainImpl(argc, argv); }
