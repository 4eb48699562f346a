#include "bench.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <string>
#include <type_traits>
#include <vector>

#ifdef TUTTI_PERF_HAVE_JSON
#include <nlohmann/json.hpp>
#endif

#if __has_include("tutti/tutti.h")
#include "tutti/tutti.h"
#define TUTTI_PERF_HAVE_TUTTI_H 1
#endif

namespace tutti::perf {
namespace {

RankContext g_ctx;  // for error reports

[[noreturn]] void ncclFailed(const char* expr, ncclResult_t res) {
  const char* last = ncclGetLastError(g_ctx.comm);
  std::fprintf(stderr, "tutti-perf: rank %d: %s failed: %s%s%s\n", g_ctx.rank, expr,
               ncclGetErrorString(res), (last && *last) ? ": " : "", last ? last : "");
  std::fflush(stdout);
  std::fflush(stderr);
  if (g_ctx.comm != nullptr) ncclCommAbort(g_ctx.comm);
  _exit(kExitError);
}

#define PERF_NCCL(call)                                         \
  do {                                                          \
    ncclResult_t perf_res_ = (call);                            \
    if (perf_res_ != ncclSuccess) ncclFailed(#call, perf_res_); \
  } while (0)

// ---- tutti's extensions, looked up at run time -----------------------------------
//
// tutti's own functions (tutti/tutti.h) are never linked: they are looked up
// at run time in the library that provides ncclCommInitRank to this process.
// With NVIDIA's libnccl (LD_PRELOAD, or a build against it) everything else
// works, and the flags that need tutti (--compress, --mem device) fail with a
// clear message instead of mixing two libraries.

// The object that defines ncclCommInitRank, and the symbols it defines itself.
class NcclLibrary {
 public:
  NcclLibrary() = default;
  NcclLibrary(const NcclLibrary&) = delete;
  NcclLibrary& operator=(const NcclLibrary&) = delete;
  // The library stays loaded (it provides ncclCommInitRank): symbols found
  // remain valid after this handle is closed.
  ~NcclLibrary() {
    if (handle_ != nullptr) dlclose(handle_);  // RTLD_NOLOAD took a reference
  }

  // Finds the library; false with *error set when it cannot be told or reopened.
  bool open(std::string* error) {
    void* init = dlsym(RTLD_DEFAULT, "ncclCommInitRank");
    if (init == nullptr || dladdr(init, &info_) == 0 || info_.dli_fname == nullptr) {
      *error = "cannot tell which library provides ncclCommInitRank (dladdr failed)";
      return false;
    }
    path_ = info_.dli_fname[0] ? info_.dli_fname : "the main program";
    // Its handle searches it and its own dependencies only (the main program
    // when tutti is linked statically).
    handle_ = dlopen(info_.dli_fname[0] ? info_.dli_fname : nullptr, RTLD_LAZY | RTLD_NOLOAD);
    if (handle_ == nullptr) {
      const char* why = dlerror();
      *error = "cannot reopen " + path_ + ": " + (why ? why : "?");
      return false;
    }
    return true;
  }

  // *fn = `name` as defined by the library itself (not by a dependency of
  // it), or nullptr; the first name not found is remembered in missing().
  template <class Fn>
  void find(const char* name, Fn* fn) {
    void* sym = handle_ != nullptr ? dlsym(handle_, name) : nullptr;
    Dl_info where{};
    if (sym == nullptr || dladdr(sym, &where) == 0 || where.dli_fbase != info_.dli_fbase) {
      if (missing_ == nullptr) missing_ = name;
      sym = nullptr;
    }
    *fn = reinterpret_cast<Fn>(sym);
  }

  const char* missing() const { return missing_; }
  const std::string& path() const { return path_; }

 private:
  Dl_info info_{};
  void* handle_ = nullptr;
  std::string path_;
  const char* missing_ = nullptr;
};

// ---- device memory (--mem device) -------------------------------------------------

// tuttiBackendName and tuttiMemcpy, declared here so that --mem device does
// not depend on tutti/tutti.h being on the include path.
struct MemApi {
  const char* (*backendName)(void) = nullptr;
  ncclResult_t (*memcpy)(void* dst, const void* src, size_t bytes) = nullptr;
};
#ifdef TUTTI_PERF_HAVE_TUTTI_H
static_assert(std::is_same_v<decltype(MemApi::backendName), decltype(&tuttiBackendName)> &&
                  std::is_same_v<decltype(MemApi::memcpy), decltype(&tuttiMemcpy)>,
              "MemApi follows tutti/tutti.h");
#endif

bool loadMemApi(MemApi* api, std::string* error) {
  NcclLibrary lib;
  if (!lib.open(error)) return false;
  lib.find("tuttiBackendName", &api->backendName);
  lib.find("tuttiMemcpy", &api->memcpy);
  if (lib.missing() != nullptr) {
    *error = "the NCCL library in use (" + lib.path() + ") does not provide " + lib.missing() +
             ": --mem device needs tutti's device backends (tutti/tutti.h), not NVIDIA's NCCL or "
             "an older tutti; use --mem host";
    return false;
  }
  return true;
}

// ---- compression (--compress) -------------------------------------------------
//
// tuttiAllReduceCompressed and its companions: looked up like the above.

#ifdef TUTTI_PERF_HAVE_TUTTI_H
struct CompressApi {
  decltype(&tuttiCompressorCreate) create = nullptr;
  decltype(&tuttiCompressorDestroy) destroy = nullptr;
  decltype(&tuttiAllReduceCompressed) allReduce = nullptr;
  decltype(&tuttiCompressorGetStats) getStats = nullptr;
};

bool loadCompressApi(CompressApi* api, std::string* error) {
  NcclLibrary lib;
  if (!lib.open(error)) return false;
  lib.find("tuttiCompressorCreate", &api->create);
  lib.find("tuttiCompressorDestroy", &api->destroy);
  lib.find("tuttiAllReduceCompressed", &api->allReduce);
  lib.find("tuttiCompressorGetStats", &api->getStats);
  if (lib.missing() != nullptr) {
    *error = "the NCCL library in use (" + lib.path() + ") does not provide " + lib.missing() +
             ": --compress needs tutti with gradient compression (tutti/tutti.h), not NVIDIA's "
             "NCCL or an older tutti";
    return false;
  }
  return true;
}

tuttiCompression_t compressKind(Compress c) {
  switch (c) {
    case Compress::kFp16:
      return tuttiCompressFp16;
    case Compress::kBf16:
      return tuttiCompressBf16;
    case Compress::kOneBit:
      return tuttiCompressOneBit;
    case Compress::kPowerSGD:
      return tuttiCompressPowerSGD;
    default:
      return tuttiCompressNone;
  }
}
#else
struct CompressApi {};
#endif

// One size's compressed all-reduce: the compressor created for it and the
// gradient key and PowerSGD shape every call of that size uses.
struct CompressCall {
  const CompressApi* api = nullptr;
  void* compressor = nullptr;  // tuttiCompressor_t
  unsigned long long key = 1;
  size_t rows = 0;
  size_t cols = 0;
};

// The most square rows x cols == count (rows <= cols): 4096 x 4096 for 16 Mi
// elements. A prime count gives 1 x count, which PowerSGD runs exact.
void squareShape(size_t count, size_t* rows, size_t* cols) {
  if (count == 0) {
    *rows = *cols = 0;
    return;
  }
  size_t r = static_cast<size_t>(std::sqrt(static_cast<double>(count)));
  while (r > 1 && r * r > count) --r;
  while ((r + 1) * (r + 1) <= count) ++r;
  while (r > 1 && count % r != 0) --r;
  *rows = r;
  *cols = count / r;
}

// ---- sizes and bandwidth ------------------------------------------------------

// Element counts of one operation, following nccl-tests: `count` is the
// requested size in elements; send/recv are the buffer lengths, param the
// count passed to the API, and *_inplace the offset (times rank) of the send
// or receive pointer inside the single in-place buffer.
struct Counts {
  size_t send = 0;
  size_t recv = 0;
  size_t param = 0;
  size_t send_inplace = 0;
  size_t recv_inplace = 0;
};

// alltoallv's generated pattern (nccl-tests): the bytes rank `from` sends to
// rank `to` out of `total`, blending an even split (spread 0) with one in
// proportion to the distance (to - from) mod n (spread 1, the default), in
// multiples of 16 bytes. Every rank sends and receives the same total.
size_t alltoallvPeerBytes(int from, int to, int n, size_t total, double spread) {
  if (n == 1) return total & ~size_t{15};
  const int distance = (to - from + n) % n;
  const double even = static_cast<double>(total) / n;
  const double weighted =
      distance * static_cast<double>(total) / (static_cast<double>(n) * (n - 1) / 2);
  const double bytes = (1 - spread) * even + spread * weighted;
  return static_cast<size_t>(bytes) & ~size_t{15};
}

Counts countsFor(Coll coll, size_t count, int n, size_t elt, double spread) {
  Counts k;
  const size_t base = count / static_cast<size_t>(n);
  // alltoallv and hypercube round the per-rank count down to 16 bytes.
  const size_t base16 = base & ~(16 / elt - 1);
  switch (coll) {
    case Coll::kAllToAllv: {
      k.param = base16;
      const size_t total = base16 * n * elt;
      size_t mine = 0;
      for (int to = 0; to < n; ++to) mine += alltoallvPeerBytes(0, to, n, total, spread) / elt;
      k.send = k.recv = mine;
      break;
    }
    case Coll::kHyperCube:
      k.send = k.param = base16;
      k.recv = base16 * n;
      k.send_inplace = base16;
      break;
    case Coll::kAllReduce:
    case Coll::kBroadcast:
    case Coll::kReduce:
    case Coll::kSendRecv:
      k.send = k.recv = k.param = count;
      break;
    case Coll::kAllGather:
    case Coll::kGather:
      k.send = k.param = base;
      k.recv = base * n;
      k.send_inplace = base;
      break;
    case Coll::kReduceScatter:
    case Coll::kScatter:
      k.send = base * n;
      k.recv = k.param = base;
      k.recv_inplace = base;
      break;
    case Coll::kAllToAll:
      k.send = k.recv = base * n;
      k.param = base;
      break;
  }
  return k;
}

// busbw = algbw * factor, algbw = size / time with size as printed.
double busFactor(Coll coll, int n) {
  const double nr = n;
  switch (coll) {
    case Coll::kAllReduce:
      return 2 * (nr - 1) / nr;
    case Coll::kAllGather:
    case Coll::kReduceScatter:
    case Coll::kAllToAll:
    case Coll::kAllToAllv:
    case Coll::kGather:
    case Coll::kScatter:
      return (nr - 1) / nr;
    case Coll::kBroadcast:
    case Coll::kReduce:
    case Coll::kSendRecv:
    case Coll::kHyperCube:
      return 1;
  }
  return 1;
}

// The bytes algbw counts: the size as printed, except for hypercube, where
// nccl-tests counts what each rank receives, (n-1) blocks of param elements.
double algBytes(Coll coll, const Counts& k, size_t elt, int n) {
  if (coll == Coll::kHyperCube) return static_cast<double>(k.param * elt) * (n - 1);
  return static_cast<double>(std::max(k.send, k.recv) * elt);
}

bool isReduction(Coll coll) {
  return coll == Coll::kAllReduce || coll == Coll::kReduceScatter || coll == Coll::kReduce;
}

// ---- data patterns -----------------------------------------------------------

uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The values rank r holds at element i. Data-movement collectives get
// pseudo-random bit patterns (compared bit for bit); reductions get small
// integers chosen per operator so that every partial result, in any order, is
// exactly representable in the datatype (fp8 included), so results are exact.
class Pattern {
 public:
  Pattern(const TypeInfo& t, Op op, int n, uint64_t seed) : t_(t), op_(op), n_(n), seed_(seed) {
    uint64_t one = 1;
    tiny_ = t.is_float ? decodeValue(t, &one) : 0;
  }

  uint64_t hash(int rank, size_t i) const {
    return mix64(seed_ ^ (static_cast<uint64_t>(rank) << 48) ^ (i * 0xD1B54A32D192ED03ull));
  }

  void raw(int rank, size_t i, void* dst) const {
    uint64_t h = hash(rank, i);
    std::memcpy(dst, &h, t_.size);
  }

  double scalar(int rank) const { return op_ == Op::kPreMulSum ? 1 + (rank & 1) : 1; }

  double value(int rank, size_t i) const {
    const uint64_t h = hash(rank, i);
    const int64_t k = t_.max_exact;
    switch (op_) {
      case Op::kSum:
      case Op::kAvg:
        return bounded(k / n_, k, h, rank, i);
      case Op::kPreMulSum:  // scalars are 1 or 2
        return bounded(k / (2 * n_), k / 2, h, rank, i);
      case Op::kProd: {
        const size_t twos = static_cast<size_t>(std::min(n_, t_.max_pow2));
        if ((i + rank) % n_ < twos && (h & 1)) return 2;
        if (t_.is_signed && ((h >> 8) & 3) == 0) return -1;
        return 1;
      }
      case Op::kMax:
      case Op::kMin:
      case Op::kNone:
        break;
    }
    return bounded(std::min<int64_t>(k, 1000), k, h, rank, i);
  }

  // The reduction over all ranks of element i.
  double expected(size_t i) const {
    double acc = 0;
    for (int r = 0; r < n_; ++r) {
      const double v = value(r, i);
      switch (op_) {
        case Op::kProd:
          acc = r == 0 ? v : acc * v;
          break;
        case Op::kMax:
          acc = r == 0 ? v : std::max(acc, v);
          break;
        case Op::kMin:
          acc = r == 0 ? v : std::min(acc, v);
          break;
        default:
          acc += scalar(r) * v;
      }
    }
    if (op_ == Op::kAvg) acc = t_.is_float ? acc / n_ : std::trunc(acc / n_);
    return acc;
  }

  // sum_r |scalar_r * value_r(i)|, over n for an average: the scale of the
  // rounding errors a lossy wire format makes in element i.
  double absSum(size_t i) const {
    double acc = 0;
    for (int r = 0; r < n_; ++r) acc += std::fabs(scalar(r) * value(r, i));
    return op_ == Op::kAvg ? acc / n_ : acc;
  }

  // Only a floating-point average may be inexact (1/n premultiplication).
  double tolerance(size_t i, double expected) const {
    if (op_ != Op::kAvg || !t_.is_float) return 0;
    double abs_avg = 0;
    for (int r = 0; r < n_; ++r) abs_avg += std::fabs(value(r, i));
    abs_avg /= n_;
    return (n_ + 2) * roundoff(t_) * std::max(abs_avg, std::fabs(expected)) + n_ * tiny_;
  }

 private:
  // A value in [-b, b] ([0, b] unsigned); with b == 0 (more ranks than the
  // type has exact integers) exactly `ones` ranks hold 1 and the rest 0.
  double bounded(int64_t b, int64_t ones, uint64_t h, int rank, size_t i) const {
    if (b >= 1) {
      if (t_.is_signed) return static_cast<double>(static_cast<int64_t>(h % (2 * b + 1)) - b);
      return static_cast<double>(h % (b + 1));
    }
    return (i + rank) % n_ < static_cast<size_t>(ones) ? 1 : 0;
  }

  const TypeInfo& t_;
  Op op_;
  int n_;
  uint64_t seed_;
  double tiny_ = 0;
};

void fillGarbage(const TypeInfo& t, char* buf, size_t elems) {
  // All-ones is NaN in every floating type; integers get 0xA5 bytes.
  std::memset(buf, t.is_float ? 0xFF : 0xA5, elems * t.size);
}

void fillSend(bool reduction, const Pattern& p, const TypeInfo& t, int rank, char* buf,
              size_t elems) {
  for (size_t i = 0; i < elems; ++i) {
    if (reduction) {
      encodeValue(t, p.value(rank, i), buf + i * t.size);
    } else {
      p.raw(rank, i, buf + i * t.size);
    }
  }
}

std::string hexBytes(const char* p, size_t n) {
  std::string s = "0x";
  char b[4];
  for (size_t i = n; i-- > 0;) {  // little-endian: most significant byte first
    std::snprintf(b, sizeof(b), "%02x", static_cast<unsigned char>(p[i]));
    s += b;
  }
  return s;
}

// What a compressed all-reduce is timed on: float32 values in [-1, 1),
// different on every rank, like a gradient (the codecs' cost does not depend
// on the values, but zeros would make 1-bit's scales and PowerSGD's factors
// degenerate).
void fillGradient(float* buf, size_t elems, int rank, uint64_t salt) {
  const uint64_t seed = mix64(salt ^ (static_cast<uint64_t>(rank) << 40));
  for (size_t i = 0; i < elems; ++i) {
    const uint64_t h = mix64(seed + i);
    buf[i] = static_cast<float>(static_cast<double>(h >> 40) * (2.0 / 16777216.0) - 1.0);
  }
}

// A hash of a result's bytes, to compare results across ranks bit for bit.
uint64_t hashBytes(const char* p, size_t n) {
  uint64_t h = 0xCBF29CE484222325ull;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    std::memcpy(&w, p + i, 8);
    h = (h ^ w) * 0x100000001B3ull;
    h ^= h >> 29;
  }
  for (; i < n; ++i) h = (h ^ static_cast<unsigned char>(p[i])) * 0x100000001B3ull;
  return mix64(h ^ n);
}

// ---- the run ------------------------------------------------------------------

struct Case {
  const CollInfo* coll;
  const TypeInfo* type;
  Op op;
  ncclRedOp_t nccl_op;
  int root;
  const CompressCall* z = nullptr;  // all_reduce through tuttiAllReduceCompressed
  double spread = 1;                // alltoallv's NCCL_TESTS_ALLTOALLV_SPREAD
  // hypercube's local copy: tuttiMemcpy with --mem device, else memcpy.
  ncclResult_t (*copy)(void* dst, const void* src, size_t bytes) = nullptr;
};

ncclRedOp_t builtinOp(Op op) {
  switch (op) {
    case Op::kProd:
      return ncclProd;
    case Op::kMax:
      return ncclMax;
    case Op::kMin:
      return ncclMin;
    case Op::kAvg:
      return ncclAvg;
    default:
      return ncclSum;
  }
}

void launch(const Case& c, const RankContext& ctx, const void* send, void* recv, size_t count) {
  cudaStream_t stream{};
  const ncclDataType_t dt = c.type->type;
  switch (c.coll->coll) {
    case Coll::kAllReduce:
#ifdef TUTTI_PERF_HAVE_TUTTI_H
      if (c.z != nullptr) {
        ncclResult_t res = c.z->api->allReduce(send, recv, count, dt, c.nccl_op,
                                               static_cast<tuttiCompressor_t>(c.z->compressor),
                                               c.z->key, c.z->rows, c.z->cols, stream);
        if (res != ncclSuccess) ncclFailed("tuttiAllReduceCompressed", res);
        break;
      }
#endif
      PERF_NCCL(ncclAllReduce(send, recv, count, dt, c.nccl_op, ctx.comm, stream));
      break;
    case Coll::kAllGather:
      PERF_NCCL(ncclAllGather(send, recv, count, dt, ctx.comm, stream));
      break;
    case Coll::kReduceScatter:
      PERF_NCCL(ncclReduceScatter(send, recv, count, dt, c.nccl_op, ctx.comm, stream));
      break;
    case Coll::kBroadcast:
      PERF_NCCL(ncclBroadcast(send, recv, count, dt, c.root, ctx.comm, stream));
      break;
    case Coll::kReduce:
      PERF_NCCL(ncclReduce(send, recv, count, dt, c.nccl_op, c.root, ctx.comm, stream));
      break;
    case Coll::kAllToAll:
      PERF_NCCL(ncclAlltoAll(send, recv, count, dt, ctx.comm, stream));
      break;
    case Coll::kGather:
      PERF_NCCL(ncclGather(send, recv, count, dt, c.root, ctx.comm, stream));
      break;
    case Coll::kScatter:
      PERF_NCCL(ncclScatter(send, recv, count, dt, c.root, ctx.comm, stream));
      break;
    case Coll::kSendRecv: {
      const int next = (ctx.rank + 1) % ctx.nranks;
      const int prev = (ctx.rank + ctx.nranks - 1) % ctx.nranks;
      PERF_NCCL(ncclGroupStart());
      PERF_NCCL(ncclSend(send, count, dt, next, ctx.comm, stream));
      PERF_NCCL(ncclRecv(recv, count, dt, prev, ctx.comm, stream));
      PERF_NCCL(ncclGroupEnd());
      break;
    }
    case Coll::kAllToAllv: {
      // count is the per-peer count; each peer's share follows the pattern,
      // packed in rank order in both buffers.
      const size_t elt = c.type->size;
      const int n = ctx.nranks;
      const size_t total = count * n * elt;
      const char* sp = static_cast<const char*>(send);
      char* rp = static_cast<char*>(recv);
      PERF_NCCL(ncclGroupStart());
      for (int peer = 0; peer < n; ++peer) {
        const size_t sc = alltoallvPeerBytes(ctx.rank, peer, n, total, c.spread) / elt;
        const size_t rc = alltoallvPeerBytes(peer, ctx.rank, n, total, c.spread) / elt;
        if (sc > 0) PERF_NCCL(ncclSend(sp, sc, dt, peer, ctx.comm, stream));
        if (rc > 0) PERF_NCCL(ncclRecv(rp, rc, dt, peer, ctx.comm, stream));
        sp += sc * elt;
        rp += rc * elt;
      }
      PERF_NCCL(ncclGroupEnd());
      break;
    }
    case Coll::kHyperCube: {
      // An all-gather: the own block goes to its place, then log2(n) rounds
      // each swap everything gathered so far with the rank that differs in
      // one bit (n is a power of two).
      const size_t block = count * c.type->size;
      char* rb = static_cast<char*>(recv);
      char* mine = rb + static_cast<size_t>(ctx.rank) * block;
      if (mine != send && block > 0) {
        if (c.copy != nullptr) {
          ncclResult_t res = c.copy(mine, send, block);
          if (res != ncclSuccess) ncclFailed("tuttiMemcpy", res);
        } else {
          std::memcpy(mine, send, block);
        }
      }
      for (int mask = 1; mask < ctx.nranks; mask <<= 1) {
        const int have = ctx.rank & ~(mask - 1);
        const int get = have ^ mask;
        PERF_NCCL(ncclGroupStart());
        PERF_NCCL(ncclSend(rb + have * block, count * mask, dt, ctx.rank ^ mask, ctx.comm, stream));
        PERF_NCCL(ncclRecv(rb + get * block, count * mask, dt, ctx.rank ^ mask, ctx.comm, stream));
        PERF_NCCL(ncclGroupEnd());
      }
      break;
    }
  }
}

void barrier(const RankContext& ctx) {
  if (ctx.nranks == 1) return;
  int32_t v = 0;
  cudaStream_t stream{};
  PERF_NCCL(ncclAllReduce(&v, &v, 1, ncclInt32, ncclSum, ctx.comm, stream));
}

// nccl-tests' number format: as many decimals as fit in `width`.
std::string fmtNum(double v, int width) {
  int digits = 0;
  for (double p = 1; v >= p && digits < 40; p *= 10) ++digits;
  char buf[64];
  if (digits < width - 2) {
    std::snprintf(buf, sizeof(buf), "%*.2f", width, v);
  } else if (digits < width - 1) {
    std::snprintf(buf, sizeof(buf), "%*.1f", width, v);
  } else if (digits < width + 1) {
    std::snprintf(buf, sizeof(buf), "%*.0f", width, v);
  } else {
    std::snprintf(buf, sizeof(buf), "%*.1e", width, v);
  }
  return buf;
}

// Host buffers (posix_memalign): with --mem host the operations run on them;
// with --mem device they are the host shadows where inputs are generated and
// results checked, and dev_send/dev_recv (ncclMemAlloc, same size) are what
// the operations run on. Device memory is only ever passed to tutti (the
// collectives, tuttiMemcpy, ncclMemFree), never read or written here.
//
// -u N: send/recv/dev_send/dev_recv start N elements (of the datatype being
// run) past the *_alloc pointers, which are allocated 8 N bytes larger.
struct Buffers {
  char* send = nullptr;
  char* recv = nullptr;
  char* dev_send = nullptr;
  char* dev_recv = nullptr;
  size_t bytes = 0;        // usable bytes from send/recv
  size_t alloc_bytes = 0;  // allocated bytes from *_alloc
  char* send_alloc = nullptr;
  char* recv_alloc = nullptr;
  char* dev_send_alloc = nullptr;
  char* dev_recv_alloc = nullptr;
  Buffers() = default;
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
  ~Buffers() {
    std::free(send_alloc);
    std::free(recv_alloc);
    if (dev_send_alloc != nullptr) ncclMemFree(dev_send_alloc);
    if (dev_recv_alloc != nullptr) ncclMemFree(dev_recv_alloc);
  }
  void shift(size_t off) {
    send = send_alloc + off;
    recv = recv_alloc + off;
    if (dev_send_alloc != nullptr) dev_send = dev_send_alloc + off;
    if (dev_recv_alloc != nullptr) dev_recv = dev_recv_alloc + off;
  }
};

// The size after `size` in the sweep: times -f, else plus -i; 0 once that
// would overflow (a real next size is never 0).
size_t nextSize(const Options& o, size_t size) {
  const size_t next =
      o.step_factor > 1 ? (size == 0 ? 1 : size * o.step_factor) : size + o.step_bytes;
  return next <= size ? 0 : next;
}

// One half (out-of-place or in-place) of a row, for the table and -J.
struct HalfResult {
  double time_us = 0;
  double algbw = 0;
  double busbw = 0;
  bool checked = false;
  int64_t wrong = 0;
  // -I: statistics over the iterations after -K, of the per-iteration
  // maximum over ranks; iter_us holds every iteration, per_rank_us each rank's.
  bool has_iter = false;
  double i_min = 0, i_max = 0, i_avg = 0, i_p50 = 0, i_p95 = 0, i_p99 = 0, i_stdev = 0, i_cv = 0;
  std::vector<double> iter_us;
  std::vector<std::vector<double>> per_rank_us;
};

// What timeOps measured.
struct Timing {
  double sec = 0;                // per operation, combined across ranks (-a)
  std::vector<double> iter_sec;  // -I: each outer iteration per operation, this rank
};

// The peak resident set size of this process (VmHWM in /proc/self/status;
// residentBytes() is the current one); 0 when unknown.
long long residentPeak() {
  std::ifstream f("/proc/self/status");
  std::string key;
  while (f >> key) {
    if (key == "VmHWM:") {
      long long kb = 0;
      f >> kb;
      return kb * 1024;
    }
    std::getline(f, key);
  }
  return 0;
}

// nccl-tests' memory figures: B, KB, MB, GB (powers of 1024), 2 decimals
// under 10, 1 under 100, else none.
std::string memString(long long bytes) {
  double v = static_cast<double>(bytes);
  const char* unit = " B";
  if (std::fabs(v) >= 1024.0 * 1024 * 1024) {
    v /= 1024.0 * 1024 * 1024;
    unit = " GB";
  } else if (std::fabs(v) >= 1024.0 * 1024) {
    v /= 1024.0 * 1024;
    unit = " MB";
  } else if (std::fabs(v) >= 1024.0) {
    v /= 1024.0;
    unit = " KB";
  }
  const int decimals = std::fabs(v) < 10 ? 2 : std::fabs(v) < 100 ? 1 : 0;
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.*f%s", decimals, v, unit);
  return buf;
}

// "%Y-%m-%d %H:%M:%S", local time: -S's timestamps and -J's start/end times.
std::string nowString() {
  char buf[64];
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  std::strftime(buf, sizeof(buf), "%Y-%m-%d %H:%M:%S", &tm);
  return buf;
}

// -I's statistics (nccl-tests): p99 is the nearest-rank percentile, the
// standard deviation is the population one, cv% = stdev / mean * 100.
void iterStats(std::vector<double> v, HalfResult* h) {
  if (v.empty()) return;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  auto pct = [&](size_t p) { return v[std::min(n - 1, (n * p + 99) / 100 - 1)]; };
  double sum = 0;
  for (double x : v) sum += x;
  const double avg = sum / n;
  double var = 0;
  for (double x : v) var += (x - avg) * (x - avg);
  h->has_iter = true;
  h->i_min = v.front();
  h->i_max = v.back();
  h->i_avg = avg;
  h->i_p50 = v[n / 2];
  h->i_p95 = pct(95);
  h->i_p99 = pct(99);
  h->i_stdev = std::sqrt(var / n);
  h->i_cv = avg > 0 ? h->i_stdev / avg * 100 : 0;
}

class Runner {
 public:
  Runner(const Options& opts, const RankContext& ctx) : opts_(opts), ctx_(ctx) {}

  int run();

 private:
  void printDevices();
  void printHeader();
  void runCase(const Case& c);
  // Times one size: seconds per operation combined across ranks (-a), and
  // with -I each iteration's.
  Timing timeOps(const Case& c, const void* send, void* recv, size_t count);
  // -I: the per-iteration maximum over ranks and its statistics (rank 0).
  void gatherIterations(const Timing& t, HalfResult* h);
  // One checked call on fresh data (rep tells -c's calls apart); the wrong
  // elements summed over ranks.
  int64_t checkOnce(const Case& c, size_t size, bool in_place, const Counts& k, int rep);
  // nccl-tests' warm-up: -w calls at every size from -b to -e, doubling.
  void warmup(const Case& c);
  Counts counts(const Case& c, size_t size) const {
    return countsFor(c.coll->coll, size / elem_, ctx_.nranks, elem_, c.spread);
  }
  // -R: registers the buffers the operations run on (reg_note_ says how).
  void registerBuffers();
  void deregisterBuffers();
  void printRow(const Case& c, size_t bytes, const Counts& k, const HalfResult half[2],
                const std::string& wire, const std::string& stamp);
  void progress(size_t bytes, const Case& c);
  // -J (rank 0): the document is built during the run and written at the end.
  bool openJson();
  void jsonRow(const Case& c, size_t bytes, const Counts& k, const HalfResult half[2], double wire);
  void finishJson(double avg_bw, double min_bw);
  // --compress: one compressor per size (created, warmed up with -w calls,
  // destroyed after the size's row), and the data the timed calls reduce.
  void createCompressor(size_t count, CompressCall* z);
  void destroyCompressor(CompressCall* z);
  void prepareCompressedData(bool in_place, const Counts& k);
  // The wire ratio column (every rank calls it; -1 when nothing was sent),
  // and on rank 0 a note when calls ran exact.
  double wireRatio(const CompressCall& z, size_t bytes, std::string* note);
  // The buffers the operations run on: device memory with --mem device.
  char* opSend() const { return device_ ? buf_.dev_send : buf_.send; }
  char* opRecv() const { return device_ ? buf_.dev_recv : buf_.recv; }
  // The send and receive pointers of one operation, in the buffers the
  // operations run on (sendPtr/recvPtr) or in the host buffers (host*Ptr):
  // the same offsets in both.
  size_t sendOffset(bool in_place, const Counts& k) const {
    return in_place ? k.send_inplace * ctx_.rank * elem_ : 0;
  }
  size_t recvOffset(bool in_place, const Counts& k) const {
    return in_place ? k.recv_inplace * ctx_.rank * elem_ : 0;
  }
  const void* sendPtr(bool in_place, const Counts& k) const {
    return (in_place ? opRecv() : opSend()) + sendOffset(in_place, k);
  }
  void* recvPtr(bool in_place, const Counts& k) const { return opRecv() + recvOffset(in_place, k); }
  char* hostSendPtr(bool in_place, const Counts& k) const {
    return (in_place ? buf_.recv : buf_.send) + sendOffset(in_place, k);
  }
  char* hostRecvPtr(bool in_place, const Counts& k) const {
    return buf_.recv + recvOffset(in_place, k);
  }
  // --mem device: copies `bytes` at offset `off` of a host buffer to the same
  // offset of its device twin, or back (download). No-ops with --mem host.
  void upload(char* host, size_t off, size_t bytes);
  void download(char* host, size_t off, size_t bytes);
  void copyOrFail(void* dst, const void* src, size_t bytes);
  int allocDeviceBuffers();

  const Options& opts_;
  const RankContext& ctx_;
  const bool compress_ = opts_.compress != Compress::kOff;
  const bool device_ = opts_.mem == Mem::kDevice;
  CompressApi api_;
  MemApi mem_;
  const char* backend_ = "host";  // tuttiBackendName() with --mem device
  Buffers buf_;
  size_t elem_ = 1;
  int failed_results_ = 0;
  double bw_sum_ = 0;
  long bw_count_ = 0;
  int mismatch_reports_ = 0;
  // -R: the registration handles, and how they were made.
  void* reg_send_ = nullptr;
  void* reg_recv_ = nullptr;
  ncclWindow_t win_send_ = nullptr;
  ncclWindow_t win_recv_ = nullptr;
  std::string reg_note_;
  // -M: resident bytes after init (at the start of run) and after the buffers.
  long long rss_after_init_ = 0;
  long long rss_after_buffers_ = 0;
  // Progress on stderr (rank 0): rows done of rows_total (0: -N 0, forever).
  int progress_mode_ = 0;  // 0 off, 1 after a few seconds, 2 every row
  long rows_done_ = 0;
  long rows_total_ = 0;
  std::chrono::steady_clock::time_point progress_start_{};
  std::chrono::steady_clock::time_point progress_last_{};
  int rep_ = 0;  // -c: a different data seed for every checked call
#ifdef TUTTI_PERF_HAVE_JSON
  nlohmann::ordered_json json_;
  std::FILE* json_fp_ = nullptr;
#endif
};

void Runner::printDevices() {
  struct RankInfo {
    int32_t rank;
    int32_t pid;
    int32_t local_rank;
    int32_t device;  // ncclCommCuDevice: the device the communicator is bound to
    char host[80];
    char backend[32];  // --mem device: tuttiBackendName(); else empty
  };
  static_assert(sizeof(RankInfo) == 128, "RankInfo is sent as bytes");
  std::vector<RankInfo> all(ctx_.nranks);
  RankInfo me{};
  me.rank = ctx_.rank;
  me.pid = static_cast<int32_t>(getpid());
  me.local_rank = ctx_.local_rank;
  if (ncclCommCuDevice(ctx_.comm, &me.device) != ncclSuccess) me.device = -1;
  gethostname(me.host, sizeof(me.host) - 1);
  if (device_) std::snprintf(me.backend, sizeof(me.backend), "%s", backend_);
  if (ctx_.nranks > 1) {
    std::vector<RankInfo> send(1, me);
    cudaStream_t stream{};
    PERF_NCCL(
        ncclAllGather(send.data(), all.data(), sizeof(RankInfo), ncclUint8, ctx_.comm, stream));
  } else {
    all[0] = me;
  }
  if (ctx_.rank != 0) return;
  std::printf("# Using devices\n");
  for (const RankInfo& r : all) {
    if (r.backend[0] != '\0') {
      std::printf("#  Rank %2d Group %2d Pid %6d on %10s device %2d [%s] %s device memory\n",
                  r.rank, 0, r.pid, r.host, r.device, r.backend, r.backend);
    } else {
      std::printf("#  Rank %2d Group %2d Pid %6d on %10s device %2d [host] host memory\n", r.rank,
                  0, r.pid, r.host, r.device);
    }
#ifdef TUTTI_PERF_HAVE_JSON
    if (json_fp_ != nullptr) {
      const bool dev = r.backend[0] != '\0';
      json_["config"]["devices"].push_back(
          {{"rank", r.rank},
           {"group", 0},
           {"pid", r.pid},
           {"hostname", r.host},
           {"device", r.device},
           {"device_hex", dev ? r.backend : "host"},
           {"device_info", dev ? std::string(r.backend) + " device memory" : "host memory"}});
    }
#endif
  }
  std::printf("#\n");
  std::fflush(stdout);
}

void Runner::printHeader() {
  if (ctx_.rank != 0) return;
  if (!reg_note_.empty()) std::printf("# Registration: %s\n#\n", reg_note_.c_str());
  const char* time_name = opts_.report_cputime ? "cputime" : "time";
  const bool iter = opts_.per_iter != 0;
  const bool stamps = opts_.report_timestamps != 0;
  if (!iter) {
    std::printf(
        "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place        "
        "  \n",
        "", "", "", "", "");
  } else {
    // Each half is 68 characters wide with -I: the titles centred over them.
    std::printf("# %10s  %12s  %8s  %6s  %6s  %-66s  %-66s\n", "", "", "", "", "",
                "                 out-of-place (+ per-iteration)",
                "                   in-place (+ per-iteration)");
  }
  // The 13 columns of nccl-tests; -I adds four after each half, --compress
  // the wire ratio and -S a timestamp at the end.
  std::string names, units;
  char buf[256];
  for (int half = 0; half < 2; ++half) {
    std::snprintf(buf, sizeof(buf), "  %7s  %6s  %6s %6s", time_name, "algbw", "busbw", "#wrong");
    names += buf;
    std::snprintf(buf, sizeof(buf), "  %7s  %6s  %6s  %5s", "(us)", "(GB/s)", "(GB/s)", "");
    units += buf;
    if (iter) {
      std::snprintf(buf, sizeof(buf), "  %7s  %7s  %7s  %7s", "i_min", "i_max", "i_p99", "i_cv%");
      names += buf;
      std::snprintf(buf, sizeof(buf), "  %7s  %7s  %7s  %7s", "(us)", "(us)", "(us)", "(%)");
      units += buf;
    }
  }
  if (compress_) {
    names += "     wire";  // the wire ratio: payload / wire bytes
    units += "      (x)";
  }
  if (stamps) {
    std::snprintf(buf, sizeof(buf), "  %19s", "timestamp");
    names += buf;
    std::snprintf(buf, sizeof(buf), "  %19s", "%Y-%m-%d %H:%M:%S");
    units += buf;
  }
  std::printf("# %10s  %12s  %8s  %6s  %6s%s\n", "size", "count", "type", "redop", "root",
              names.c_str());
  std::printf("# %10s  %12s  %8s  %6s  %6s%s\n", "(B)", "(elements)", "", "", "", units.c_str());
  std::fflush(stdout);
}

Timing Runner::timeOps(const Case& c, const void* send, void* recv, size_t count) {
  using Clock = std::chrono::steady_clock;
  Timing t;
  if (opts_.per_iter) t.iter_sec.assign(static_cast<size_t>(opts_.iters), 0.0);
  const bool group = opts_.agg_iters > 1;
  barrier(ctx_);
  double coll_only = 0;  // -z 3: the iterations without their barriers
  // Only -I and -z 3 read the clock per iteration: two clock reads are tens
  // of nanoseconds, a visible share of a sub-microsecond operation, so the
  // default loop reads it only around the whole loop (as nccl-tests does).
  const bool per_iteration_clock = opts_.per_iter != 0 || opts_.blocking == 3;
  const auto t0 = Clock::now();
  for (int it = 0; it < opts_.iters; ++it) {
    const auto i0 = per_iteration_clock ? Clock::now() : t0;
    if (group) PERF_NCCL(ncclGroupStart());
    for (int a = 0; a < opts_.agg_iters; ++a) {
      launch(c, ctx_, send, recv, count);
      // -z 1: a barrier after each inner iteration; inside a group there is
      // nothing to wait for until ncclGroupEnd, so it follows the group.
      if (opts_.blocking == 1 && !group) barrier(ctx_);
    }
    if (group) PERF_NCCL(ncclGroupEnd());
    if (opts_.blocking == 1 && group) barrier(ctx_);
    // -z 2 (wait after each inner iteration, no barrier): every call on host
    // memory has completed when it returns, so there is nothing more to do.
    if (per_iteration_clock) {
      const double d = std::chrono::duration<double>(Clock::now() - i0).count();
      coll_only += d;
      if (opts_.per_iter) t.iter_sec[static_cast<size_t>(it)] = d / opts_.agg_iters;
    }
    if (opts_.blocking == 3) barrier(ctx_);
  }
  const double all = std::chrono::duration<double>(Clock::now() - t0).count();
  double sec = (opts_.blocking == 3 ? coll_only : all) /
               (static_cast<double>(opts_.iters) * opts_.agg_iters);
  if (ctx_.nranks > 1 && opts_.average != 0) {
    const ncclRedOp_t op = opts_.average == 2 ? ncclMin : opts_.average == 3 ? ncclMax : ncclSum;
    cudaStream_t stream{};
    PERF_NCCL(ncclAllReduce(&sec, &sec, 1, ncclFloat64, op, ctx_.comm, stream));
    if (opts_.average == 1) sec /= ctx_.nranks;
  }
  t.sec = sec;
  return t;
}

void Runner::gatherIterations(const Timing& t, HalfResult* h) {
  const size_t iters = t.iter_sec.size();
  const int n = ctx_.nranks;
  std::vector<double> all(iters * n);
  if (n > 1) {
    cudaStream_t stream{};
    PERF_NCCL(ncclAllGather(t.iter_sec.data(), all.data(), iters, ncclFloat64, ctx_.comm, stream));
  } else {
    all = t.iter_sec;
  }
  if (ctx_.rank != 0) return;
  h->iter_us.assign(iters, 0.0);
  for (size_t i = 0; i < iters; ++i) {
    double m = 0;
    for (int r = 0; r < n; ++r) m = std::max(m, all[r * iters + i] * 1e6);
    h->iter_us[i] = m;
  }
  if (n > 1) {
    h->per_rank_us.assign(n, std::vector<double>(iters));
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < iters; ++i) h->per_rank_us[r][i] = all[r * iters + i] * 1e6;
    }
  }
  const size_t skip = std::min<size_t>(static_cast<size_t>(opts_.per_iter_skip), iters);
  iterStats(std::vector<double>(h->iter_us.begin() + skip, h->iter_us.end()), h);
}

int64_t Runner::checkOnce(const Case& c, size_t size, bool in_place, const Counts& k, int rep) {
  const TypeInfo& t = *c.type;
  const int n = ctx_.nranks;
  const int rank = ctx_.rank;
  const Coll coll = c.coll->coll;
  const bool red = isReduction(coll);
  uint64_t seed = mix64(size * 131 + (in_place ? 7 : 0) + static_cast<uint64_t>(t.type) * 1009 +
                        static_cast<uint64_t>(c.op) * 10007 + static_cast<uint64_t>(c.root + 1) +
                        (static_cast<uint64_t>(rep) << 32));
  Pattern p(t, c.op, n, seed);
  // Inputs and results live in the host buffers; with --mem device the
  // operation runs on the device buffers, uploaded before and downloaded after.
  char* send = hostSendPtr(in_place, k);
  char* recv = hostRecvPtr(in_place, k);
  if (in_place) {
    size_t extent = std::max(k.send + k.send_inplace * rank, k.recv + k.recv_inplace * rank);
    fillGarbage(t, buf_.recv, extent);
    fillSend(red, p, t, rank, send, k.send);
    upload(buf_.recv, 0, extent * t.size);  // the send extent lies inside
  } else {
    fillGarbage(t, recv, k.recv);
    fillSend(red, p, t, rank, send, k.send);
    upload(buf_.send, 0, k.send * t.size);
    upload(buf_.recv, 0, k.recv * t.size);
  }
  launch(c, ctx_, sendPtr(in_place, k), recvPtr(in_place, k), k.param);
  download(buf_.recv, recvOffset(in_place, k), k.recv * t.size);

  int64_t wrong = 0;
  const size_t cnt = k.param;
  const int prev = (rank + n - 1) % n;
  auto report = [&](size_t j, const std::string& got, const std::string& want) {
    if (mismatch_reports_++ >= 8) return;
    std::fprintf(stderr,
                 "tutti-perf: rank %d: %s %s %s root %d size %zu %s: element %zu is %s, expected "
                 "%s\n",
                 rank, c.coll->name, t.name, opName(c.op), c.root, size,
                 in_place ? "in-place" : "out-of-place", j, got.c_str(), want.c_str());
  };
  // --compress: fp16/bf16 results are within the codec's rounding (n + 2
  // roundings of its unit roundoff, relative to the sum of the magnitudes,
  // plus binary16's underflow); 1-bit and PowerSGD are approximate per call,
  // so only their finiteness is checked here. Every compressed result is also
  // compared bit for bit with rank 0's (below).
  const Compress kind = c.z != nullptr ? opts_.compress : Compress::kOff;
  const bool lossy_values = kind == Compress::kOneBit || kind == Compress::kPowerSGD;
  const double codec_u = kind == Compress::kFp16   ? std::ldexp(1.0, -11)
                         : kind == Compress::kBf16 ? std::ldexp(1.0, -8)
                                                   : 0.0;
  auto checkRed = [&](size_t j, size_t idx) {
    const double got = decodeValue(t, recv + j * t.size);
    if (lossy_values) {
      if (!std::isfinite(got)) {
        ++wrong;
        char g[64];
        std::snprintf(g, sizeof(g), "%.17g", got);
        report(j, g, "a finite value");
      }
      return;
    }
    const double want = p.expected(idx);
    double tol = p.tolerance(idx, want);
    if (codec_u > 0) {
      const double abs_sum = p.absSum(idx);
      tol += (n + 2) * codec_u * abs_sum + (n + 2) * std::ldexp(abs_sum, -30);
    }
    const bool ok = !std::isnan(got) && (tol == 0 ? got == want : std::fabs(got - want) <= tol);
    if (!ok) {
      ++wrong;
      char g[64], w[64];
      std::snprintf(g, sizeof(g), "%.17g", got);
      std::snprintf(w, sizeof(w), "%.17g", want);
      report(j, g, w);
    }
  };
  auto checkRaw = [&](size_t j, int src, size_t idx) {
    char want[8];
    p.raw(src, idx, want);
    if (std::memcmp(want, recv + j * t.size, t.size) != 0) {
      ++wrong;
      report(j, hexBytes(recv + j * t.size, t.size), hexBytes(want, t.size));
    }
  };
  switch (coll) {
    case Coll::kAllReduce:
      for (size_t j = 0; j < cnt; ++j) checkRed(j, j);
      break;
    case Coll::kReduce:
      if (rank == c.root) {
        for (size_t j = 0; j < cnt; ++j) checkRed(j, j);
      }
      break;
    case Coll::kReduceScatter:
      for (size_t j = 0; j < cnt; ++j) checkRed(j, rank * cnt + j);
      break;
    case Coll::kBroadcast:
      for (size_t j = 0; j < cnt; ++j) checkRaw(j, c.root, j);
      break;
    case Coll::kAllGather:
      for (size_t j = 0; j < cnt * n; ++j) checkRaw(j, static_cast<int>(j / cnt), j % cnt);
      break;
    case Coll::kGather:
      if (rank == c.root) {
        for (size_t j = 0; j < cnt * n; ++j) checkRaw(j, static_cast<int>(j / cnt), j % cnt);
      }
      break;
    case Coll::kScatter:
      for (size_t j = 0; j < cnt; ++j) checkRaw(j, c.root, rank * cnt + j);
      break;
    case Coll::kAllToAll:
      for (size_t j = 0; j < cnt * n; ++j)
        checkRaw(j, static_cast<int>(j / cnt), rank * cnt + j % cnt);
      break;
    case Coll::kSendRecv:
      for (size_t j = 0; j < cnt; ++j) checkRaw(j, prev, j);
      break;
    case Coll::kHyperCube:
      for (size_t j = 0; j < cnt * n; ++j) checkRaw(j, static_cast<int>(j / cnt), j % cnt);
      break;
    case Coll::kAllToAllv: {
      // From each source in rank order, its segment for this rank: the part
      // of its send buffer after the segments for the ranks before this one.
      const size_t total = cnt * n * t.size;
      size_t at = 0;
      for (int src = 0; src < n; ++src) {
        const size_t seg = alltoallvPeerBytes(src, rank, n, total, c.spread) / t.size;
        size_t from = 0;
        for (int before = 0; before < rank; ++before)
          from += alltoallvPeerBytes(src, before, n, total, c.spread) / t.size;
        for (size_t e = 0; e < seg; ++e) checkRaw(at + e, src, from + e);
        at += seg;
      }
      break;
    }
  }
  if (c.z != nullptr && n > 1) {
    // Compressed results must be bit-identical on every rank: one more wrong
    // result per rank whose bytes differ from rank 0's.
    cudaStream_t stream{};
    uint64_t mine = hashBytes(recv, cnt * t.size);
    uint64_t root_hash = mine;
    PERF_NCCL(ncclBroadcast(&root_hash, &root_hash, 1, ncclUint64, 0, ctx_.comm, stream));
    if (root_hash != mine) {
      ++wrong;
      if (mismatch_reports_++ < 8) {
        std::fprintf(stderr,
                     "tutti-perf: rank %d: all_reduce --compress %s size %zu %s: the result is not "
                     "bit-identical to rank 0's\n",
                     rank, compressName(kind), size, in_place ? "in-place" : "out-of-place");
      }
    }
  }
  if (n > 1) {
    cudaStream_t stream{};
    PERF_NCCL(ncclAllReduce(&wrong, &wrong, 1, ncclInt64, ncclSum, ctx_.comm, stream));
  }
  return wrong;
}

void Runner::warmup(const Case& c) {
  if (opts_.warmup_iters <= 0) return;
  for (size_t size = opts_.min_bytes; size <= opts_.max_bytes;) {
    const Counts k = counts(c, size);
    for (int i = 0; i < opts_.warmup_iters; ++i) {
      launch(c, ctx_, sendPtr(false, k), recvPtr(false, k), k.param);
    }
    if (size > opts_.max_bytes / 2) break;
    size = size == 0 ? 1 : size * 2;
  }
}

void Runner::createCompressor(size_t count, CompressCall* z) {
#ifdef TUTTI_PERF_HAVE_TUTTI_H
  z->api = &api_;
  z->key = 1;  // one gradient per size, the same key every call
  squareShape(count, &z->rows, &z->cols);
  tuttiCompressionConfig_t cfg = TUTTI_COMPRESSION_CONFIG_INITIALIZER;
  cfg.kind = compressKind(opts_.compress);
  if (opts_.compress == Compress::kPowerSGD) cfg.powerSgdRank = opts_.powersgd_rank;
  tuttiCompressor_t comp = nullptr;
  ncclResult_t res = api_.create(ctx_.comm, &cfg, &comp);
  if (res != ncclSuccess) ncclFailed("tuttiCompressorCreate", res);
  z->compressor = comp;
#else
  (void)count;
  (void)z;
#endif
}

void Runner::destroyCompressor(CompressCall* z) {
#ifdef TUTTI_PERF_HAVE_TUTTI_H
  if (z->compressor == nullptr) return;
  ncclResult_t res = api_.destroy(static_cast<tuttiCompressor_t>(z->compressor));
  if (res != ncclSuccess) ncclFailed("tuttiCompressorDestroy", res);
  z->compressor = nullptr;
#else
  (void)z;
#endif
}

void Runner::prepareCompressedData(bool in_place, const Counts& k) {
  fillGradient(reinterpret_cast<float*>(buf_.send), k.send, ctx_.rank, 0x5EED);
  upload(buf_.send, 0, k.send * elem_);
  if (in_place) {
    std::memcpy(buf_.recv, buf_.send, k.send * elem_);
    upload(buf_.recv, 0, k.send * elem_);
  }
}

void Runner::copyOrFail(void* dst, const void* src, size_t bytes) {
  ncclResult_t res = mem_.memcpy(dst, src, bytes);
  if (res != ncclSuccess) ncclFailed("tuttiMemcpy", res);
}

void Runner::upload(char* host, size_t off, size_t bytes) {
  if (!device_ || bytes == 0) return;
  char* dev = host == buf_.send ? buf_.dev_send : buf_.dev_recv;
  copyOrFail(dev + off, host + off, bytes);
}

void Runner::download(char* host, size_t off, size_t bytes) {
  if (!device_ || bytes == 0) return;
  const char* dev = host == buf_.send ? buf_.dev_send : buf_.dev_recv;
  copyOrFail(host + off, dev + off, bytes);
}

int Runner::allocDeviceBuffers() {
  void* s = nullptr;
  void* r = nullptr;
  ncclResult_t res = ncclMemAlloc(&s, buf_.alloc_bytes);
  if (res == ncclSuccess) {
    buf_.dev_send_alloc = static_cast<char*>(s);
    res = ncclMemAlloc(&r, buf_.alloc_bytes);
    buf_.dev_recv_alloc = static_cast<char*>(r);
  }
  if (res != ncclSuccess) {
    const char* last = ncclGetLastError(nullptr);
    std::fprintf(stderr,
                 "tutti-perf: rank %d: --mem device: ncclMemAlloc of %zu bytes failed: %s%s%s\n",
                 ctx_.rank, buf_.alloc_bytes, ncclGetErrorString(res), (last && *last) ? ": " : "",
                 last ? last : "");
    return kExitError;
  }
  // Start from the same (zeroed) contents as the host buffers.
  copyOrFail(buf_.dev_send_alloc, buf_.send_alloc, buf_.alloc_bytes);
  copyOrFail(buf_.dev_recv_alloc, buf_.recv_alloc, buf_.alloc_bytes);
  buf_.shift(0);
  return kExitOk;
}

double Runner::wireRatio(const CompressCall& z, size_t bytes, std::string* note) {
#ifdef TUTTI_PERF_HAVE_TUTTI_H
  tuttiCompressionStats_t st{};
  st.size = sizeof(st);
  ncclResult_t res = api_.getStats(static_cast<tuttiCompressor_t>(z.compressor), &st);
  if (res != ncclSuccess) ncclFailed("tuttiCompressorGetStats", res);
  // Summed over the ranks: onebit's servers send more than the other ranks.
  uint64_t sums[2] = {st.payloadBytes, st.wireBytesSent};
  if (ctx_.nranks > 1) {
    cudaStream_t stream{};
    PERF_NCCL(ncclAllReduce(sums, sums, 2, ncclUint64, ncclSum, ctx_.comm, stream));
  }
  if (ctx_.rank == 0 && st.exactCalls > 0 && bytes > 0 && opts_.compress != Compress::kNone) {
    char buf[256];
    std::snprintf(buf, sizeof(buf), "# %zu bytes: %llu of %llu %s calls ran exact", bytes,
                  st.exactCalls, st.calls, compressName(opts_.compress));
    *note = buf;
    if (opts_.compress == Compress::kPowerSGD) {
      std::snprintf(buf, sizeof(buf), " (PowerSGD %zu x %zu at rank %d: too small to compress)",
                    z.rows, z.cols, opts_.powersgd_rank);
      *note += buf;
    }
  }
  // nothing sent: one rank, or size 0
  return sums[1] > 0 ? static_cast<double>(sums[0]) / static_cast<double>(sums[1]) : -1;
#else
  (void)z;
  (void)bytes;
  (void)note;
  return -1;
#endif
}

void Runner::printRow(const Case& c, size_t bytes, const Counts& k, const HalfResult half[2],
                      const std::string& wire, const std::string& stamp) {
  std::printf("%12zu  %12zu  %8s  %6s  %6d", bytes, k.param, c.type->name, opName(c.op),
              c.coll->has_root ? c.root : -1);
  for (int ip = 0; ip < 2; ++ip) {
    const HalfResult& h = half[ip];
    std::printf("  %7s  %6s  %6s", fmtNum(h.time_us, 7).c_str(), fmtNum(h.algbw, 6).c_str(),
                fmtNum(h.busbw, 6).c_str());
    if (h.checked) {
      std::printf("  %5lld", static_cast<long long>(h.wrong));
    } else {
      std::printf("  %5s", "N/A");
    }
    if (opts_.per_iter) {
      std::printf("  %7s  %7s  %7s  %7s", fmtNum(h.i_min, 7).c_str(), fmtNum(h.i_max, 7).c_str(),
                  fmtNum(h.i_p99, 7).c_str(), fmtNum(h.i_cv, 7).c_str());
    }
  }
  std::printf("%s", wire.c_str());
  if (!stamp.empty()) std::printf("  %19s", stamp.c_str());
  std::printf("\n");
}

void Runner::progress(size_t bytes, const Case& c) {
  ++rows_done_;
  if (progress_mode_ == 0) return;
  const auto now = std::chrono::steady_clock::now();
  const double since_start = std::chrono::duration<double>(now - progress_start_).count();
  const double since_last = std::chrono::duration<double>(now - progress_last_).count();
  // Mode 1: nothing for the first 5 s, then a line every 5 s.
  if (progress_mode_ == 1 && (since_start < 5 || since_last < 5)) return;
  progress_last_ = now;
  char total[32] = "?";  // -N 0 runs forever
  if (rows_total_ > 0) std::snprintf(total, sizeof(total), "%ld", rows_total_);
  std::fprintf(stderr, "tutti-perf: size %ld of %s done (%zu bytes, %s %s), %.1f s elapsed\n",
               rows_done_, total, bytes, c.type->name, opName(c.op), since_start);
  std::fflush(stderr);
}

void Runner::runCase(const Case& c0) {
  // With --compress each size warms up its own compressor instead (below).
  if (!compress_) warmup(c0);
  const bool print = ctx_.rank == 0;
  const int n = ctx_.nranks;
  const Coll coll = c0.coll->coll;
  const double factor = busFactor(coll, n);
  // ncclAlltoAll and send/recv with sendbuff == recvbuff are timed like
  // nccl-tests does, but NCCL does not define their result, and nccl-tests
  // does not check alltoallv in place: not validated.
  const bool in_place_defined =
      coll != Coll::kAllToAll && coll != Coll::kSendRecv && coll != Coll::kAllToAllv;
  for (long cycle = 0; opts_.run_cycles == 0 || cycle < opts_.run_cycles; ++cycle) {
    for (size_t size = opts_.min_bytes; size <= opts_.max_bytes;) {
      const Counts k = counts(c0, size);
      const size_t bytes = std::max(k.send, k.recv) * elem_;
      Case c = c0;
      CompressCall z;
      if (compress_) {
        createCompressor(k.param, &z);
        c.z = &z;
        // Warm-up: the key's state (residuals, PowerSGD's Q) is created by
        // the first call; the timed calls then reuse it, as training does.
        prepareCompressedData(false, k);
        for (int i = 0; i < opts_.warmup_iters; ++i) {
          launch(c, ctx_, sendPtr(false, k), recvPtr(false, k), k.param);
        }
      }
      HalfResult half[2];
      for (int ip = 0; ip < 2; ++ip) {
        const bool in_place = ip == 1;
        const void* send = sendPtr(in_place, k);
        void* recv = recvPtr(in_place, k);
        if (compress_) prepareCompressedData(in_place, k);
        const Timing t = timeOps(c, send, recv, k.param);
        HalfResult& h = half[ip];
        h.time_us = t.sec * 1e6;
        h.algbw = t.sec > 0 ? algBytes(coll, k, elem_, n) / t.sec / 1e9 : 0;
        h.busbw = h.algbw * factor;
        if (opts_.per_iter) gatherIterations(t, &h);
        // -c N: N checked calls, each on fresh data; the first with wrong
        // elements ends them (nccl-tests).
        h.checked = opts_.check > 0 && (!in_place || in_place_defined);
        for (int r = 0; h.checked && r < opts_.check; ++r) {
          h.wrong = checkOnce(c, size, in_place, k, rep_++);
          if (h.wrong > 0) break;
        }
        if (h.wrong > 0) ++failed_results_;
        bw_sum_ += h.busbw;
        ++bw_count_;
      }
      std::string wire, note;
      double ratio = -1;
      if (compress_) {
        ratio = wireRatio(z, bytes, &note);
        destroyCompressor(&z);
        char buf[32];
        if (ratio >= 0) {
          std::snprintf(buf, sizeof(buf), "  %7.2f", ratio);
        } else {
          std::snprintf(buf, sizeof(buf), "  %7s", "-");
        }
        wire = buf;
      }
      if (print) {
        printRow(c, bytes, k, half, wire, opts_.report_timestamps ? nowString() : "");
        if (!note.empty()) std::printf("%s\n", note.c_str());
        std::fflush(stdout);
        jsonRow(c, bytes, k, half, ratio);
        progress(bytes, c);
      }
      const size_t next = nextSize(opts_, size);
      if (next == 0) break;
      size = next;
    }
  }
}

void Runner::registerBuffers() {
  if (opts_.local_register == 0) return;
  char* s = device_ ? buf_.dev_send_alloc : buf_.send_alloc;
  char* r = device_ ? buf_.dev_recv_alloc : buf_.recv_alloc;
  const size_t bytes = buf_.alloc_bytes;
  char what[160];
  std::snprintf(what, sizeof(what), "the send and receive buffers, %zu bytes each", bytes);
  if (opts_.local_register == 2) {
    ncclResult_t res =
        ncclCommWindowRegister(ctx_.comm, s, bytes, &win_send_, NCCL_WIN_COLL_SYMMETRIC);
    if (res == ncclSuccess) {
      PERF_NCCL(ncclCommWindowRegister(ctx_.comm, r, bytes, &win_recv_, NCCL_WIN_COLL_SYMMETRIC));
      reg_note_ = std::string("symmetric (-R 2): ncclCommWindowRegister on ") + what;
      return;
    }
    // As nccl-tests does where symmetric registration is unavailable (NCCL
    // before 2.27): local registration instead, and say why.
    win_send_ = nullptr;
    const char* last = ncclGetLastError(ctx_.comm);
    reg_note_ = std::string(
                    "-R 2 asked for symmetric registration, but ncclCommWindowRegister "
                    "failed (") +
                ncclGetErrorString(res) + ((last && *last) ? std::string(": ") + last : "") +
                "); using local registration (ncclCommRegister) on " + what;
  }
  PERF_NCCL(ncclCommRegister(ctx_.comm, s, bytes, &reg_send_));
  PERF_NCCL(ncclCommRegister(ctx_.comm, r, bytes, &reg_recv_));
  if (reg_note_.empty()) reg_note_ = std::string("local (-R 1): ncclCommRegister on ") + what;
}

void Runner::deregisterBuffers() {
  if (win_send_ != nullptr) PERF_NCCL(ncclCommWindowDeregister(ctx_.comm, win_send_));
  if (win_recv_ != nullptr) PERF_NCCL(ncclCommWindowDeregister(ctx_.comm, win_recv_));
  if (reg_send_ != nullptr) PERF_NCCL(ncclCommDeregister(ctx_.comm, reg_send_));
  if (reg_recv_ != nullptr) PERF_NCCL(ncclCommDeregister(ctx_.comm, reg_recv_));
  win_send_ = win_recv_ = nullptr;
  reg_send_ = reg_recv_ = nullptr;
}

// ---- -J: nccl-tests' JSON document (version 3) ---------------------------------
//
// The keys and value types follow nccl-tests 2.19 (including its booleans
// written as the strings "true"/"false" and the root as a "%6i" string), so
// that its tools read tutti-perf's files; "tutti_perf" is tutti's own.

std::string g_json_written;  // the file rank 0 wrote (for --plot under a launcher)

bool Runner::openJson() {
#ifdef TUTTI_PERF_HAVE_JSON
  if (opts_.json_path.empty()) return true;
  std::string path = opts_.json_file;
  if (path.empty()) {  // under a launcher: rank 0 picks the file now
    std::string error;
    if (!createJsonFile(opts_.json_path, &path, &error)) {
      std::fprintf(stderr, "tutti-perf: -J/--output_file: %s\n", error.c_str());
      return false;
    }
    std::printf("# Writing JSON output to %s\n", path.c_str());
  }
  json_fp_ = std::fopen(path.c_str(), "w");
  if (json_fp_ == nullptr) {
    std::fprintf(stderr, "tutti-perf: -J/--output_file: cannot write %s: %s\n", path.c_str(),
                 std::strerror(errno));
    return false;
  }
  g_json_written = path;
  using nlohmann::ordered_json;
  auto flag = [](bool b) { return b ? "true" : "false"; };
  int lib = 0;
  ncclGetVersion(&lib);
  json_["version"] = 3;
  json_["start_time"] = nowString();
  json_["args"] = opts_.args;
  ordered_json env = ordered_json::array();
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) env.push_back(*e);
  json_["env"] = env;
  json_["nccl_version"] = lib;
  ordered_json cfg;
  cfg["nthreads"] = 1;
  cfg["ngpus"] = 1;
  cfg["minimum_bytes"] = opts_.min_bytes;
  cfg["maximum_bytes"] = opts_.max_bytes;
  if (opts_.step_factor > 1) {
    cfg["step_factor"] = opts_.step_factor;
  } else {
    cfg["step_bytes"] = opts_.step_bytes;
  }
  cfg["warmup_iters"] = opts_.warmup_iters;
  cfg["iterations"] = opts_.iters;
  cfg["aggregated_iterations"] = opts_.agg_iters;
  cfg["validation"] = opts_.check;
  cfg["graph"] = 0;
  cfg["blocking_collectives"] = flag(opts_.blocking != 0);
  cfg["per_iter_timing"] = flag(opts_.per_iter != 0);
  cfg["per_iter_skip"] = opts_.per_iter_skip;
  cfg["parallel_init"] = flag(true);  // one process per rank: always parallel
  cfg["devices"] = ordered_json::array();
  json_["config"] = cfg;
  json_["tutti_perf"] = {{"collective", opts_.coll->name},
                         {"nranks", ctx_.nranks},
                         {"mem", memName(opts_.mem)},
                         {"compress", compressName(opts_.compress)},
                         {"blocking", opts_.blocking},
                         {"unalign", opts_.unalign},
                         {"local_register", opts_.local_register}};
  json_["results"] = ordered_json::array();
#endif
  return true;
}

void Runner::jsonRow(const Case& c, size_t bytes, const Counts& k, const HalfResult half[2],
                     double wire) {
#ifdef TUTTI_PERF_HAVE_JSON
  if (json_fp_ == nullptr) return;
  using nlohmann::ordered_json;
  ordered_json row;
  char root[16];
  std::snprintf(root, sizeof(root), "%6i", c.coll->has_root ? c.root : -1);
  row["size"] = bytes;
  row["count"] = k.param;
  row["type"] = c.type->name;
  row["redop"] = opName(c.op);
  row["root"] = root;
  for (int ip = 0; ip < 2; ++ip) {
    const HalfResult& h = half[ip];
    ordered_json body;
    body[opts_.report_cputime ? "cpu_time" : "time"] = h.time_us;
    body["alg_bw"] = h.algbw;
    body["bus_bw"] = h.busbw;
    body["nwrong"] = h.checked ? ordered_json(static_cast<double>(h.wrong)) : ordered_json();
    row[ip == 0 ? "out_of_place" : "in_place"] = body;
    if (h.has_iter) {
      ordered_json it;
      it["skipped_iterations"] = opts_.per_iter_skip;
      it["min_us"] = h.i_min;
      it["max_us"] = h.i_max;
      it["avg_us"] = h.i_avg;
      it["p50_us"] = h.i_p50;
      it["p95_us"] = h.i_p95;
      it["p99_us"] = h.i_p99;
      it["stdev_us"] = h.i_stdev;
      it["cv_pct"] = h.i_cv;
      it["times_us"] = h.iter_us;
      if (!h.per_rank_us.empty()) it["per_process_max_times_us"] = h.per_rank_us;
      row[ip == 0 ? "out_of_place_per_iter" : "in_place_per_iter"] = it;
    }
  }
  if (compress_) row["wire_ratio"] = wire >= 0 ? ordered_json(wire) : ordered_json();
  row["actual_iterations"] = opts_.iters;
  row["experiment_name"] = "";
  json_["results"].push_back(row);
#else
  (void)c;
  (void)bytes;
  (void)k;
  (void)half;
  (void)wire;
#endif
}

void Runner::finishJson(double avg_bw, double min_bw) {
#ifdef TUTTI_PERF_HAVE_JSON
  if (json_fp_ == nullptr) return;
  using nlohmann::ordered_json;
  json_["out_of_bounds"] = {{"count", failed_results_},
                            {"okay", failed_results_ == 0 ? "true" : "false"}};
  ordered_json bw;
  bw["bandwidth"] = avg_bw;
  if (min_bw < 0) {
    bw["okay"] = "unchecked";
  } else {
    bw["okay"] = avg_bw >= 0.9 * min_bw ? "true" : "false";
  }
  json_["average_bus_bandwidth"] = bw;
  ordered_json errors = ordered_json::array();
  const char* last = ncclGetLastError(nullptr);
  if (last != nullptr && *last != '\0') errors.push_back(last);
  json_["errors"] = errors;
  json_["end_time"] = nowString();
  // Non-finite numbers (none are expected) become null rather than invalid JSON.
  const std::string text = json_.dump(-1, ' ', false, ordered_json::error_handler_t::replace);
  const bool ok = std::fputs(text.c_str(), json_fp_) >= 0 && std::fputc('\n', json_fp_) != EOF;
  if (std::fclose(json_fp_) != 0 || !ok) {
    std::fprintf(stderr, "tutti-perf: -J/--output_file: writing %s failed: %s\n",
                 g_json_written.c_str(), std::strerror(errno));
  }
  json_fp_ = nullptr;
#else
  (void)avg_bw;
  (void)min_bw;
#endif
}

int Runner::run() {
  const int n = ctx_.nranks;
  rss_after_init_ = residentBytes();
  double spread = 1;  // alltoallv's pattern
  if (const char* sp = std::getenv("NCCL_TESTS_ALLTOALLV_SPREAD")) {
    // nccl-tests: a number, clamped to [0, 1]; anything else keeps 1.
    char* end = nullptr;
    errno = 0;
    const double v = std::strtod(sp, &end);
    if (end != sp && *end == '\0' && errno != ERANGE) spread = std::min(1.0, std::max(0.0, v));
  }
  // -J: rank 0 opens its file; every rank stops if it cannot.
  int json_ok = ctx_.rank == 0 ? (openJson() ? 1 : 0) : 1;
  if (n > 1 && (!opts_.json_path.empty() || !opts_.plot_path.empty())) {
    cudaStream_t stream{};
    PERF_NCCL(ncclBroadcast(&json_ok, &json_ok, 1, ncclInt32, 0, ctx_.comm, stream));
  }
  if (!json_ok) return kExitUsage;
  if (device_) {
    std::string error;
    if (!loadMemApi(&mem_, &error)) {
      if (ctx_.rank == 0) std::fprintf(stderr, "tutti-perf: --mem device: %s\n", error.c_str());
      return kExitUsage;
    }
    backend_ = mem_.backendName();
    if (backend_ == nullptr) {
      const char* last = ncclGetLastError(nullptr);
      std::fprintf(stderr, "tutti-perf: rank %d: --mem device: tutti's device backend: %s\n",
                   ctx_.rank, last && *last ? last : "cannot be loaded");
      return kExitError;
    }
  }
  printDevices();

  std::vector<int> roots;
  if (opts_.coll->has_root) {
    if (opts_.root >= n) {
      if (ctx_.rank == 0) {
        std::fprintf(stderr, "tutti-perf: -r/--root %d is not a rank: there are %d ranks\n",
                     opts_.root, n);
      }
      return kExitUsage;
    }
    if (opts_.root < 0) {
      for (int r = 0; r < n; ++r) roots.push_back(r);
    } else {
      roots.push_back(opts_.root);
    }
  } else {
    roots.push_back(-1);
  }

  if (compress_) {
    std::string error;
#ifdef TUTTI_PERF_HAVE_TUTTI_H
    const bool loaded = loadCompressApi(&api_, &error);
#else
    const bool loaded = false;
    error = "this tutti-perf was built without tutti/tutti.h";
#endif
    if (!loaded) {
      if (ctx_.rank == 0) {
        std::fprintf(stderr, "tutti-perf: --compress %s: %s\n", compressName(opts_.compress),
                     error.c_str());
      }
      return kExitUsage;
    }
  }

  // -u N shifts the buffers by N elements of up to 8 bytes: allocated that
  // much larger, as nccl-tests does.
  buf_.bytes = (std::max<size_t>(opts_.max_bytes, 64) + 4095) / 4096 * 4096;
  buf_.alloc_bytes = buf_.bytes + 8 * static_cast<size_t>(opts_.unalign);
  if (posix_memalign(reinterpret_cast<void**>(&buf_.send_alloc), 4096, buf_.alloc_bytes) != 0 ||
      posix_memalign(reinterpret_cast<void**>(&buf_.recv_alloc), 4096, buf_.alloc_bytes) != 0) {
    std::fprintf(stderr, "tutti-perf: rank %d: cannot allocate 2 x %zu bytes of buffers\n",
                 ctx_.rank, buf_.alloc_bytes);
    return kExitError;
  }
  std::memset(buf_.send_alloc, 0, buf_.alloc_bytes);
  std::memset(buf_.recv_alloc, 0, buf_.alloc_bytes);
  buf_.shift(0);
  if (device_) {
    const int rc = allocDeviceBuffers();
    if (rc != kExitOk) return rc;
  }
  registerBuffers();
  rss_after_buffers_ = residentBytes();

  // Progress on stderr (rank 0): TUTTI_PERF_PROGRESS=1 every row, =0 never;
  // by default every row on a terminal when there are 8 rows or more, and
  // otherwise a line every 5 s once the run has taken 5 s.
  if (ctx_.rank == 0) {
    long sizes = 0;
    for (size_t size = opts_.min_bytes; size <= opts_.max_bytes;) {
      ++sizes;
      const size_t next = nextSize(opts_, size);
      if (next == 0) break;
      size = next;
    }
    rows_total_ =
        opts_.run_cycles == 0
            ? 0
            : sizes * static_cast<long>(opts_.types.size() * opts_.ops.size() * roots.size()) *
                  opts_.run_cycles;
    const char* env = std::getenv("TUTTI_PERF_PROGRESS");
    if (env != nullptr && std::strcmp(env, "0") == 0) {
      progress_mode_ = 0;
    } else if (env != nullptr && std::strcmp(env, "1") == 0) {
      progress_mode_ = 2;
    } else {
      progress_mode_ = isatty(STDERR_FILENO) && (rows_total_ == 0 || rows_total_ >= 8) ? 2 : 1;
    }
    progress_start_ = progress_last_ = std::chrono::steady_clock::now();
  }

  printHeader();
  for (const TypeInfo* t : opts_.types) {
    elem_ = t->size;
    buf_.shift(static_cast<size_t>(opts_.unalign) * t->size);  // -u
    for (Op op : opts_.ops) {
      Case c{opts_.coll, t, op, builtinOp(op), 0};
      c.spread = spread;
      if (device_) c.copy = mem_.memcpy;
      bool created = false;
      if (op == Op::kPreMulSum) {
        Pattern p(*t, op, n, 0);
        alignas(8) unsigned char scalar[8] = {};
        encodeValue(*t, p.scalar(ctx_.rank), scalar);
        PERF_NCCL(ncclRedOpCreatePreMulSum(&c.nccl_op, scalar, t->type, ncclScalarHostImmediate,
                                           ctx_.comm));
        created = true;
      }
      for (int root : roots) {
        c.root = root;
        runCase(c);
      }
      if (created) PERF_NCCL(ncclRedOpDestroy(c.nccl_op, ctx_.comm));
    }
  }
  buf_.shift(0);
  deregisterBuffers();

  // -M: host memory in nccl-tests' three parts, the largest over the ranks:
  // what ncclCommInitRank added to the resident set, what the buffers (and
  // their registration) added, and how far the run's peak went beyond that.
  long long mem[3] = {0, 0, 0};
  if (opts_.memory_report) {
    mem[0] = std::max(0LL, rss_after_init_ - ctx_.rss_before_init);
    mem[1] = std::max(0LL, rss_after_buffers_ - rss_after_init_);
    mem[2] = std::max(0LL, residentPeak() - rss_after_buffers_);
    if (n > 1) {
      cudaStream_t stream{};
      PERF_NCCL(ncclAllReduce(mem, mem, 3, ncclInt64, ncclMax, ctx_.comm, stream));
    }
  }

  const double avg_bw = bw_count_ ? bw_sum_ / bw_count_ : 0;
  const char* min_bw_env = std::getenv("NCCL_TESTS_MIN_BW");
  const double min_bw = min_bw_env ? std::atof(min_bw_env) : -1;
  const bool bw_failed = min_bw >= 0 && avg_bw < 0.9 * min_bw;
  if (ctx_.rank == 0) {
    std::printf("# Out of bounds values : %d %s\n", failed_results_,
                failed_results_ ? "FAILED" : "OK");
    std::printf("# Avg bus bandwidth    : %g %s\n", avg_bw,
                min_bw < 0 ? "" : (bw_failed ? "FAILED" : "OK"));
    std::printf("#\n");
    std::printf("# Collective test concluded: %s_perf\n", opts_.coll->name);
    if (opts_.memory_report) {
      std::printf("# %-20s : Initialization %s | User-Allocated %s | Collective %s | Total  %s\n",
                  "Host memory usage", memString(mem[0]).c_str(), memString(mem[1]).c_str(),
                  memString(mem[2]).c_str(), memString(mem[0] + mem[1] + mem[2]).c_str());
    }
    std::fflush(stdout);
    finishJson(avg_bw, min_bw);
  }
  return failed_results_ || bw_failed ? kExitWrongResults : kExitOk;
}

}  // namespace

bool checkLibrarySupport(const Options& opts, std::string* error) {
  if (opts.mem != Mem::kDevice) return true;
  MemApi api;
  if (loadMemApi(&api, error)) return true;
  *error = "--mem device: " + *error;
  return false;
}

void printPreamble(const Options& opts, int nranks) {
  int lib = 0;
  ncclGetVersion(&lib);
  const char* tutti = "unknown";
#ifdef TUTTI_PERF_HAVE_TUTTI_H
  tutti = tuttiGetVersionString();
#endif
  std::printf(
      "# tutti-perf %s: nccl-tests compatible, tutti-library=%s nccl-headers=%d "
      "nccl-library=%d ranks=%d\n",
      opts.coll->name, tutti, NCCL_VERSION_CODE, lib, nranks);
  std::printf("# Collective test starting: %s_perf\n", opts.coll->name);
  const bool factor = opts.step_factor > 1;
  std::printf(
      "# nThread 1 nGpus 1 minBytes %zu maxBytes %zu step: %zu(%s) warmup iters: %d iters: %d "
      "agg iters: %d validation: %d graph: 0 unalign: %d\n",
      opts.min_bytes, opts.max_bytes, factor ? opts.step_factor : opts.step_bytes,
      factor ? "factor" : "bytes", opts.warmup_iters, opts.iters, opts.agg_iters, opts.check,
      opts.unalign);
  switch (opts.blocking) {
    case 1:
      std::printf("# Blocking Enabled: wait and barrier after each inner iteration (-m)\n");
      break;
    case 2:
      std::printf(
          "# Blocking Enabled: wait after each inner iteration (-m), no barrier (on host memory "
          "every call has completed when it returns)\n");
      break;
    case 3:
      std::printf(
          "# Blocking Enabled: wait and barrier after each outer iteration (-n); time excludes "
          "barrier\n");
      break;
    default:
      break;
  }
  if (opts.per_iter) {
    std::printf(
        "# Per-Iteration Report: host wall-clock time of each iteration; i_* use the "
        "maximum over ranks");
    if (opts.per_iter_skip > 0) {
      std::printf("; summary skips first %d iterations", opts.per_iter_skip);
    }
    std::printf("\n");
  }
  if (opts.parallel_init >= 0) {
    std::printf(
        "# Parallel Init Enabled: every rank is its own process and calls ncclCommInitRank "
        "concurrently (always; -p %d changes nothing)\n",
        opts.parallel_init);
  }
  if (opts.stream_null >= 0) {
    std::printf(
        "# NULL stream: every operation runs on the NULL stream, the only stream there is on "
        "host memory (-y %d changes nothing)\n",
        opts.stream_null);
  }
  if (opts.report_cputime) {
    std::printf(
        "# CPU time: cputime is the host time until the calls return, which on host memory is "
        "when they have completed\n");
  }
  if (opts.coll->coll == Coll::kAllToAllv) {
    const char* sp = std::getenv("NCCL_TESTS_ALLTOALLV_SPREAD");
    std::printf(
        "# alltoallv: generated distance-weighted pattern, NCCL_TESTS_ALLTOALLV_SPREAD=%s; size is "
        "each rank's total, count the per-peer count of an even split\n",
        sp != nullptr && *sp != '\0' ? sp : "1.0 (default)");
  }
  if (!opts.json_file.empty()) std::printf("# Writing JSON output to %s\n", opts.json_file.c_str());
  if (opts.mem == Mem::kDevice) {
    std::printf(
        "# Memory: %s: operations run on ncclMemAlloc'd memory of tutti's backend; inputs are "
        "uploaded and results downloaded with tuttiMemcpy outside the timed loop\n",
        memName(opts.mem));
  }
  if (opts.compress != Compress::kOff) {
    std::printf("# Compression: %s", compressName(opts.compress));
    if (opts.compress == Compress::kPowerSGD) {
      std::printf(" rank %d on the most square rows x cols == count", opts.powersgd_rank);
    }
    std::printf(
        " through tuttiAllReduceCompressed, one compressor per size (key reused by every call); "
        "busbw counts the float32 payload; wire = payload / wire bytes over all ranks\n");
  }
  std::printf("#\n");
  std::fflush(stdout);
}

int runBenchmark(const Options& opts, const RankContext& ctx) {
  g_ctx = ctx;
  Runner runner(opts, ctx);
  return runner.run();
}

long long residentBytes() {
  std::ifstream f("/proc/self/statm");
  long long pages_total = 0, pages_resident = 0;
  if (!(f >> pages_total >> pages_resident)) return 0;
  return pages_resident * static_cast<long long>(sysconf(_SC_PAGESIZE));
}

const std::string& jsonFileWritten() { return g_json_written; }

bool createJsonFile(const std::string& path, std::string* created, std::string* error) {
  // nccl-tests never overwrites: PATH, else PATH.0, PATH.1, ...
  std::string tryPath = path;
  for (int i = 0; i < 10000; ++i) {
    const int fd = open(tryPath.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
      close(fd);
      *created = tryPath;
      return true;
    }
    if (errno != EEXIST) {
      *error = "cannot create " + tryPath + ": " + std::strerror(errno);
      return false;
    }
    tryPath = path + "." + std::to_string(i);
  }
  *error = "cannot create " + path + ": it and " + path + ".0 to .9999 exist";
  return false;
}

}  // namespace tutti::perf
