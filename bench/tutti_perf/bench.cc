#include "bench.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

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

Counts countsFor(Coll coll, size_t count, int n) {
  Counts k;
  const size_t base = count / static_cast<size_t>(n);
  switch (coll) {
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
    case Coll::kGather:
    case Coll::kScatter:
      return (nr - 1) / nr;
    case Coll::kBroadcast:
    case Coll::kReduce:
    case Coll::kSendRecv:
      return 1;
  }
  return 1;
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
struct Buffers {
  char* send = nullptr;
  char* recv = nullptr;
  char* dev_send = nullptr;
  char* dev_recv = nullptr;
  size_t bytes = 0;
  Buffers() = default;
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;
  ~Buffers() {
    std::free(send);
    std::free(recv);
    if (dev_send != nullptr) ncclMemFree(dev_send);
    if (dev_recv != nullptr) ncclMemFree(dev_recv);
  }
};

class Runner {
 public:
  Runner(const Options& opts, const RankContext& ctx) : opts_(opts), ctx_(ctx) {}

  int run();

 private:
  void printDevices();
  void printHeader();
  void runCase(const Case& c);
  // Times one size; returns seconds per operation combined across ranks (-a).
  double timeOps(const Case& c, const void* send, void* recv, size_t count);
  int64_t checkOnce(const Case& c, size_t size, bool in_place, const Counts& k);
  void warmup(const Case& c, size_t size);
  // --compress: one compressor per size (created, warmed up with -w calls,
  // destroyed after the size's row), and the data the timed calls reduce.
  void createCompressor(size_t count, CompressCall* z);
  void destroyCompressor(CompressCall* z);
  void prepareCompressedData(bool in_place, const Counts& k);
  // Rank 0 prints the wire ratio column (and a note when calls ran exact).
  void printWireRatio(const CompressCall& z, size_t bytes);
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
};

void Runner::printDevices() {
  struct RankInfo {
    int32_t rank;
    int32_t pid;
    int32_t local_rank;
    int32_t reserved;
    char host[80];
    char backend[32];  // --mem device: tuttiBackendName(); else empty
  };
  static_assert(sizeof(RankInfo) == 128, "RankInfo is sent as bytes");
  std::vector<RankInfo> all(ctx_.nranks);
  RankInfo me{};
  me.rank = ctx_.rank;
  me.pid = static_cast<int32_t>(getpid());
  me.local_rank = ctx_.local_rank;
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
                  r.rank, 0, r.pid, r.host, r.local_rank, r.backend, r.backend);
    } else {
      std::printf("#  Rank %2d Group %2d Pid %6d on %10s device %2d [host] host memory\n", r.rank,
                  0, r.pid, r.host, r.local_rank);
    }
  }
  std::printf("#\n");
  std::fflush(stdout);
}

void Runner::printHeader() {
  if (ctx_.rank != 0) return;
  std::printf(
      "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          "
      "\n",
      "", "", "", "", "");
  // --compress adds a last column: the wire ratio (payload / wire bytes).
  std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s %6s  %7s  %6s  %6s %6s%s\n", "size",
              "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time", "algbw",
              "busbw", "#wrong", compress_ ? "     wire" : "");
  std::printf("# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %5s  %7s  %6s  %6s  %5s%s\n", "(B)",
              "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", "(GB/s)",
              "", compress_ ? "      (x)" : "");
  std::fflush(stdout);
}

double Runner::timeOps(const Case& c, const void* send, void* recv, size_t count) {
  barrier(ctx_);
  const auto t0 = std::chrono::steady_clock::now();
  for (int it = 0; it < opts_.iters; ++it) {
    if (opts_.agg_iters > 1) PERF_NCCL(ncclGroupStart());
    for (int a = 0; a < opts_.agg_iters; ++a) launch(c, ctx_, send, recv, count);
    if (opts_.agg_iters > 1) PERF_NCCL(ncclGroupEnd());
    if (opts_.blocking) barrier(ctx_);
  }
  const auto t1 = std::chrono::steady_clock::now();
  double sec = std::chrono::duration<double>(t1 - t0).count() /
               (static_cast<double>(opts_.iters) * opts_.agg_iters);
  if (ctx_.nranks == 1 || opts_.average == 0) return sec;
  const ncclRedOp_t op = opts_.average == 2 ? ncclMin : opts_.average == 3 ? ncclMax : ncclSum;
  cudaStream_t stream{};
  PERF_NCCL(ncclAllReduce(&sec, &sec, 1, ncclFloat64, op, ctx_.comm, stream));
  if (opts_.average == 1) sec /= ctx_.nranks;
  return sec;
}

int64_t Runner::checkOnce(const Case& c, size_t size, bool in_place, const Counts& k) {
  const TypeInfo& t = *c.type;
  const int n = ctx_.nranks;
  const int rank = ctx_.rank;
  const Coll coll = c.coll->coll;
  const bool red = isReduction(coll);
  uint64_t seed = mix64(size * 131 + (in_place ? 7 : 0) + static_cast<uint64_t>(t.type) * 1009 +
                        static_cast<uint64_t>(c.op) * 10007 + static_cast<uint64_t>(c.root + 1));
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

void Runner::warmup(const Case& c, size_t size) {
  const Counts k = countsFor(c.coll->coll, size / elem_, ctx_.nranks);
  for (int i = 0; i < opts_.warmup_iters; ++i) {
    launch(c, ctx_, sendPtr(false, k), recvPtr(false, k), k.param);
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
  ncclResult_t res = ncclMemAlloc(&s, buf_.bytes);
  if (res == ncclSuccess) {
    buf_.dev_send = static_cast<char*>(s);
    res = ncclMemAlloc(&r, buf_.bytes);
    buf_.dev_recv = static_cast<char*>(r);
  }
  if (res != ncclSuccess) {
    const char* last = ncclGetLastError(nullptr);
    std::fprintf(stderr,
                 "tutti-perf: rank %d: --mem device: ncclMemAlloc of %zu bytes failed: %s%s%s\n",
                 ctx_.rank, buf_.bytes, ncclGetErrorString(res), (last && *last) ? ": " : "",
                 last ? last : "");
    return kExitError;
  }
  // Start from the same (zeroed) contents as the host buffers.
  upload(buf_.send, 0, buf_.bytes);
  upload(buf_.recv, 0, buf_.bytes);
  return kExitOk;
}

void Runner::printWireRatio(const CompressCall& z, size_t bytes) {
#ifdef TUTTI_PERF_HAVE_TUTTI_H
  tuttiCompressionStats_t st{};
  st.size = sizeof(st);
  ncclResult_t res = api_.getStats(static_cast<tuttiCompressor_t>(z.compressor), &st);
  if (res != ncclSuccess) ncclFailed("tuttiCompressorGetStats", res);
  // Summed over the ranks: 1-bit's servers send more than the other ranks.
  uint64_t sums[2] = {st.payloadBytes, st.wireBytesSent};
  if (ctx_.nranks > 1) {
    cudaStream_t stream{};
    PERF_NCCL(ncclAllReduce(sums, sums, 2, ncclUint64, ncclSum, ctx_.comm, stream));
  }
  if (ctx_.rank != 0) return;
  if (sums[1] > 0) {
    std::printf("  %7.2f\n", static_cast<double>(sums[0]) / static_cast<double>(sums[1]));
  } else {
    std::printf("  %7s\n", "-");  // nothing sent: one rank, or size 0
  }
  if (st.exactCalls > 0 && bytes > 0 && opts_.compress != Compress::kNone) {
    std::printf("# %zu bytes: %llu of %llu %s calls ran exact", bytes, st.exactCalls, st.calls,
                compressName(opts_.compress));
    if (opts_.compress == Compress::kPowerSGD) {
      std::printf(" (PowerSGD %zu x %zu at rank %d: too small to compress)", z.rows, z.cols,
                  opts_.powersgd_rank);
    }
    std::printf("\n");
  }
#else
  (void)z;
  (void)bytes;
#endif
}

void Runner::runCase(const Case& c0) {
  // With --compress each size warms up its own compressor instead (below).
  if (!compress_) {
    warmup(c0, opts_.max_bytes);
    warmup(c0, opts_.min_bytes);
  }
  const bool print = ctx_.rank == 0;
  const double factor = busFactor(c0.coll->coll, ctx_.nranks);
  // ncclAlltoAll and send/recv with sendbuff == recvbuff are timed like
  // nccl-tests does, but NCCL does not define their result: not validated.
  const bool in_place_defined =
      c0.coll->coll != Coll::kAllToAll && c0.coll->coll != Coll::kSendRecv;
  for (long cycle = 0; opts_.run_cycles == 0 || cycle < opts_.run_cycles; ++cycle) {
    for (size_t size = opts_.min_bytes; size <= opts_.max_bytes;) {
      const Counts k = countsFor(c0.coll->coll, size / elem_, ctx_.nranks);
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
      if (print) {
        std::printf("%12zu  %12zu  %8s  %6s  %6d", bytes, k.param, c.type->name, opName(c.op),
                    c.coll->has_root ? c.root : -1);
      }
      for (int ip = 0; ip < 2; ++ip) {
        const bool in_place = ip == 1;
        const void* send = sendPtr(in_place, k);
        void* recv = recvPtr(in_place, k);
        if (compress_) prepareCompressedData(in_place, k);
        const double sec = timeOps(c, send, recv, k.param);
        const double algbw = sec > 0 ? static_cast<double>(bytes) / sec / 1e9 : 0;
        const double busbw = algbw * factor;
        const bool check = opts_.check && (!in_place || in_place_defined);
        int64_t wrong = 0;
        if (check) wrong = checkOnce(c, size, in_place, k);
        if (wrong > 0) ++failed_results_;
        bw_sum_ += busbw;
        ++bw_count_;
        if (print) {
          std::printf("  %7s  %6s  %6s", fmtNum(sec * 1e6, 7).c_str(), fmtNum(algbw, 6).c_str(),
                      fmtNum(busbw, 6).c_str());
          if (check) {
            std::printf("  %5lld", static_cast<long long>(wrong));
          } else {
            std::printf("  %5s", "N/A");
          }
        }
      }
      if (compress_) {
        printWireRatio(z, bytes);
        destroyCompressor(&z);
      } else if (print) {
        std::printf("\n");
      }
      if (print) std::fflush(stdout);
      size_t next;
      if (opts_.step_factor > 1) {
        next = size == 0 ? 1 : size * opts_.step_factor;
      } else {
        next = size + opts_.step_bytes;
      }
      if (next <= size) break;  // overflow
      size = next;
    }
  }
}

int Runner::run() {
  const int n = ctx_.nranks;
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

  buf_.bytes = (std::max<size_t>(opts_.max_bytes, 64) + 4095) / 4096 * 4096;
  if (posix_memalign(reinterpret_cast<void**>(&buf_.send), 4096, buf_.bytes) != 0 ||
      posix_memalign(reinterpret_cast<void**>(&buf_.recv), 4096, buf_.bytes) != 0) {
    std::fprintf(stderr, "tutti-perf: rank %d: cannot allocate 2 x %zu bytes of buffers\n",
                 ctx_.rank, buf_.bytes);
    return kExitError;
  }
  std::memset(buf_.send, 0, buf_.bytes);
  std::memset(buf_.recv, 0, buf_.bytes);
  if (device_) {
    const int rc = allocDeviceBuffers();
    if (rc != kExitOk) return rc;
  }

  printHeader();
  for (const TypeInfo* t : opts_.types) {
    elem_ = t->size;
    for (Op op : opts_.ops) {
      Case c{opts_.coll, t, op, builtinOp(op), 0};
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
    std::fflush(stdout);
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
      "agg iters: %d validation: %d graph: 0\n",
      opts.min_bytes, opts.max_bytes, factor ? opts.step_factor : opts.step_bytes,
      factor ? "factor" : "bytes", opts.warmup_iters, opts.iters, opts.agg_iters, opts.check);
  if (opts.blocking) {
    std::printf("# Blocking Enabled: wait for completion and barrier after each collective\n");
  }
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

}  // namespace tutti::perf
