#include "options.h"

#include <getopt.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "common/cli_parse.h"

namespace tutti::perf {
namespace {

using bench::endsWith;
using bench::flagName;
using bench::parseLong;
using bench::parseSize;

const std::vector<CollInfo> kColls = {
    {Coll::kAllReduce, "all_reduce", true, false},
    {Coll::kAllGather, "all_gather", false, false},
    {Coll::kReduceScatter, "reduce_scatter", true, false},
    {Coll::kBroadcast, "broadcast", false, true},
    {Coll::kReduce, "reduce", true, true},
    {Coll::kAllToAll, "alltoall", false, false},
    {Coll::kGather, "gather", false, true},
    {Coll::kScatter, "scatter", false, true},
    {Coll::kSendRecv, "sendrecv", false, false},
    {Coll::kAllToAllv, "alltoallv", false, false},
    {Coll::kHyperCube, "hypercube", false, false},
};

const char kCollList[] =
    "all_reduce, all_gather, reduce_scatter, broadcast, reduce, alltoall, gather, scatter, "
    "sendrecv, alltoallv or hypercube";

std::string squash(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c != '_' && c != '-') out += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  }
  return out;
}

constexpr int kOptNp = 256;
constexpr int kOptCompress = 257;
constexpr int kOptPowerSgdRank = 258;
constexpr int kOptMem = 259;
constexpr int kOptPlot = 260;

const struct {
  Compress kind;
  const char* name;
} kCompressNames[] = {
    {Compress::kNone, "none"},     {Compress::kFp16, "fp16"},         {Compress::kBf16, "bf16"},
    {Compress::kOneBit, "onebit"}, {Compress::kPowerSGD, "powersgd"},
};

bool parseCompress(const char* text, Compress* out) {
  std::string key = squash(text);     // "one-bit", "1bit", "PowerSGD", "power_sgd"
  if (key == "1bit") key = "onebit";  // the old spelling
  for (const auto& c : kCompressNames) {
    if (key == c.name) {
      *out = c.kind;
      return true;
    }
  }
  return false;
}

const option kLongOpts[] = {
    {"nthreads", required_argument, nullptr, 't'},
    {"ngpus", required_argument, nullptr, 'g'},
    {"minbytes", required_argument, nullptr, 'b'},
    {"maxbytes", required_argument, nullptr, 'e'},
    {"stepbytes", required_argument, nullptr, 'i'},
    {"stepfactor", required_argument, nullptr, 'f'},
    {"iters", required_argument, nullptr, 'n'},
    {"agg_iters", required_argument, nullptr, 'm'},
    {"warmup_iters", required_argument, nullptr, 'w'},
    {"parallel_init", required_argument, nullptr, 'p'},
    {"check", required_argument, nullptr, 'c'},
    {"op", required_argument, nullptr, 'o'},
    {"datatype", required_argument, nullptr, 'd'},
    {"root", required_argument, nullptr, 'r'},
    {"blocking", required_argument, nullptr, 'z'},
    {"stream_null", required_argument, nullptr, 'y'},
    {"timeout", required_argument, nullptr, 'T'},
    {"cudagraph", required_argument, nullptr, 'G'},
    {"report_cputime", required_argument, nullptr, 'C'},
    {"report_timestamps", required_argument, nullptr, 'S'},
    {"output_file", required_argument, nullptr, 'J'},
    {"average", required_argument, nullptr, 'a'},
    {"local_register", required_argument, nullptr, 'R'},
    {"cta_policy", required_argument, nullptr, 'x'},
    {"device_implementation", required_argument, nullptr, 'D'},
    {"device_cta_count", required_argument, nullptr, 'V'},
    {"memory", required_argument, nullptr, 'M'},
    {"unalign", required_argument, nullptr, 'u'},
    {"per_iter_timing", required_argument, nullptr, 'I'},
    {"per_iter_skip", required_argument, nullptr, 'K'},
    {"run_cycles", required_argument, nullptr, 'N'},
    {"np", required_argument, nullptr, kOptNp},
    {"compress", required_argument, nullptr, kOptCompress},
    {"powersgd-rank", required_argument, nullptr, kOptPowerSgdRank},
    {"powersgd_rank", required_argument, nullptr, kOptPowerSgdRank},
    {"mem", required_argument, nullptr, kOptMem},
    {"plot", required_argument, nullptr, kOptPlot},
    {"help", no_argument, nullptr, 'h'},
    {nullptr, 0, nullptr, 0},
};

const char kShortOpts[] = ":t:g:b:e:i:f:n:m:w:p:c:o:d:r:z:y:T:G:C:S:J:a:R:x:D:V:M:u:I:K:N:h";

}  // namespace

const std::vector<CollInfo>& allColls() { return kColls; }

const char* compressName(Compress c) {
  for (const auto& n : kCompressNames) {
    if (n.kind == c) return n.name;
  }
  return "off";
}

const char* memName(Mem m) { return m == Mem::kDevice ? "device" : "host"; }

bool haveJson() {
#ifdef TUTTI_PERF_HAVE_JSON
  return true;
#else
  return false;
#endif
}

const CollInfo* findColl(const std::string& name) {
  std::string key = squash(name);
  if (endsWith(key, "perf")) key.resize(key.size() - 4);
  for (const CollInfo& c : kColls) {
    if (key == squash(c.name)) return &c;
  }
  return nullptr;
}

void printUsage(const char* prog) {
  std::printf(
      "usage: %s <collective> [flags]\n"
      "\n"
      "nccl-tests (2.19) compatible benchmark for tutti. Collectives: all_reduce,\n"
      "all_gather, reduce_scatter, broadcast, reduce, alltoall, gather, scatter, sendrecv,\n"
      "alltoallv, hypercube (the nccl-tests binary names such as all_reduce_perf are\n"
      "accepted too).\n"
      "\n"
      "  -b, --minbytes <size>       smallest size (default 32M); sizes take K, M, G suffixes\n"
      "  -e, --maxbytes <size>       largest size (default 32M)\n"
      "  -f, --stepfactor <n>        multiply the size by n each step (default 1: use -i)\n"
      "  -i, --stepbytes <size>      add this to the size each step (default 1M)\n"
      "  -n, --iters <n>             timed iterations per size (default 20)\n"
      "  -w, --warmup_iters <n>      untimed iterations at every size from -b to -e, doubling\n"
      "                              (default 1)\n"
      "  -m, --agg_iters <n>         operations per iteration, in one ncclGroupStart/End "
      "(default 1)\n"
      "  -c, --check <n>             checked calls per result, each on fresh data; 0: none\n"
      "                              (default 1)\n"
      "  -d, --datatype <type>       %s, or all (default float)\n"
      "  -o, --op <op>               sum, prod, max, min, avg, mulsum (also premulsum), or all\n"
      "                              (default sum)\n"
      "  -r, --root <rank>           root of broadcast/reduce/gather/scatter; -1: every rank "
      "(default 0)\n"
      "  -a, --average <0/1/2/3>     time across ranks: 0 rank 0, 1 average, 2 min, 3 max (default "
      "1)\n"
      "  -z, --blocking <0/1/2/3>    1: barrier after each inner iteration (-m); 2: wait after\n"
      "                              each, no barrier; 3: barrier after each outer iteration\n"
      "                              (-n), not timed (default 0)\n"
      "  -C, --report_cputime <0/1>  name the time column cputime (host: the same times)\n"
      "  -I, --per_iter_timing <0/1> add i_min i_max i_p99 i_cv%% after each half (default 0)\n"
      "  -K, --per_iter_skip <n>     leave the first n iterations out of the -I statistics\n"
      "  -S, --report_timestamps <0/1> end every row with a timestamp (default 0)\n"
      "  -J, --output_file <f.json>  also write the results as one JSON document (rank 0)\n"
      "  -M, --memory <0/1>          report host memory use after the footer (default 0)\n"
      "  -u, --unalign <n>           buffers start n elements past their allocation (default 0)\n"
      "  -R, --local_register <0/1/2> register the buffers: 1 ncclCommRegister, 2\n"
      "                              ncclCommWindowRegister (falls back to 1 where unsupported)\n"
      "  -y, --stream_null <0/1>     accepted; every call uses the NULL stream on host memory\n"
      "  -p, --parallel_init <0/1>   accepted; ranks always initialize in parallel\n"
      "  -N, --run_cycles <n>        repeat the size sweep n times, 0 forever (default 1)\n"
      "  -T, --timeout <seconds>     give up (exit 124) after this long, 0 never (default 0)\n"
      "  -t, --nthreads <n>          must be 1 (one rank per process; use --np)\n"
      "  -g, --ngpus <n>             must be 1 (one rank per process; use --np)\n"
      "  -G, --cudagraph <n>         accepted, not applicable here (no CUDA graphs)\n"
      "  -x, --cta_policy <0/1/2>    accepted, not applicable here (no CTAs)\n"
      "  -D, --device_implementation <n> must be 0 (no device API implementations)\n"
      "  -V, --device_cta_count <n>  accepted, not applicable here (no CTAs)\n"
      "      --np <n>                ranks to start on this host when not under a launcher "
      "(default 2)\n"
      "      --plot <file.png>       after the run, draw busbw against size (needs matplotlib)\n"
      "      --compress <kind>       all_reduce through tuttiAllReduceCompressed: none, fp16, "
      "bf16,\n"
      "                              onebit or powersgd (float, sum/avg only; tutti only)\n"
      "      --powersgd-rank <r>     PowerSGD rank (default 4)\n"
      "      --mem <host|device>     buffers the operations run on (default host). device:\n"
      "                              ncclMemAlloc'd memory of tutti's backend\n"
      "                              (TUTTI_BACKEND_PLUGIN); inputs and checks go through\n"
      "                              host copies and tuttiMemcpy, outside the timed loop\n"
      "                              (tutti only)\n"
      "  -h, --help                  this text\n"
      "\n"
      "Under torchrun, mpirun or srun every launched process is one rank and --np is\n"
      "ignored; see docs/tutti-perf.md.\n",
      prog, typeNames().c_str());
}

ParseResult parseOptions(int argc, char** argv, Options* opts) {
  const char* prog = "tutti-perf";
  bool types_set = false;
  bool ops_set = false;
  bool step_factor_set = false;
  bool step_bytes_set = false;
  bool powersgd_rank_set = false;
  bool per_iter_skip_set = false;
  opts->args.assign(argv, argv + argc);
  opts->notes.clear();
  opterr = 0;
  optind = 1;
  int c;
  int longindex = -1;
  auto bad = [&](int key, const char* value, const char* expected) {
    std::fprintf(stderr, "%s: invalid value '%s' for %s: expected %s\n", prog, value,
                 flagName(key, kLongOpts).c_str(), expected);
    return ParseResult::kError;
  };
  // A flag accepted for nccl-tests' sake that means nothing on host memory:
  // rank 0 prints the note on stderr.
  auto notApplicable = [&](int key, const char* value, const char* why) {
    opts->notes.push_back(flagName(key, kLongOpts) + " " + value +
                          " accepted, not applicable here: " + why);
  };
  while ((c = getopt_long(argc, argv, kShortOpts, kLongOpts, &longindex)) != -1) {
    long v = 0;
    switch (c) {
      case 'h':
        printUsage(prog);
        return ParseResult::kHelp;
      case 't':
      case 'g':
        if (!parseLong(optarg, 1, 1 << 20, &v)) return bad(c, optarg, "a positive integer");
        if (v != 1) {
          std::fprintf(stderr,
                       "%s: %s %ld is not supported: tutti-perf runs one rank per process; use "
                       "--np %ld (or a launcher) for more ranks\n",
                       prog, flagName(c, kLongOpts).c_str(), v, v);
          return ParseResult::kError;
        }
        break;
      case 'b':
        if (!parseSize(optarg, &opts->min_bytes))
          return bad(c, optarg, "a size such as 8, 1K, 256M");
        break;
      case 'e':
        if (!parseSize(optarg, &opts->max_bytes))
          return bad(c, optarg, "a size such as 8, 1K, 256M");
        break;
      case 'i':
        if (!parseSize(optarg, &opts->step_bytes) || opts->step_bytes == 0)
          return bad(c, optarg, "a size > 0 such as 1M");
        step_bytes_set = true;
        break;
      case 'f':
        if (!parseLong(optarg, 1, 1 << 20, &v)) return bad(c, optarg, "an integer >= 1");
        opts->step_factor = static_cast<size_t>(v);
        step_factor_set = true;
        break;
      case 'n':
        if (!parseLong(optarg, 1, 1L << 30, &v)) return bad(c, optarg, "an integer >= 1");
        opts->iters = static_cast<int>(v);
        break;
      case 'w':
        if (!parseLong(optarg, 0, 1L << 30, &v)) return bad(c, optarg, "an integer >= 0");
        opts->warmup_iters = static_cast<int>(v);
        break;
      case 'm':
        if (!parseLong(optarg, 1, 1 << 20, &v)) return bad(c, optarg, "an integer >= 1");
        opts->agg_iters = static_cast<int>(v);
        break;
      case 'p':
        if (!parseLong(optarg, 0, 1, &v)) return bad(c, optarg, "0 or 1");
        opts->parallel_init = static_cast<int>(v);
        break;
      case 'y':
        if (!parseLong(optarg, 0, 1, &v)) return bad(c, optarg, "0 or 1");
        opts->stream_null = static_cast<int>(v);
        break;
      case 'C':
        if (!parseLong(optarg, 0, 1, &v)) return bad(c, optarg, "0 or 1");
        opts->report_cputime = static_cast<int>(v);
        break;
      case 'S':
        if (!parseLong(optarg, 0, 1, &v)) return bad(c, optarg, "0 or 1");
        opts->report_timestamps = static_cast<int>(v);
        break;
      case 'I':
        if (!parseLong(optarg, 0, 1, &v)) return bad(c, optarg, "0 or 1");
        opts->per_iter = static_cast<int>(v);
        break;
      case 'K':
        if (!parseLong(optarg, 0, 1L << 30, &v)) return bad(c, optarg, "an integer >= 0");
        opts->per_iter_skip = static_cast<int>(v);
        per_iter_skip_set = true;
        break;
      case 'M':
        if (!parseLong(optarg, 0, 1, &v)) return bad(c, optarg, "0 or 1");
        opts->memory_report = static_cast<int>(v);
        break;
      case 'u':
        if (!parseLong(optarg, 0, 1 << 20, &v))
          return bad(c, optarg, "an element count from 0 to 1048576");
        opts->unalign = static_cast<int>(v);
        break;
      case 'R':
        if (!parseLong(optarg, 0, 2, &v))
          return bad(c, optarg, "0 (none), 1 (local) or 2 (symmetric)");
        opts->local_register = static_cast<int>(v);
        break;
      case 'J':
        if (*optarg == '\0') return bad(c, optarg, "a file name ending in .json");
        opts->json_path = optarg;
        break;
      case kOptPlot:
        if (*optarg == '\0') return bad(c, optarg, "an image file name such as busbw.png");
        opts->plot_path = optarg;
        break;
      case 'x':
        if (!parseLong(optarg, 0, 2, &v)) return bad(c, optarg, "0, 1 or 2");
        notApplicable(c, optarg, "tutti has no CTAs on host memory");
        break;
      case 'V':
        if (!parseLong(optarg, 1, 128, &v)) return bad(c, optarg, "an integer from 1 to 128");
        notApplicable(c, optarg, "tutti has no device API implementations, hence no CTAs");
        break;
      case 'D':
        if (!parseLong(optarg, 0, 1 << 20, &v)) return bad(c, optarg, "0");
        if (v != 0) {
          std::fprintf(stderr,
                       "%s: -D/--device_implementation %ld is not supported: tutti has no device "
                       "API implementations; use -D 0 (NCCL's host API)\n",
                       prog, v);
          return ParseResult::kError;
        }
        break;
      case 'c':
        if (!parseLong(optarg, 0, 1L << 20, &v)) return bad(c, optarg, "a check count >= 0");
        opts->check = static_cast<int>(v);
        break;
      case 'z':
        if (!parseLong(optarg, 0, 3, &v)) return bad(c, optarg, "0, 1, 2 or 3");
        opts->blocking = static_cast<int>(v);
        break;
      case 'a':
        if (!parseLong(optarg, 0, 3, &v))
          return bad(c, optarg, "0 (rank 0), 1 (avg), 2 (min) or 3 (max)");
        opts->average = static_cast<int>(v);
        break;
      case 'r':
        if (!parseLong(optarg, -1, 1 << 24, &v))
          return bad(c, optarg, "a rank, or -1 for all ranks");
        opts->root = static_cast<int>(v);
        break;
      case 'N':
        if (!parseLong(optarg, 0, std::numeric_limits<long>::max(), &v))
          return bad(c, optarg, "an integer >= 0");
        opts->run_cycles = v;
        break;
      case 'T':
        if (!parseLong(optarg, 0, 1L << 30, &v)) return bad(c, optarg, "seconds >= 0");
        opts->timeout_s = static_cast<int>(v);
        break;
      case 'G':
        if (!parseLong(optarg, 0, 1 << 20, &v)) return bad(c, optarg, "an integer >= 0");
        if (v != 0) {
          notApplicable(c, optarg,
                        "there are no CUDA graphs on host memory; every call is launched "
                        "directly (the reported time per call means the same)");
        }
        break;
      case kOptNp:
        if (!parseLong(optarg, 1, 4096, &v)) return bad(c, optarg, "an integer from 1 to 4096");
        opts->np = static_cast<int>(v);
        opts->np_given = true;
        break;
      case kOptCompress:
        if (!parseCompress(optarg, &opts->compress))
          return bad(c, optarg, "none, fp16, bf16, onebit or powersgd");
        break;
      case kOptMem:
        if (std::strcmp(optarg, "host") == 0) {
          opts->mem = Mem::kHost;
        } else if (std::strcmp(optarg, "device") == 0) {
          opts->mem = Mem::kDevice;
        } else {
          return bad(c, optarg, "host or device");
        }
        break;
      case kOptPowerSgdRank:
        if (!parseLong(optarg, 1, 1 << 16, &v)) return bad(c, optarg, "an integer from 1 to 65536");
        opts->powersgd_rank = static_cast<int>(v);
        powersgd_rank_set = true;
        break;
      case 'd': {
        types_set = true;
        opts->types.clear();
        if (std::strcmp(optarg, "all") == 0) {
          opts->types = allTypes();
        } else {
          const TypeInfo* t = findType(optarg);
          if (t == nullptr) return bad(c, optarg, (typeNames() + " or all").c_str());
          opts->types.push_back(t);
        }
        break;
      }
      case 'o': {
        ops_set = true;
        opts->ops.clear();
        Op op;
        if (std::strcmp(optarg, "all") == 0) {
          opts->ops = allOps();
        } else if (parseOp(optarg, &op)) {
          opts->ops.push_back(op);
        } else {
          return bad(c, optarg, "sum, prod, max, min, avg, mulsum or all");
        }
        break;
      }
      case ':':
        std::fprintf(stderr, "%s: option %s needs a value; see %s -h\n", prog,
                     optopt ? flagName(optopt, kLongOpts).c_str() : argv[optind - 1], prog);
        return ParseResult::kError;
      case '?':
      default:
        if (optopt != 0) {
          std::fprintf(stderr, "%s: unknown option '-%c'; see %s -h\n", prog, optopt, prog);
        } else {
          std::fprintf(stderr, "%s: unknown option '%s'; see %s -h\n", prog, argv[optind - 1],
                       prog);
        }
        return ParseResult::kError;
    }
  }

  // The collective: the first positional argument, or the program's own name
  // when it is installed as (a link named) all_reduce_perf and the like.
  std::string base = argv[0] ? argv[0] : "";
  size_t slash = base.rfind('/');
  if (slash != std::string::npos) base = base.substr(slash + 1);
  const CollInfo* from_name = endsWith(base, "_perf") ? findColl(base) : nullptr;
  if (optind < argc) {
    opts->coll = findColl(argv[optind]);
    if (opts->coll == nullptr) {
      std::fprintf(stderr, "%s: unknown collective '%s': expected %s\n", prog, argv[optind],
                   kCollList);
      return ParseResult::kError;
    }
    if (optind + 1 < argc) {
      std::fprintf(stderr, "%s: unexpected argument '%s'; see %s -h\n", prog, argv[optind + 1],
                   prog);
      return ParseResult::kError;
    }
  } else if (from_name != nullptr) {
    opts->coll = from_name;
  } else {
    std::fprintf(stderr, "%s: no collective given; usage: %s <collective> [flags] (see -h)\n", prog,
                 prog);
    return ParseResult::kError;
  }

  if (!types_set) opts->types.push_back(findType("float"));
  if (!ops_set) opts->ops.push_back(Op::kSum);
  if (!opts->coll->has_op) opts->ops.assign(1, Op::kNone);
  if (opts->min_bytes > opts->max_bytes) {
    std::fprintf(stderr, "%s: -b/--minbytes (%zu) is larger than -e/--maxbytes (%zu)\n", prog,
                 opts->min_bytes, opts->max_bytes);
    return ParseResult::kError;
  }
  if (opts->compress != Compress::kOff) {
    // tuttiAllReduceCompressed: float32, sum or average, never inside a group.
    const char* kind = compressName(opts->compress);
    if (opts->coll->coll != Coll::kAllReduce) {
      std::fprintf(stderr,
                   "%s: --compress %s works with all_reduce only (tuttiAllReduceCompressed), not "
                   "%s\n",
                   prog, kind, opts->coll->name);
      return ParseResult::kError;
    }
    for (const TypeInfo* t : opts->types) {
      if (t->type != ncclFloat32) {
        std::fprintf(stderr,
                     "%s: --compress %s needs -d float (compressed all-reduce takes float32 "
                     "only), not %s\n",
                     prog, kind, opts->types.size() > 1 ? "-d all" : t->name);
        return ParseResult::kError;
      }
    }
    for (Op op : opts->ops) {
      if (op != Op::kSum && op != Op::kAvg) {
        std::fprintf(stderr,
                     "%s: --compress %s needs -o sum or -o avg (compressed all-reduce sums or "
                     "averages only), not %s\n",
                     prog, kind, opts->ops.size() > 2 ? "-o all" : opName(op));
        return ParseResult::kError;
      }
    }
    if (opts->agg_iters > 1) {
      std::fprintf(stderr,
                   "%s: --compress %s cannot be combined with -m/--agg_iters %d: "
                   "tuttiAllReduceCompressed is not allowed inside ncclGroupStart/End\n",
                   prog, kind, opts->agg_iters);
      return ParseResult::kError;
    }
  }
  if (per_iter_skip_set && (opts->per_iter_skip < 0 || opts->per_iter_skip >= opts->iters)) {
    std::fprintf(stderr,
                 "%s: -K/--per_iter_skip %d leaves no iteration for the statistics: expected 0 "
                 "to %d (-n/--iters %d)\n",
                 prog, opts->per_iter_skip, opts->iters - 1, opts->iters);
    return ParseResult::kError;
  }
  if (opts->per_iter_skip > 0 && !opts->per_iter) {
    // nccl-tests disables it too; say so instead of dropping it silently.
    opts->notes.push_back("-K/--per_iter_skip " + std::to_string(opts->per_iter_skip) +
                          " ignored: it applies to -I/--per_iter_timing 1 only");
    opts->per_iter_skip = 0;
  }
  if (!opts->json_path.empty() || !opts->plot_path.empty()) {
    const char* what = !opts->json_path.empty() ? "-J/--output_file" : "--plot";
    if (!haveJson()) {
      std::fprintf(stderr,
                   "%s: %s needs JSON support, and this tutti-perf was built without "
                   "nlohmann-json (apt-get install nlohmann-json3-dev, then re-run cmake)\n",
                   prog, what);
      return ParseResult::kError;
    }
  }
  if (!opts->json_path.empty()) {
    // nccl-tests tells the format from the suffix and knows only json.
    const std::string& j = opts->json_path;
    const size_t dot = j.rfind('.');
    const size_t slash = j.rfind('/');
    std::string ext = dot == std::string::npos || (slash != std::string::npos && slash > dot)
                          ? ""
                          : squash(j.substr(dot + 1));
    if (ext != "json") {
      std::fprintf(stderr,
                   "%s: -J/--output_file '%s': the output format comes from the suffix, and only "
                   ".json is supported\n",
                   prog, j.c_str());
      return ParseResult::kError;
    }
  }
  if (opts->coll->coll == Coll::kAllToAllv) {
    const char* matrix = std::getenv("NCCL_TESTS_ALLTOALLV_MATRIX_FILE");
    if (matrix != nullptr && *matrix != '\0') {
      std::fprintf(stderr,
                   "%s: alltoallv: NCCL_TESTS_ALLTOALLV_MATRIX_FILE (traffic matrix mode) is not "
                   "supported by tutti-perf; unset it for the generated pattern "
                   "(NCCL_TESTS_ALLTOALLV_SPREAD)\n",
                   prog);
      return ParseResult::kError;
    }
  }
  if (powersgd_rank_set && opts->compress != Compress::kPowerSGD) {
    std::fprintf(stderr, "%s: --powersgd-rank applies to --compress powersgd only\n", prog);
    return ParseResult::kError;
  }
  if (step_bytes_set && step_factor_set && opts->step_factor > 1) {
    std::fprintf(stderr, "%s: note: -f/--stepfactor %zu takes precedence over -i/--stepbytes\n",
                 prog, opts->step_factor);
  }
  return ParseResult::kOk;
}

}  // namespace tutti::perf
