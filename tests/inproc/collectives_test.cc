// Every collective, sampled over datatype x op x count x in-place x alignment,
// for rank counts 1..9 and 16, over shared memory, over TCP and over an NCCL
// net plugin (the test plugin of tests/netplugin, TCP on loopback). Values are
// chosen so every partial result is exact (see harness.h), so results are
// compared exactly, except the floating-point average (see tolerance()).
#include <cstdlib>
#include <map>

#include "harness.h"

namespace tutti::test {
namespace {

enum class Coll {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kReduce,
  kAllToAll,
  kGather,
  kScatter
};
const char* collName(Coll c) {
  static const char* names[] = {"AllReduce", "ReduceScatter", "AllGather", "Broadcast",
                                "Reduce",    "AlltoAll",      "Gather",    "Scatter"};
  return names[static_cast<int>(c)];
}
bool reduces(Coll c) {
  return c == Coll::kAllReduce || c == Coll::kReduceScatter || c == Coll::kReduce;
}

// 5 == premulsum (created per communicator); other values are NCCL's ops.
constexpr int kPreMul = 5;

struct Case {
  Coll coll;
  ncclDataType_t dt;
  int op;
  size_t count;
  bool inPlace;
  size_t misalign;  // bytes added to both buffers
  int root;
};

std::string describe(const Case& c, int n) {
  return std::string(collName(c.coll)) + " n=" + std::to_string(n) + " dt=" + std::to_string(c.dt) +
         " op=" + std::to_string(c.op) + " count=" + std::to_string(c.count) +
         (c.inPlace ? " in-place" : " out-of-place") + " misalign=" + std::to_string(c.misalign) +
         " root=" + std::to_string(c.root);
}

std::vector<Case> makeCases(int n, bool full) {
  std::vector<Case> cases;
  const size_t counts[] = {0, 1, 7, 1000, 5003};
  uint64_t h = 12345 + n;
  auto pick = [&](uint64_t m) {
    h = h * 6364136223846793005ull + 1442695040888963407ull;
    return (h >> 33) % m;
  };
  for (int ci = 0; ci < 8; ++ci) {
    Coll c = static_cast<Coll>(ci);
    for (int dt = 0; dt < ncclNumTypes; ++dt) {
      int nOps = reduces(c) ? 6 : 1;
      for (int op = 0; op < nOps; ++op) {
        // Sample: the full dtype x op grid for all-reduce; one op per dtype elsewhere.
        if (!full && c != Coll::kAllReduce && op != static_cast<int>(pick(nOps))) continue;
        Case k;
        k.coll = c;
        k.dt = static_cast<ncclDataType_t>(dt);
        k.op = op;
        k.count = counts[pick(5)];
        k.inPlace = pick(2) == 1;
        k.misalign = pick(3) == 0 ? 1 + pick(7) : 0;
        k.root = static_cast<int>(pick(n));
        cases.push_back(k);
      }
    }
  }
  return cases;
}

double mantissaEps(ncclDataType_t dt) {
  switch (dt) {
    case ncclFloat16:
      return std::ldexp(1.0, -10);
    case ncclBfloat16:
      return std::ldexp(1.0, -7);
    case ncclFloat32:
      return std::ldexp(1.0, -23);
    case ncclFloat64:
      return std::ldexp(1.0, -52);
    case ncclFloat8e4m3:
      return std::ldexp(1.0, -3);
    case ncclFloat8e5m2:
      return std::ldexp(1.0, -2);
    default:
      return 0;
  }
}

double combine(int op, double a, double b) {
  switch (op) {
    case ncclProd:
      return a * b;
    case ncclMax:
      return std::max(a, b);
    case ncclMin:
      return std::min(a, b);
    default:
      return a + b;
  }
}

// Input of rank q at element j of its send buffer.
double in(const Case& c, int q, size_t j) {
  return inputValue(c.dt, static_cast<ncclRedOp_t>(c.op == kPreMul ? ncclSum : c.op), q, j);
}

double premulScalar(ncclDataType_t dt) { return isFloat(dt) ? 2.0 : 3.0; }

// Expected reduced value of element j over all ranks.
double reduced(const Case& c, int n, size_t j, double* absSum) {
  double acc = 0;
  *absSum = 0;
  for (int q = 0; q < n; ++q) {
    double v = in(c, q, j);
    if (c.op == kPreMul) v *= premulScalar(c.dt);
    *absSum += std::fabs(v);
    acc = q == 0 ? v : combine(c.op == kPreMul || c.op == ncclAvg ? ncclSum : c.op, acc, v);
  }
  if (c.op == ncclAvg) acc = isFloat(c.dt) ? acc / n : std::trunc(acc / n);
  return acc;
}

// Only the floating-point average is inexact: NCCL-style premultiplication by
// 1/n rounds the scalar and each of the n products and n-1 sums once, each
// within half an ulp of a value bounded by sum|v|/n.
double tolerance(const Case& c, int n, double absSum) {
  if (!(c.op == ncclAvg && isFloat(c.dt))) return 0;
  return mantissaEps(c.dt) * (absSum / n) * (2 * n + 2) + 1e-300;
}

void runCase(const Case& c, int n, int r, ncclComm_t comm) {
  const size_t es = typeSize(c.dt);
  size_t sendCount = c.count, recvCount = c.count;
  switch (c.coll) {
    case Coll::kReduceScatter:
      sendCount = c.count * n;
      break;
    case Coll::kAllGather:
      recvCount = c.count * n;
      break;
    case Coll::kAllToAll:
      sendCount = recvCount = c.count * n;
      break;
    case Coll::kGather:
      recvCount = c.count * n;
      break;
    case Coll::kScatter:
      sendCount = c.count * n;
      break;
    default:
      break;
  }
  size_t bigCount = std::max(sendCount, recvCount);
  std::vector<uint8_t> sendMem(bigCount * es + 16), recvMem(bigCount * es + 16);
  uint8_t* sendbuf = sendMem.data() + c.misalign;
  uint8_t* recvbuf = recvMem.data() + c.misalign;
  memset(recvMem.data(), 0xA5, recvMem.size());  // garbage so a no-op cannot pass
  // In-place layouts as NCCL defines them.
  uint8_t* sendPtr = sendbuf;
  if (c.inPlace) {
    switch (c.coll) {
      case Coll::kAllGather:
        sendPtr = recvbuf + r * c.count * es;
        break;
      case Coll::kGather:
        sendPtr = recvbuf + r * c.count * es;
        break;
      case Coll::kReduceScatter:
        sendPtr = recvbuf;
        break;  // recv = send + r*count
      case Coll::kScatter:
        sendPtr = recvbuf;
        break;
      default:
        sendPtr = recvbuf;
        break;
    }
  }
  for (size_t j = 0; j < sendCount; ++j) storeValue(sendPtr + j * es, c.dt, in(c, r, j));
  uint8_t* recvPtr = recvbuf;
  if (c.inPlace && c.coll == Coll::kReduceScatter) recvPtr = sendPtr + r * c.count * es;
  if (c.inPlace && c.coll == Coll::kScatter) recvPtr = sendPtr + r * c.count * es;

  ncclRedOp_t op = static_cast<ncclRedOp_t>(c.op == kPreMul ? ncclSum : c.op);
  std::vector<uint8_t> scalar(8);
  if (c.op == kPreMul) {
    storeValue(scalar.data(), c.dt, premulScalar(c.dt));
    ASSERT_EQ(ncclRedOpCreatePreMulSum(&op, scalar.data(), c.dt, ncclScalarHostImmediate, comm),
              ncclSuccess);
  }
  ncclResult_t rc = ncclSuccess;
  switch (c.coll) {
    case Coll::kAllReduce:
      rc = ncclAllReduce(sendPtr, recvPtr, c.count, c.dt, op, comm, nullptr);
      break;
    case Coll::kReduceScatter:
      rc = ncclReduceScatter(sendPtr, recvPtr, c.count, c.dt, op, comm, nullptr);
      break;
    case Coll::kAllGather:
      rc = ncclAllGather(sendPtr, recvPtr, c.count, c.dt, comm, nullptr);
      break;
    case Coll::kBroadcast:
      rc = ncclBroadcast(sendPtr, recvPtr, c.count, c.dt, c.root, comm, nullptr);
      break;
    case Coll::kReduce:
      rc = ncclReduce(sendPtr, recvPtr, c.count, c.dt, op, c.root, comm, nullptr);
      break;
    case Coll::kAllToAll:
      rc = ncclAlltoAll(sendPtr, recvPtr, c.count, c.dt, comm, nullptr);
      break;
    case Coll::kGather:
      rc = ncclGather(sendPtr, recvPtr, c.count, c.dt, c.root, comm, nullptr);
      break;
    case Coll::kScatter:
      rc = ncclScatter(sendPtr, recvPtr, c.count, c.dt, c.root, comm, nullptr);
      break;
  }
  ASSERT_EQ(rc, ncclSuccess) << describe(c, n) << ": " << ncclGetLastError(comm);
  if (c.op == kPreMul) {
    ASSERT_EQ(ncclRedOpDestroy(op, comm), ncclSuccess);
  }

  auto expectAt = [&](size_t idx, double want, double tol) {
    double got = loadValue(recvPtr + idx * es, c.dt);
    if (!(std::fabs(got - want) <= tol)) {
      ADD_FAILURE() << describe(c, n) << " rank " << r << " element " << idx << ": got " << got
                    << " want " << want << " (tol " << tol << ")";
      return false;
    }
    return true;
  };
  size_t bad = 0;
  for (size_t j = 0; j < c.count && bad < 3; ++j) {
    double absSum;
    switch (c.coll) {
      case Coll::kAllReduce: {
        double w = reduced(c, n, j, &absSum);
        bad += !expectAt(j, w, tolerance(c, n, absSum));
        break;
      }
      case Coll::kReduce:
        if (r == c.root) {
          double w = reduced(c, n, j, &absSum);
          bad += !expectAt(j, w, tolerance(c, n, absSum));
        }
        break;
      case Coll::kReduceScatter: {
        double w = reduced(c, n, r * c.count + j, &absSum);
        bad += !expectAt(j, w, tolerance(c, n, absSum));
        break;
      }
      case Coll::kAllGather:
        for (int q = 0; q < n; ++q) bad += !expectAt(q * c.count + j, in(c, q, j), 0);
        break;
      case Coll::kBroadcast:
        bad += !expectAt(j, in(c, c.root, j), 0);
        break;
      case Coll::kAllToAll:
        for (int q = 0; q < n; ++q) bad += !expectAt(q * c.count + j, in(c, q, r * c.count + j), 0);
        break;
      case Coll::kGather:
        if (r == c.root)
          for (int q = 0; q < n; ++q) bad += !expectAt(q * c.count + j, in(c, q, j), 0);
        break;
      case Coll::kScatter:
        bad += !expectAt(j, in(c, c.root, r * c.count + j), 0);
        break;
    }
  }
}

// How the ranks talk and which algorithms run: the defaults (one-shot arena
// for small messages on shared memory, recursive doubling for small
// all-reduce, rings above), or one algorithm forced for every size. The
// two-level paths split the ranks into pretend nodes (TUTTI_TEST_NODES) of
// unequal sizes; rings then keep each node's ranks together.
enum class Path {
  kShm,
  kShmRingOnly,
  kShmRecursiveDoubling,
  kTcp,
  kTcpRingOnly,
  kShmHierarchical,
  kShm2DRing,
  kTcpHierarchical,
  // Every peer through the test NCCL net plugin (NCCL_SHM_DISABLE=1,
  // NCCL_NET=TestSock), or only those on other pretend nodes (shared memory
  // inside a node, hierarchical algorithms).
  kNetPlugin,
  kNetPluginHierarchical,
  // Every peer through tutti's UCX plugin (TUTTI_NET=ucx), over UCX's tcp
  // transport, and over its shared memory (with tcp for the connection
  // set-up, which UCX 1.13 needs; docs/transports.md).
  kUcxTcp,
  kUcxSm,
  // Every peer through tutti's libfabric plugin (TUTTI_NET=ofi), over
  // libfabric's tcp provider and over its shm provider.
  kOfiTcp,
  kOfiShm,
};

// Ranks per pretend node for n ranks: unequal where possible.
const char* nodeLayout(int n) {
  static const char* layouts[] = {"1", "1", "1,1", "1,2", "2,2", "2,3", "1,2,3", "2,2,3"};
  return n < 8 ? layouts[n] : "3,1,4";
}

class Collectives : public ::testing::TestWithParam<std::tuple<int, Path>> {};

TEST_P(Collectives, SampledMatrix) {
  const int n = std::get<0>(GetParam());
  const Path path = std::get<1>(GetParam());
  const bool plugin = path == Path::kNetPlugin || path == Path::kNetPluginHierarchical;
  const bool ucx = path == Path::kUcxTcp || path == Path::kUcxSm;
  const bool ofi = path == Path::kOfiTcp || path == Path::kOfiShm;
  const bool tcp = path == Path::kTcp || path == Path::kTcpRingOnly ||
                   path == Path::kTcpHierarchical || path == Path::kNetPlugin || ucx || ofi;
#ifdef TUTTI_TEST_UCX_PLUGIN_DIR
  if (ucx) {
    setenv("TUTTI_PLUGIN_PATH", TUTTI_TEST_UCX_PLUGIN_DIR, 1);
    setenv("TUTTI_NET", "ucx", 1);
    setenv("UCX_MEM_EVENTS", "no", 1);  // UCX's memory hooks and ThreadSanitizer
    setenv("UCX_TLS", path == Path::kUcxTcp ? "tcp" : "sm,self,tcp", 1);
    if (path == Path::kUcxSm) {
      // Shared memory with the peer-failure mode the plugin asks for.
      setenv("UCX_POSIX_ERROR_HANDLING", "y", 1);
      setenv("UCX_SYSV_ERROR_HANDLING", "y", 1);
    }
  }
#else
  if (ucx) GTEST_SKIP() << "the UCX plugin is not built (libucx-dev missing at configure time)";
#endif
#ifdef TUTTI_TEST_OFI_PLUGIN_DIR
  if (ofi) {
    setenv("TUTTI_PLUGIN_PATH", TUTTI_TEST_OFI_PLUGIN_DIR, 1);
    setenv("TUTTI_NET", "ofi", 1);
    setenv("FI_PROVIDER", path == Path::kOfiTcp ? "tcp" : "shm", 1);
  }
#else
  if (ofi)
    GTEST_SKIP() << "the libfabric plugin is not built (libfabric-dev missing at configure time)";
#endif
  const bool ringOnly = path == Path::kShmRingOnly || path == Path::kTcpRingOnly;
  const bool twoLevel = path == Path::kShmHierarchical || path == Path::kShm2DRing ||
                        path == Path::kTcpHierarchical || path == Path::kNetPluginHierarchical;
  setenv("NCCL_SHM_DISABLE", tcp ? "1" : "0", 1);
  setenv("TUTTI_ONESHOT_MAX", path == Path::kShm ? "32K" : "0", 1);
  setenv("TUTTI_RD_MAX",
         ringOnly || twoLevel ? "0" : path == Path::kShmRecursiveDoubling ? "1G" : "64K", 1);
  setenv("TUTTI_CHUNK_SIZE", "4096", 1);  // many slices even for small counts
  setenv("NCCL_BUFFSIZE", "65536", 1);    // small rings: exercise back-pressure
  if (plugin) {
    setenv("NCCL_NET_PLUGIN", TUTTI_TEST_NET_PLUGIN_DIR "/libnccl-net-tsock.so", 1);
    setenv("NCCL_NET", "TestSock", 1);
  }
  if (twoLevel) {
    setenv("TUTTI_TEST_NODES", nodeLayout(n), 1);
    setenv("NCCL_ALGO", path == Path::kShm2DRing ? "2dring" : "hierarchical", 1);
  }
  auto cases = makeCases(n, false);
  runRanks(n, [&](int r, ncclComm_t comm) {
    for (const auto& c : cases) {
      runCase(c, n, r, comm);
      if (::testing::Test::HasFatalFailure()) return;
    }
  });
  unsetenv("NCCL_SHM_DISABLE");
  unsetenv("TUTTI_ONESHOT_MAX");
  unsetenv("TUTTI_RD_MAX");
  unsetenv("TUTTI_TEST_NODES");
  unsetenv("NCCL_ALGO");
  unsetenv("NCCL_NET_PLUGIN");
  unsetenv("NCCL_NET");
  for (const char* v : {"TUTTI_PLUGIN_PATH", "TUTTI_NET", "UCX_TLS", "UCX_POSIX_ERROR_HANDLING",
                        "UCX_SYSV_ERROR_HANDLING", "FI_PROVIDER"})
    unsetenv(v);
}

INSTANTIATE_TEST_SUITE_P(Shm, Collectives,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5, 6, 7, 8, 9, 16),
                                            ::testing::Values(Path::kShm)));
INSTANTIATE_TEST_SUITE_P(ShmRingOnly, Collectives,
                         ::testing::Combine(::testing::Values(2, 3, 4, 5, 8),
                                            ::testing::Values(Path::kShmRingOnly)));
INSTANTIATE_TEST_SUITE_P(ShmRecursiveDoubling, Collectives,
                         ::testing::Combine(::testing::Values(2, 3, 4, 5, 6, 7, 8),
                                            ::testing::Values(Path::kShmRecursiveDoubling)));
INSTANTIATE_TEST_SUITE_P(Tcp, Collectives,
                         ::testing::Combine(::testing::Values(1, 2, 3, 5, 8),
                                            ::testing::Values(Path::kTcp)));
INSTANTIATE_TEST_SUITE_P(ShmHierarchical, Collectives,
                         ::testing::Combine(::testing::Values(2, 3, 4, 5, 6, 7, 8),
                                            ::testing::Values(Path::kShmHierarchical)));
INSTANTIATE_TEST_SUITE_P(Shm2DRing, Collectives,
                         ::testing::Combine(::testing::Values(3, 4, 6, 7),
                                            ::testing::Values(Path::kShm2DRing)));
INSTANTIATE_TEST_SUITE_P(TcpHierarchical, Collectives,
                         ::testing::Combine(::testing::Values(4, 6),
                                            ::testing::Values(Path::kTcpHierarchical)));
INSTANTIATE_TEST_SUITE_P(TcpRingOnly, Collectives,
                         ::testing::Combine(::testing::Values(3, 5),
                                            ::testing::Values(Path::kTcpRingOnly)));
INSTANTIATE_TEST_SUITE_P(NetPlugin, Collectives,
                         ::testing::Combine(::testing::Values(1, 2, 3, 5, 8),
                                            ::testing::Values(Path::kNetPlugin)));
INSTANTIATE_TEST_SUITE_P(UcxTcp, Collectives,
                         ::testing::Combine(::testing::Values(1, 2, 3, 5, 8),
                                            ::testing::Values(Path::kUcxTcp)));
INSTANTIATE_TEST_SUITE_P(UcxSm, Collectives,
                         ::testing::Combine(::testing::Values(2, 3, 5),
                                            ::testing::Values(Path::kUcxSm)));
INSTANTIATE_TEST_SUITE_P(OfiTcp, Collectives,
                         ::testing::Combine(::testing::Values(1, 2, 3, 5, 8),
                                            ::testing::Values(Path::kOfiTcp)));
INSTANTIATE_TEST_SUITE_P(OfiShm, Collectives,
                         ::testing::Combine(::testing::Values(2, 3, 5, 8),
                                            ::testing::Values(Path::kOfiShm)));
INSTANTIATE_TEST_SUITE_P(NetPluginHierarchical, Collectives,
                         ::testing::Combine(::testing::Values(4, 7),
                                            ::testing::Values(Path::kNetPluginHierarchical)));

// A collective called on its own reuses the work of the communicator's last
// call of the same shape (capi/nccl_api.cc, runAlone): only the buffers
// change. Every call here checks its values exactly, after calls that must
// reuse (other buffers, the other in/out-of-place form), rebuild (another
// count, another PreMulSum scalar under a recycled op handle) or find the
// communicator's scratch moved by a group in between. Counts are above the
// one-shot size, so the calls take the executor.
class RepeatedCalls : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(RepeatedCalls, ReuseOnlyWhatMatches) {
  const int n = std::get<0>(GetParam());
  Env env({std::make_pair("NCCL_SHM_DISABLE", std::get<1>(GetParam()) ? "1" : "0")});
  constexpr size_t kCount = 40003;  // odd, 160 KiB of int32
  runRanks(n, [&](int r, ncclComm_t comm) {
    // Rank r's input element j in round k: small integers, so sums are exact.
    auto in = [](int rank, size_t j, int k) {
      return static_cast<int32_t>((rank + 1) * 3 + static_cast<int>(j % 97) - 40 + 7 * k);
    };
    auto sumOf = [&](size_t j, int k) {
      int64_t t = 0;
      for (int q = 0; q < n; ++q) t += in(q, j, k);
      return static_cast<int32_t>(t);
    };
    std::vector<int32_t> a(kCount), b(kCount, -1), c(kCount), d(kCount, -1), e(kCount);
    auto fill = [&](std::vector<int32_t>& v, int k) {
      for (size_t j = 0; j < v.size(); ++j) v[j] = in(r, j, k);
    };
    auto expectSums = [&](const std::vector<int32_t>& v, int k, const char* what) {
      size_t bad = 0;
      for (size_t j = 0; j < kCount; ++j) bad += v[j] != sumOf(j, k);
      EXPECT_EQ(bad, 0u) << what << ", rank " << r << " of " << n;
    };
    // 1. Built; 2. reused with other buffers (the first output must stay as it was).
    fill(a, 0);
    ASSERT_EQ(ncclAllReduce(a.data(), b.data(), kCount, ncclInt32, ncclSum, comm, nullptr),
              ncclSuccess);
    expectSums(b, 0, "first call");
    fill(c, 1);
    ASSERT_EQ(ncclAllReduce(c.data(), d.data(), kCount, ncclInt32, ncclSum, comm, nullptr),
              ncclSuccess);
    expectSums(d, 1, "same shape, other buffers");
    expectSums(b, 0, "the first call's output after the second call");
    // 3. In place, same count: another schedule.
    fill(e, 2);
    ASSERT_EQ(ncclAllReduce(e.data(), e.data(), kCount, ncclInt32, ncclSum, comm, nullptr),
              ncclSuccess);
    expectSums(e, 2, "in place");
    // 4. Another count, then the first shape again.
    fill(a, 3);
    ASSERT_EQ(ncclAllReduce(a.data(), b.data(), kCount - 2, ncclInt32, ncclSum, comm, nullptr),
              ncclSuccess);
    for (size_t j = 0; j < kCount - 2; ++j) ASSERT_EQ(b[j], sumOf(j, 3)) << "count - 2, " << j;
    EXPECT_EQ(b[kCount - 2], sumOf(kCount - 2, 0)) << "past the count: untouched";
    fill(c, 4);
    ASSERT_EQ(ncclAllReduce(c.data(), d.data(), kCount, ncclInt32, ncclSum, comm, nullptr),
              ncclSuccess);
    expectSums(d, 4, "first shape again");
    // 5. PreMulSum: a new scalar under the same (recycled) op handle must not
    // reuse the old one. Values x * s stay exact in float.
    std::vector<float> f(kCount), g(kCount);
    for (size_t j = 0; j < kCount; ++j) f[j] = static_cast<float>(in(r, j, 5));
    for (float scalar : {2.0f, 3.0f}) {
      ncclRedOp_t op;
      ASSERT_EQ(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32, ncclScalarHostImmediate, comm),
                ncclSuccess);
      ASSERT_EQ(ncclAllReduce(f.data(), g.data(), kCount, ncclFloat32, op, comm, nullptr),
                ncclSuccess);
      size_t bad = 0;
      for (size_t j = 0; j < kCount; ++j)
        bad += g[j] != static_cast<float>(sumOf(j, 5)) * scalar;
      EXPECT_EQ(bad, 0u) << "PreMulSum by " << scalar << ", rank " << r;
      ASSERT_EQ(ncclRedOpDestroy(op, comm), ncclSuccess);
    }
    // 6. Reduce-scatter (its ring uses the communicator's scratch), twice; a
    // group with a larger one grows (moves) the scratch; then again alone.
    const size_t block = kCount / 4;
    std::vector<int32_t> big(4 * block * n), out(4 * block);
    auto reduceScatter = [&](size_t count, int k, const char* what) {
      for (size_t j = 0; j < count * n; ++j) big[j] = in(r, j, k);
      std::fill(out.begin(), out.end(), -1);
      ASSERT_EQ(ncclReduceScatter(big.data(), out.data(), count, ncclInt32, ncclSum, comm,
                                  nullptr),
                ncclSuccess);
      size_t bad = 0;
      for (size_t j = 0; j < count; ++j) bad += out[j] != sumOf(r * count + j, k);
      EXPECT_EQ(bad, 0u) << what << ", rank " << r;
    };
    reduceScatter(block, 6, "reduce-scatter");
    reduceScatter(block, 7, "reduce-scatter again");
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (size_t j = 0; j < 4 * block * n; ++j) big[j] = in(r, j, 8);
    ASSERT_EQ(ncclReduceScatter(big.data(), out.data(), 4 * block, ncclInt32, ncclSum, comm,
                                nullptr),
              ncclSuccess);
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess);
    for (size_t j = 0; j < 4 * block; ++j) ASSERT_EQ(out[j], sumOf(r * 4 * block + j, 8)) << j;
    reduceScatter(block, 9, "reduce-scatter after a group grew the scratch");
  });
}

INSTANTIATE_TEST_SUITE_P(Inproc, RepeatedCalls,
                         ::testing::Combine(::testing::Values(1, 2, 3, 5),
                                            ::testing::Values(false, true)));

}  // namespace
}  // namespace tutti::test
