// cuda_plugin_check: the CUDA backend plugin on a real GPU. dlopens
// libtutti-backend-cuda.so, runs every kernel on device memory and compares the
// result with the host loops of backends/cuda/kernel_ops.h (which
// tests/device/cuda_kernel_ops_test.cc checks against tutti's CPU reference),
// checks pointer queries, queues/events and IPC (through a child process), then
// times the reduce kernel against a device-to-device copy and prints a table.
//
// Usage: cuda_plugin_check [--plugin PATH] [--quick] [--no-bench] [--bench-mib N]
// Exit: 0 all passed, 1 a check failed, 77 no usable GPU (the reason is printed).
// Needs nothing but the plugin and libc/libstdc++ (no CUDA headers or libraries).
// Comparison: bytes equal, except that two NaNs of a floating type are equal.
#include <dlfcn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "backends/cuda/kernel_ops.h"
#include "tutti/backend_plugin.h"

namespace {

namespace kops = tutti_cuda;

const tuttiBackendPlugin_v1* T = nullptr;
void* C = nullptr;  // plugin context
tuttiPluginQueue_t Q = nullptr;
int32_t Dev = 0;

struct Tally {
  const char* name;
  int pass = 0, fail = 0;
};
Tally tReduce{"reduce"}, tCast{"castScaled"}, tPack{"pack1bit/unpack1bit"}, tGemm{"gemm"},
    tMisc{"memory/queues/events"}, tIpc{"ipc"};

void check(Tally& t, bool ok, const std::string& what) {
  if (ok) {
    ++t.pass;
    return;
  }
  if (++t.fail <= 10) std::printf("FAIL %s: %s\n", t.name, what.c_str());
}

#define OK(call)                                                                                  \
  do {                                                                                            \
    const ncclResult_t rc_ = (call);                                                              \
    if (rc_ != ncclSuccess) {                                                                     \
      std::printf("FATAL %s:%d %s -> %d: %s\n", __FILE__, __LINE__, #call, rc_, T->lastError(C)); \
      std::exit(1);                                                                               \
    }                                                                                             \
  } while (0)

// Device buffer with host staging helpers.
struct DevBuf {
  void* p = nullptr;
  size_t bytes = 0;
  explicit DevBuf(size_t n) : bytes(n) { OK(T->memAlloc(C, Dev, n ? n : 1, &p)); }
  ~DevBuf() { T->memFree(C, p); }
  DevBuf(const DevBuf&) = delete;
  DevBuf& operator=(const DevBuf&) = delete;
  char* at(size_t off) const { return static_cast<char*>(p) + off; }
};
void toDev(void* d, const void* h, size_t n) {
  if (n) OK(T->memcpyAsync(C, d, h, n, Q));
}
void toHost(void* h, const void* d, size_t n) {
  if (n) OK(T->memcpyAsync(C, h, d, n, Q));
  OK(T->queueSynchronize(C, Q));
}

bool isNanElem(int dt, const unsigned char* p) {
  uint64_t v = 0;
  std::memcpy(&v, p, kops::dtypeSize(dt));
  switch (dt) {
    case kops::kFloat16:
      return (v & 0x7fff) > 0x7c00;
    case kops::kBfloat16:
      return (v & 0x7fff) > 0x7f80;
    case kops::kFloat32:
      return (v & 0x7fffffffu) > 0x7f800000u;
    case kops::kFloat64:
      return (v & 0x7fffffffffffffffull) > 0x7ff0000000000000ull;
    case kops::kFp8E4M3:
      return (v & 0x7f) == 0x7f;
    case kops::kFp8E5M2:
      return (v & 0x7f) > 0x7c;
  }
  return false;
}
bool sameElems(int dt, const unsigned char* a, const unsigned char* b, uint64_t count,
               uint64_t* where) {
  const int es = kops::dtypeSize(dt);
  for (uint64_t i = 0; i < count; ++i) {
    if (std::memcmp(a + i * es, b + i * es, es) == 0) continue;
    if (isNanElem(dt, a + i * es) && isNanElem(dt, b + i * es)) continue;
    *where = i;
    return false;
  }
  return true;
}

// Random elements with specials mixed in (see cuda_kernel_ops_test.cc).
std::vector<unsigned char> makeData(int dt, uint64_t count, std::mt19937_64& rng) {
  static const uint64_t kSpecial[kops::kNumDTypes][6] = {
      {0x7f, 0x80, 0xff, 0, 1, 0x81},
      {0x7f, 0x80, 0xff, 0, 1, 0xfe},
      {0x7fffffff, 0x80000000u, 0xffffffffu, 0, 1, 3},
      {0x7fffffff, 0x80000000u, 0xffffffffu, 0, 1, 3},
      {0x7fffffffffffffffull, 0x8000000000000000ull, ~0ull, 0, 1, 3},
      {0x7fffffffffffffffull, 0x8000000000000000ull, ~0ull, 0, 1, 3},
      {0x7c00, 0xfc00, 0x7e00, 0x8000, 0x0001, 0x7bff},
      {0x7f800000, 0xff800000, 0x7fc00000, 0x80000000, 0x00000001, 0x7f7fffff},
      {0x7ff0000000000000ull, 0xfff0000000000000ull, 0x7ff8000000000000ull, 0x8000000000000000ull,
       1, 0x7fefffffffffffffull},
      {0x7f80, 0xff80, 0x7fc0, 0x8000, 0x0001, 0x7f7f},
      {0x7e, 0xfe, 0x7f, 0x80, 0x01, 0x08},
      {0x7c, 0xfc, 0x7e, 0x80, 0x01, 0x7b}};
  const int es = kops::dtypeSize(dt);
  std::vector<unsigned char> out(count * es);
  std::uniform_real_distribution<double> d(-8.0, 8.0);
  for (uint64_t i = 0; i < count; ++i) {
    uint64_t v;
    const unsigned pick = rng() % 8;
    if (pick == 0) {
      v = kSpecial[dt][rng() % 6];
    } else if (pick == 1) {
      v = rng();
    } else {
      const double x = d(rng);
      const float f = static_cast<float>(x);
      switch (dt) {
        case kops::kFloat16:
          v = kops::floatToHalf(f);
          break;
        case kops::kBfloat16:
          v = kops::floatToBf16(f);
          break;
        case kops::kFp8E4M3:
          v = kops::floatToE4M3(f);
          break;
        case kops::kFp8E5M2:
          v = kops::floatToE5M2(f);
          break;
        case kops::kFloat32:
          v = kops::bitsOf(f);
          break;
        case kops::kFloat64:
          std::memcpy(&v, &x, 8);
          break;
        default:
          v = static_cast<uint64_t>(static_cast<int64_t>(x * 16));
      }
    }
    std::memcpy(&out[i * es], &v, es);
  }
  return out;
}

const char* kTypeNames[] = {"int8",    "uint8",   "int32",   "uint32",   "int64",   "uint64",
                            "float16", "float32", "float64", "bfloat16", "fp8e4m3", "fp8e5m2"};
const char* kOpNames[] = {"sum", "prod", "max", "min", "avg", "premulsum"};

// ---- reduce ------------------------------------------------------------------------------

// One reduce on the GPU vs the host loop. misalign: element offset of every
// buffer (1 defeats the 16-byte vector path); alias: -1 or the source that dst is.
void reduceCase(int dt, int op, int n, uint64_t count, int misalign, int alias, bool devScalar,
                std::mt19937_64& rng) {
  const int es = kops::dtypeSize(dt);
  const size_t slot = (count + 64) * es;  // per buffer, room for the offset
  DevBuf pool(slot * (n + 2));
  std::vector<std::vector<unsigned char>> h(n);
  std::vector<const void*> hp(n), dp(n);
  for (int k = 0; k < n; ++k) {
    h[k] = makeData(dt, count, rng);
    hp[k] = h[k].data();
    dp[k] = pool.at(slot * k + misalign * es);
    toDev(const_cast<void*>(dp[k]), h[k].data(), count * es);
  }
  void* dd = alias >= 0 ? const_cast<void*>(dp[alias]) : pool.at(slot * n + misalign * es);
  uint64_t scalar = 0;
  std::vector<unsigned char> sc = makeData(dt, 1, rng);
  std::memcpy(&scalar, sc.data(), es);
  char* dScalar = pool.at(slot * (n + 1));
  if (devScalar) toDev(dScalar, &scalar, es);

  tuttiPluginReduceArgs_v1 a{};
  a.structSize = sizeof a;
  a.datatype = dt;
  a.op = op;
  a.nSrcs = n;
  a.count = count;
  a.dst = dd;
  a.srcs = dp.data();
  a.scalar =
      op == kops::kPreMulSum ? (devScalar ? static_cast<const void*>(dScalar) : &scalar) : nullptr;
  a.scalarResidence = devScalar ? ncclScalarDevice : ncclScalarHostImmediate;
  a.avgDivisor = static_cast<uint32_t>(n + count % 3);
  std::vector<unsigned char> want(count * es), got(count * es);
  kops::hostReduce(dt, op, want.data(), hp.data(), n, count, &scalar, a.avgDivisor);
  const ncclResult_t rc = T->reduce(C, &a, Q);
  char what[200];
  std::snprintf(what, sizeof what, "%s %s n=%d count=%llu misalign=%d alias=%d devScalar=%d",
                kTypeNames[dt], kOpNames[op], n, static_cast<unsigned long long>(count), misalign,
                alias, devScalar);
  if (rc != ncclSuccess) {
    check(tReduce, false, std::string(what) + ": " + T->lastError(C));
    return;
  }
  toHost(got.data(), dd, count * es);
  uint64_t at = 0;
  const bool same = sameElems(dt, want.data(), got.data(), count, &at);
  if (!same)
    std::snprintf(what + std::strlen(what), 60, " first bad element %llu",
                  static_cast<unsigned long long>(at));
  check(tReduce, same, what);
}

void checkReduce(bool quick, std::mt19937_64& rng) {
  const uint64_t counts[] = {1, 3, 33, 1000, 4097};
  for (int dt = 0; dt < kops::kNumDTypes; ++dt)
    for (int op = 0; op < kops::kNumOps; ++op) {
      for (int n : {1, 2, 3, 8})
        for (uint64_t count : counts)
          for (int mis = 0; mis < 2; ++mis) {
            reduceCase(dt, op, n, count, mis, -1, op == kops::kPreMulSum && mis == 1, rng);
            if (count == 4097 && mis == 0) {
              reduceCase(dt, op, n, count, 0, 0, false, rng);
              reduceCase(dt, op, n, count, 0, n - 1, false, rng);
            }
          }
      // Many blocks and grid-stride iterations (the host loop bounds the time).
      if (!quick) reduceCase(dt, op, 3, (1u << 20) + 3, 0, -1, false, rng);
    }
  // The most sources one launch takes, and one more (-> host fallback).
  reduceCase(kops::kFloat32, kops::kSum, kops::kMaxReduceSrcs, 1000, 0, 5, false, rng);
  reduceCase(kops::kBfloat16, kops::kPreMulSum, kops::kMaxReduceSrcs, 1000, 1, -1, true, rng);
  std::vector<const void*> many(kops::kMaxReduceSrcs + 1, nullptr);
  tuttiPluginReduceArgs_v1 a{};
  a.structSize = sizeof a;
  a.datatype = kops::kFloat32;
  a.nSrcs = kops::kMaxReduceSrcs + 1;
  a.count = 1;
  a.srcs = many.data();
  check(tReduce, T->reduce(C, &a, Q) == ncclInvalidArgument, "65 sources -> InvalidArgument");
  a.nSrcs = 1;
  a.datatype = 12;
  check(tReduce, T->reduce(C, &a, Q) == ncclInvalidArgument, "bad datatype -> InvalidArgument");
}

// ---- castScaled, 1-bit, gemm ---------------------------------------------------------------

void checkCast(std::mt19937_64& rng) {
  for (int narrow : {kops::kFloat16, kops::kBfloat16})
    for (uint64_t count : {1ull, 1000ull, 100003ull})
      for (float scale : {1.0f, 0.5f, -3.0f, 1e-3f, 1e30f, 0.0f}) {
        for (int dir = 0; dir < 2; ++dir) {  // 0: fp32 -> narrow
          const int st = dir == 0 ? kops::kFloat32 : narrow,
                    dt = dir == 0 ? narrow : kops::kFloat32;
          const std::vector<unsigned char> src = makeData(st, count, rng);
          const size_t db = count * kops::dtypeSize(dt);
          std::vector<unsigned char> want(db), got(db);
          kops::hostCastScaled(want.data(), dt, src.data(), st, count, scale);
          DevBuf s(src.size()), d(db);
          toDev(s.p, src.data(), src.size());
          const bool launched = T->castScaled(C, d.p, dt, s.p, st, count, scale, Q) == ncclSuccess;
          if (launched) toHost(got.data(), d.p, db);
          uint64_t at = 0;
          check(tCast, launched && sameElems(dt, want.data(), got.data(), count, &at),
                std::string(kTypeNames[st]) + " -> " + kTypeNames[dt] + " scale " +
                    std::to_string(scale) + " count " + std::to_string(count));
        }
      }
  float f = 0;
  check(tCast,
        T->castScaled(C, &f, kops::kFp8E4M3, &f, kops::kFloat32, 1, 1, Q) == ncclInvalidArgument,
        "fp8 pair -> InvalidArgument");
}

void checkPack(bool quick, std::mt19937_64& rng) {
  std::vector<uint64_t> counts = {1, 7, 9, 511, 512, 513, 4096 + 100};
  if (!quick) counts.push_back(3000001);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (uint64_t count : counts)
    for (int errMode = 0; errMode < 3; ++errMode) {  // none / separate / error == src
      std::vector<float> src(count), err(count);
      for (auto& x : src) x = rng() % 50 == 0 ? -0.0f : nd(rng);
      for (auto& x : err) x = nd(rng) * 0.1f;
      if (count > 600) src[600] = NAN;
      if (count > 1100) src[1100] = INFINITY;
      const uint64_t wb = kops::signWireBytes(count);
      std::vector<float> hs = src, he = errMode == 2 ? src : err;
      std::vector<unsigned char> wantWire(wb), gotWire(wb);
      float* hErr = errMode == 0 ? nullptr : (errMode == 2 ? hs.data() : he.data());
      kops::hostPack1bit(hs.data(), hErr, wantWire.data(), count);
      DevBuf ds(count * 4), de(count * 4), dw(wb);
      toDev(ds.p, src.data(), count * 4);
      toDev(de.p, err.data(), count * 4);
      float* dErr = errMode == 0 ? nullptr : static_cast<float*>(errMode == 2 ? ds.p : de.p);
      OK(T->pack1bit(C, static_cast<float*>(ds.p), dErr, dw.p, count, Q));
      toHost(gotWire.data(), dw.p, wb);
      const std::string tag =
          "count " + std::to_string(count) + " errMode " + std::to_string(errMode);
      check(tPack, wantWire == gotWire, "wire bytes, " + tag);
      if (errMode != 0) {
        std::vector<float> gotErr(count);
        toHost(gotErr.data(), dErr, count * 4);
        const std::vector<float>& wantErr = errMode == 2 ? hs : he;
        uint64_t at = 0;
        check(tPack,
              sameElems(kops::kFloat32, reinterpret_cast<const unsigned char*>(wantErr.data()),
                        reinterpret_cast<const unsigned char*>(gotErr.data()), count, &at),
              "error feedback, " + tag);
      }
      for (int acc = 0; acc < 2; ++acc) {
        std::vector<float> base(count);
        for (auto& x : base) x = nd(rng);
        std::vector<float> want = base, got(count);
        kops::hostUnpack1bit(want.data(), wantWire.data(), count, acc != 0);
        DevBuf dd(count * 4);
        toDev(dd.p, base.data(), count * 4);
        OK(T->unpack1bit(C, static_cast<float*>(dd.p), dw.p, count, acc, Q));
        toHost(got.data(), dd.p, count * 4);
        uint64_t at = 0;
        check(tPack,
              sameElems(kops::kFloat32, reinterpret_cast<const unsigned char*>(want.data()),
                        reinterpret_cast<const unsigned char*>(got.data()), count, &at),
              "unpack acc=" + std::to_string(acc) + ", " + tag);
      }
    }
}

void checkGemm(bool quick, std::mt19937_64& rng) {
  struct Shape {
    int64_t m, n, k;
  };
  std::vector<Shape> shapes = {{1, 1, 1}, {5, 7, 3}, {17, 16, 33}, {64, 4, 1000}, {33, 31, 0}};
  if (!quick) shapes.push_back({4096, 4, 4096});
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (const Shape& s : shapes)
    for (int tA = 0; tA < 2; ++tA)
      for (int tB = 0; tB < 2; ++tB)
        for (float beta : {0.0f, -0.5f}) {
          const int64_t lda = (tA ? s.m : s.k) + 3, ldb = (tB ? s.k : s.n) + 1, ldc = s.n + 2;
          const size_t na = (tA ? s.k : s.m) * lda + 1, nb = (tB ? s.n : s.k) * ldb + 1,
                       nc = s.m * ldc + 1;
          std::vector<float> A(na), B(nb), Cm(nc);
          for (auto& x : A) x = nd(rng);
          for (auto& x : B) x = nd(rng);
          for (auto& x : Cm) x = beta == 0.0f ? NAN : nd(rng);
          std::vector<float> want = Cm, got(nc);
          kops::hostGemm(tA, tB, s.m, s.n, s.k, 0.75f, A.data(), lda, B.data(), ldb, beta,
                         want.data(), ldc);
          DevBuf da(na * 4), db(nb * 4), dc(nc * 4);
          toDev(da.p, A.data(), na * 4);
          toDev(db.p, B.data(), nb * 4);
          toDev(dc.p, Cm.data(), nc * 4);
          OK(T->gemm(C, tA, tB, s.m, s.n, s.k, 0.75f, static_cast<float*>(da.p), lda,
                     static_cast<float*>(db.p), ldb, beta, static_cast<float*>(dc.p), ldc, Q));
          toHost(got.data(), dc.p, nc * 4);
          uint64_t at = 0;
          check(tGemm,
                sameElems(kops::kFloat32, reinterpret_cast<const unsigned char*>(want.data()),
                          reinterpret_cast<const unsigned char*>(got.data()), nc, &at),
                "m" + std::to_string(s.m) + " n" + std::to_string(s.n) + " k" +
                    std::to_string(s.k) + " tA" + std::to_string(tA) + " tB" + std::to_string(tB));
        }
}

// ---- memory, queues, events, IPC -------------------------------------------------------------

void checkMisc() {
  DevBuf d(1 << 20);
  tuttiPluginPointerInfo_v1 info{};
  info.structSize = sizeof info;
  OK(T->queryPointer(C, d.at(4096 + 12), &info));
  check(tMisc,
        info.memoryType == TUTTI_PLUGIN_MEM_DEVICE && info.device == Dev && info.base == d.p &&
            info.size >= (1u << 20),
        "queryPointer of device memory (type, device, base, size)");
  void* h = nullptr;
  OK(T->hostAlloc(C, 1 << 16, &h));
  OK(T->queryPointer(C, static_cast<char*>(h) + 100, &info));
  check(tMisc, info.memoryType == TUTTI_PLUGIN_MEM_HOST_PINNED && info.device == -1,
        "queryPointer of pinned host memory");
  std::vector<char> pageable(100);
  OK(T->queryPointer(C, pageable.data(), &info));
  check(tMisc, info.memoryType == TUTTI_PLUGIN_MEM_UNKNOWN, "queryPointer of pageable memory");
  OK(T->queryPointer(C, reinterpret_cast<void*>(0x1234), &info));
  check(tMisc, info.memoryType == TUTTI_PLUGIN_MEM_UNKNOWN, "queryPointer of a wild pointer");
  OK(T->queryPointer(C, nullptr, &info));
  check(tMisc, info.memoryType == TUTTI_PLUGIN_MEM_UNKNOWN, "queryPointer of NULL");
  // A kernel reading mapped pinned host memory directly (CAP_HOST_MAPPED).
  float* hf = static_cast<float*>(h);
  for (int i = 0; i < 1000; ++i) hf[i] = static_cast<float>(i);
  const void* srcs[] = {hf, hf};
  tuttiPluginReduceArgs_v1 a{};
  a.structSize = sizeof a;
  a.datatype = kops::kFloat32;
  a.op = kops::kSum;
  a.nSrcs = 2;
  a.count = 1000;
  a.dst = d.p;
  a.srcs = srcs;
  OK(T->reduce(C, &a, Q));
  std::vector<float> out(1000);
  toHost(out.data(), d.p, 4000);
  bool ok = true;
  for (int i = 0; i < 1000; ++i) ok = ok && out[i] == 2.0f * i;
  check(tMisc, ok, "reduce reading mapped pinned host memory");
  OK(T->hostFree(C, h));
  // Events: an unrecorded event is complete; a recorded one completes.
  tuttiPluginEvent_t ev = nullptr;
  OK(T->eventCreate(C, Dev, &ev));
  int32_t done = 0;
  OK(T->eventQuery(C, ev, &done));
  check(tMisc, done == 1, "fresh event counts as complete");
  tuttiPluginQueue_t q2 = nullptr;
  OK(T->queueCreate(C, Dev, &q2));
  OK(T->eventRecord(C, ev, Q));
  OK(T->eventWait(C, q2, ev));
  OK(T->queueSynchronize(C, q2));
  OK(T->eventSynchronize(C, ev));
  OK(T->eventQuery(C, ev, &done));
  check(tMisc, done == 1, "event completes after synchronize");
  OK(T->queueDestroy(C, q2));
  OK(T->eventDestroy(C, ev));
  // The NULL (default) queue works too.
  OK(T->memcpyAsync(C, d.p, out.data(), 4000, nullptr));
  OK(T->queueSynchronize(C, nullptr));
  check(tMisc, true, "NULL queue");
}

// Child side of the IPC check: import the handle given in hex, check the
// pattern, write 0x5a into byte 0 of the exported range, exit 0 on success.
int ipcChild(const char* plugin, const char* hex) {
  void* lib = dlopen(plugin, RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) return 2;
  auto entry =
      reinterpret_cast<tuttiBackendPluginInitFn>(dlsym(lib, TUTTI_BACKEND_PLUGIN_INIT_SYMBOL));
  T = entry(TUTTI_BACKEND_PLUGIN_ABI_VERSION);
  if (T == nullptr || T->init(nullptr, &C) != ncclSuccess) return 3;
  tuttiPluginIpcHandle_v1 hd{};
  if (std::strlen(hex) != 2 * sizeof hd) return 4;
  for (size_t i = 0; i < sizeof hd; ++i) {
    unsigned v = 0;
    std::sscanf(hex + 2 * i, "%2x", &v);
    reinterpret_cast<unsigned char*>(&hd)[i] = static_cast<unsigned char>(v);
  }
  void* p = nullptr;
  if (T->ipcImport(C, 0, &hd, &p) != ncclSuccess) {
    std::printf("child: ipcImport: %s\n", T->lastError(C));
    return 5;
  }
  unsigned char got[256];
  if (T->memcpyAsync(C, got, p, sizeof got, nullptr) != ncclSuccess ||
      T->queueSynchronize(C, nullptr) != ncclSuccess)
    return 6;
  for (int i = 0; i < 256; ++i)
    if (got[i] != static_cast<unsigned char>(i)) return 7;
  const unsigned char mark = 0x5a;
  if (T->memcpyAsync(C, p, &mark, 1, nullptr) != ncclSuccess ||
      T->queueSynchronize(C, nullptr) != ncclSuccess)
    return 8;
  if (T->ipcClose(C, p) != ncclSuccess) return 9;
  T->finalize(C);
  return 0;
}

void checkIpc(const std::string& self, const std::string& plugin) {
  DevBuf d(1 << 20);
  unsigned char pattern[256];
  for (int i = 0; i < 256; ++i) pattern[i] = static_cast<unsigned char>(i);
  char* exported = d.at(4096);  // inside the allocation: offset must be 4096
  toDev(exported, pattern, sizeof pattern);
  OK(T->queueSynchronize(C, Q));
  tuttiPluginIpcHandle_v1 hd{};
  hd.structSize = sizeof hd;
  const int32_t pid = 0;
  OK(T->ipcExport(C, exported, 256, &pid, 1, &hd));
  check(tIpc, hd.fd == -1 && hd.offset == 4096 && hd.dataSize == 64,
        "export: fd -1, offset 4096, 64 bytes");
  std::string hex;
  char b[3];
  for (size_t i = 0; i < sizeof hd; ++i) {
    std::snprintf(b, sizeof b, "%02x", reinterpret_cast<unsigned char*>(&hd)[i]);
    hex += b;
  }
  const pid_t child = fork();
  if (child == 0) {
    execl(self.c_str(), self.c_str(), "--ipc-child", plugin.c_str(), hex.c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  waitpid(child, &status, 0);
  const int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  check(tIpc, rc == 0, "child imported, read and wrote (exit " + std::to_string(rc) + ")");
  unsigned char first = 0;
  toHost(&first, exported, 1);
  check(tIpc, first == 0x5a, "the child's write is visible to the exporter");
}

// ---- bandwidth -------------------------------------------------------------------------------

double secondsPer(int iters, const std::function<void()>& body) {
  body();  // warm-up
  OK(T->queueSynchronize(C, Q));
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) body();
  OK(T->queueSynchronize(C, Q));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
}

struct BenchRow {
  std::string what;
  double bytesMoved, seconds;
};

std::vector<BenchRow> bench(size_t mib) {
  const size_t bytes = mib << 20;
  const uint64_t count = bytes / 4;
  DevBuf a(bytes), b(bytes), d(bytes);
  std::vector<BenchRow> rows;
  // Fill a and b with something finite (a memcpy from a small host pattern would
  // take long; reduce a buffer with itself from zeros is enough for timing).
  std::vector<float> ones(count, 1.0f);
  toDev(a.p, ones.data(), bytes);
  toDev(b.p, ones.data(), bytes);
  OK(T->queueSynchronize(C, Q));
  const int iters = 20;
  rows.push_back({"memcpy D2D", 2.0 * bytes,
                  secondsPer(iters, [&] { OK(T->memcpyAsync(C, d.p, a.p, bytes, Q)); })});
  const void* srcs[] = {a.p, b.p};
  tuttiPluginReduceArgs_v1 args{};
  args.structSize = sizeof args;
  args.datatype = kops::kFloat32;
  args.op = kops::kSum;
  args.nSrcs = 2;
  args.count = count;
  args.dst = d.p;
  args.srcs = srcs;
  rows.push_back(
      {"reduce sum fp32 x2", 3.0 * bytes, secondsPer(iters, [&] { OK(T->reduce(C, &args, Q)); })});
  args.datatype = kops::kBfloat16;
  args.count = count * 2;
  rows.push_back(
      {"reduce sum bf16 x2", 3.0 * bytes, secondsPer(iters, [&] { OK(T->reduce(C, &args, Q)); })});
  const void* srcs8[] = {a.p, b.p, a.p, b.p, a.p, b.p, a.p, b.p};
  args.datatype = kops::kFloat32;
  args.count = count / 4;
  args.nSrcs = 8;
  args.srcs = srcs8;
  rows.push_back({"reduce sum fp32 x8 (1/4 size)", 9.0 * bytes / 4,
                  secondsPer(iters, [&] { OK(T->reduce(C, &args, Q)); })});
  rows.push_back(
      {"pack1bit fp32 (err)", bytes * 3.0 + kops::signWireBytes(count), secondsPer(iters, [&] {
         OK(T->pack1bit(C, static_cast<float*>(a.p), static_cast<float*>(b.p), d.p, count, Q));
       })});
  return rows;
}

}  // namespace

int main(int argc, char** argv) {
  std::string plugin = TUTTI_CUDA_PLUGIN_PATH;
  if (const char* env = std::getenv("TUTTI_CUDA_PLUGIN")) plugin = env;
  bool quick = false, doBench = true;
  size_t benchMib = 256;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--ipc-child" && i + 2 < argc) return ipcChild(argv[i + 1], argv[i + 2]);
    if (a == "--plugin" && i + 1 < argc) {
      plugin = argv[++i];
    } else if (a == "--quick") {
      quick = true;
      doBench = false;
    } else if (a == "--no-bench") {
      doBench = false;
    } else if (a == "--bench-mib" && i + 1 < argc) {
      benchMib = std::strtoull(argv[++i], nullptr, 10);
    } else {
      std::fprintf(stderr, "usage: %s [--plugin PATH] [--quick] [--no-bench] [--bench-mib N]\n",
                   argv[0]);
      return 2;
    }
  }
  void* lib = dlopen(plugin.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    std::printf("FAIL cannot load %s: %s\n", plugin.c_str(), dlerror());
    return 1;
  }
  auto entry =
      reinterpret_cast<tuttiBackendPluginInitFn>(dlsym(lib, TUTTI_BACKEND_PLUGIN_INIT_SYMBOL));
  T = entry != nullptr ? entry(TUTTI_BACKEND_PLUGIN_ABI_VERSION) : nullptr;
  if (T == nullptr) {
    std::printf("FAIL %s: no plugin table\n", plugin.c_str());
    return 1;
  }
  if (T->init(nullptr, &C) != ncclSuccess) {
    std::printf("SKIP no usable GPU: %s\n", T->lastError(nullptr));
    return 77;
  }
  OK(T->currentDevice(C, &Dev));
  OK(T->queueCreate(C, Dev, &Q));
  std::mt19937_64 rng(2024);
  const auto t0 = std::chrono::steady_clock::now();
  checkMisc();
  checkReduce(quick, rng);
  checkCast(rng);
  checkPack(quick, rng);
  checkGemm(quick, rng);
  char self[4096];
  const ssize_t len = readlink("/proc/self/exe", self, sizeof self - 1);
  if (len > 0) {
    self[len] = 0;
    checkIpc(self, plugin);
  }
  const double checkSec =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  int fails = 0;
  std::printf("\nconformance on the GPU (vs kernel_ops.h host loops), %.1f s:\n", checkSec);
  for (const Tally* t : {&tMisc, &tReduce, &tCast, &tPack, &tGemm, &tIpc}) {
    std::printf("  %-22s PASS %5d  FAIL %d\n", t->name, t->pass, t->fail);
    fails += t->fail;
  }
  if (doBench) {
    const std::vector<BenchRow> rows = bench(benchMib);
    const double copyBw = rows[0].bytesMoved / rows[0].seconds;
    std::printf("\nbandwidth, %zu MiB per buffer (bytes read + written per second):\n", benchMib);
    std::printf("  %-32s %10s %12s %10s\n", "kernel", "time (us)", "GB/s", "% memcpy");
    for (const BenchRow& r : rows) {
      const double bw = r.bytesMoved / r.seconds;
      std::printf("  %-32s %10.1f %12.1f %9.0f%%\n", r.what.c_str(), r.seconds * 1e6, bw / 1e9,
                  100.0 * bw / copyBw);
    }
  }
  OK(T->queueDestroy(C, Q));
  OK(T->finalize(C));
  std::printf("\n%s: %d failure(s)\n", fails == 0 ? "PASS" : "FAIL", fails);
  return fails == 0 ? 0 : 1;
}
