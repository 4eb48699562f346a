// Compressed all-reduce through the public API (tutti/tutti.h): every codec on
// 1..8 ranks, one node and pretend nodes, shared memory and TCP. Checked:
// every rank's output is bit-identical; fp16/bf16 stay within the rounding
// bound of one rounding per reduce step; 1-bit and PowerSGD keep the
// error-feedback invariant; PowerSGD is exact for low-rank averages; misuse
// gets a clear error.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "algo/schedule_util.h"
#include "capi/ops.h"
#include "compress/powersgd.h"
#include "compress/wire.h"
#include "harness.h"
#include "tutti/tutti.h"

namespace tutti::test {
namespace {

// Deterministic values in [-1, 1) (hash of rank, element and step).
float unitValue(int r, size_t i, int step) {
  uint64_t h = (static_cast<uint64_t>(r) << 40) ^ (static_cast<uint64_t>(step) << 32) ^ i;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return static_cast<float>(static_cast<double>(h >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

enum class Data { kRandom, kZeros, kConstant, kHuge, kTiny };

float inputOf(Data d, int r, size_t i, int step) {
  switch (d) {
    case Data::kZeros:
      return 0.0f;
    case Data::kConstant:
      return 0.75f;
    case Data::kHuge:
      return 1e30f * unitValue(r, i, step);
    case Data::kTiny:
      return 1e-30f * unitValue(r, i, step);
    default:
      return unitValue(r, i, step);
  }
}

tuttiCompressor_t makeCompressor(ncclComm_t comm, tuttiCompression_t kind, int feedback = -1,
                                 int rank = 4) {
  tuttiCompressionConfig_t cfg = TUTTI_COMPRESSION_CONFIG_INITIALIZER;
  cfg.kind = kind;
  cfg.errorFeedback = feedback;
  cfg.powerSgdRank = rank;
  cfg.seed = 42;
  tuttiCompressor_t c = nullptr;
  EXPECT_EQ(tuttiCompressorCreate(comm, &cfg, &c), ncclSuccess) << ncclGetLastError(comm);
  return c;
}

// Outputs of every rank, for the bit-identity check.
struct Outputs {
  std::mutex mu;
  std::vector<std::vector<float>> byRank;
  explicit Outputs(int n) : byRank(n) {}
  void put(int r, const float* p, size_t count) {
    std::lock_guard<std::mutex> lk(mu);
    byRank[r].assign(p, p + count);
  }
  void expectIdentical(const std::string& what) {
    for (size_t r = 1; r < byRank.size(); ++r) {
      ASSERT_EQ(byRank[r].size(), byRank[0].size());
      EXPECT_EQ(memcmp(byRank[r].data(), byRank[0].data(), byRank[0].size() * sizeof(float)), 0)
          << what << ": rank " << r << " differs from rank 0";
    }
  }
};

enum class Where { kShm, kShmNodes, kTcpNodes };

Env envFor(Where w, int n) {
  static const char* layouts[] = {"1", "1", "1,1", "2,1", "2,2", "2,3", "3,3", "3,4", "3,5"};
  std::vector<std::pair<const char*, const char*>> v = {{"TUTTI_CHUNK_SIZE", "4096"},
                                                        {"NCCL_BUFFSIZE", "65536"}};
  v.push_back({"NCCL_SHM_DISABLE", w == Where::kTcpNodes ? "1" : "0"});
  if (w != Where::kShm) v.push_back({"TUTTI_TEST_NODES", layouts[n]});
  return Env(v);
}

// fp16 / bf16: within one rounding per reduce step of the exact result.
class NarrowFloat
    : public ::testing::TestWithParam<std::tuple<tuttiCompression_t, int, Where, Data>> {};

TEST_P(NarrowFloat, BoundedAndIdentical) {
  const auto [kind, n, where, data] = GetParam();
  Env env = envFor(where, n);
  for (ncclRedOp_t op : {ncclSum, ncclAvg}) {
    for (size_t count : {size_t{1}, size_t{7}, size_t{1001}, size_t{20011}}) {
      Outputs outs(n);
      runRanks(n, [&](int r, ncclComm_t comm) {
        tuttiCompressor_t c = makeCompressor(comm, kind);
        std::vector<float> in(count + 1), out(count + 1, -7.0f);
        for (size_t i = 0; i < count; ++i) in[i + 1] = inputOf(data, r, i, 0);
        // Unaligned buffers (one float in).
        ASSERT_EQ(tuttiAllReduceCompressed(in.data() + 1, out.data() + 1, count, ncclFloat32, op,
                                           c, 1, count, 1, nullptr),
                  ncclSuccess)
            << ncclGetLastError(comm);
        outs.put(r, out.data() + 1, count);
        EXPECT_EQ(tuttiCompressorDestroy(c), ncclSuccess);
      });
      outs.expectIdentical("count " + std::to_string(count));
      double maxAbs = 0;
      for (int r = 0; r < n; ++r)
        for (size_t i = 0; i < count; ++i)
          maxAbs = std::max(maxAbs, std::fabs(static_cast<double>(inputOf(data, r, i, 0))));
      const bool half = kind == tuttiCompressFp16;
      const double unit = half ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8);
      // Subnormal spacing of the scaled format, in the data's units (bf16 is
      // never scaled; its subnormals lie below 1e-38, far below the data).
      const int e = half ? compress::halfScaleExp(maxAbs, op == ncclAvg ? 1.0 : n) : 0;
      const double floor = half ? std::ldexp(1.0, -24 - e) : 0.0;
      for (size_t i = 0; i < count; ++i) {
        double exact = 0, mag = 0;
        for (int r = 0; r < n; ++r) {
          exact += inputOf(data, r, i, 0);
          mag += std::fabs(inputOf(data, r, i, 0));
        }
        if (op == ncclAvg) {
          exact /= n;
          mag /= n;
        }
        // At most n + 1 roundings (pre-scale, one per reduce step, final),
        // each within half a unit of the value's magnitude (<= mag) or the
        // subnormal spacing; float32 adds are far below that.
        const double tol = (n + 1) * (unit * mag + floor) + 1e-6 * mag;
        const float got = outs.byRank[0][i];
        ASSERT_TRUE(std::isfinite(got)) << "element " << i;
        ASSERT_LE(std::fabs(got - exact), tol)
            << "element " << i << " count " << count << " op " << op;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Codecs, NarrowFloat,
    ::testing::Combine(::testing::Values(tuttiCompressFp16, tuttiCompressBf16),
                       ::testing::Values(1, 2, 3, 5, 8),
                       ::testing::Values(Where::kShm, Where::kShmNodes),
                       ::testing::Values(Data::kRandom)));
INSTANTIATE_TEST_SUITE_P(
    Values, NarrowFloat,
    ::testing::Combine(::testing::Values(tuttiCompressFp16, tuttiCompressBf16),
                       ::testing::Values(3),
                       ::testing::Values(Where::kShmNodes),
                       ::testing::Values(Data::kZeros, Data::kConstant, Data::kHuge,
                                         Data::kTiny)));
INSTANTIATE_TEST_SUITE_P(Tcp, NarrowFloat,
                         ::testing::Combine(::testing::Values(tuttiCompressFp16),
                                            ::testing::Values(2, 5),
                                            ::testing::Values(Where::kTcpNodes),
                                            ::testing::Values(Data::kRandom)));

// 1-bit: bit-identical outputs, and over many steps the outputs plus the
// residuals add up to the exact results (error feedback loses nothing).
class OneBit : public ::testing::TestWithParam<std::tuple<int, Where, ncclRedOp_t>> {};

TEST_P(OneBit, TelescopesAndIdentical) {
  const auto [n, where, op] = GetParam();
  Env env = envFor(where, n);
  const size_t count = 5003;  // not a multiple of 8 * n; several slices and blocks
  const int steps = 12;
  std::deque<Outputs> outs;
  for (int t = 0; t < steps; ++t) outs.emplace_back(n);
  std::vector<std::vector<float>> residual(n);
  runRanks(n, [&](int r, ncclComm_t comm) {
    tuttiCompressor_t c = makeCompressor(comm, tuttiCompressOneBit);
    std::vector<float> in(count), out(count);
    for (int t = 0; t < steps; ++t) {
      for (size_t i = 0; i < count; ++i) in[i] = inputOf(Data::kRandom, r, i, t);
      ASSERT_EQ(tuttiAllReduceCompressed(in.data(), out.data(), count, ncclFloat32, op, c, 9,
                                         count, 1, nullptr),
                ncclSuccess)
          << ncclGetLastError(comm);
      outs[t].put(r, out.data(), count);
    }
    const std::vector<float>* res = capi::compressorResidual(c, 9);
    ASSERT_NE(res, nullptr);
    residual[r] = *res;
    EXPECT_EQ(tuttiCompressorDestroy(c), ncclSuccess);
  });
  for (int t = 0; t < steps; ++t) outs[t].expectIdentical("step " + std::to_string(t));
  // sum_t out_t + (1/n for avg) * sum_r worker_r + server residuals
  //   == sum_t exact_t, elementwise.
  const double w = op == ncclAvg ? 1.0 / n : 1.0;
  double worst = 0, scale = 0;
  for (size_t i = 0; i < count; ++i) {
    double lhs = 0, rhs = 0;
    for (int t = 0; t < steps; ++t) {
      lhs += outs[t].byRank[0][i];
      for (int r = 0; r < n; ++r) rhs += w * inputOf(Data::kRandom, r, i, t);
    }
    for (int r = 0; r < n; ++r) lhs += w * residual[r][i];
    // The server residual of element i lives with its segment's owner.
    for (int r = 0; r < n; ++r) {
      const auto [start, len] = algo::segment(count, n, r);
      if (i >= start && i < start + len) lhs += residual[r][count + (i - start)];
    }
    worst = std::max(worst, std::fabs(lhs - rhs));
    scale = std::max(scale, std::fabs(rhs));
  }
  // Every term is a float32 with |value| <~ steps * n; each step's identity
  // holds to float32 rounding of the sums involved (a few ulps of n * max).
  EXPECT_LE(worst, 1e-5 * steps * n) << "scale " << scale;
}

INSTANTIATE_TEST_SUITE_P(Ranks, OneBit,
                         ::testing::Combine(::testing::Values(1, 2, 3, 5, 8),
                                            ::testing::Values(Where::kShm),
                                            ::testing::Values(ncclSum, ncclAvg)));
INSTANTIATE_TEST_SUITE_P(Nodes, OneBit,
                         ::testing::Combine(::testing::Values(4),
                                            ::testing::Values(Where::kShmNodes, Where::kTcpNodes),
                                            ::testing::Values(ncclAvg)));

// PowerSGD: a low-rank average is recovered in one step; outputs identical.
class PowerSgd : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(PowerSgd, ExactForLowRankAverage) {
  const auto [n, trueRank] = GetParam();
  Env env = envFor(Where::kShm, n);
  const size_t rows = 96, cols = 70;
  const int r4 = 4;
  // M_r = U V_r^T with U shared: the average has rank <= trueRank.
  auto u = [&](size_t i, int k) { return unitValue(100 + k, i, 0); };
  auto v = [&](int rank, size_t j, int k) { return unitValue(200 + rank * 8 + k, j, 0); };
  auto m = [&](int rank, size_t i, size_t j) {
    double s = 0;
    for (int k = 0; k < trueRank; ++k) s += static_cast<double>(u(i, k)) * v(rank, j, k);
    return static_cast<float>(s);
  };
  Outputs outs(n);
  runRanks(n, [&](int r, ncclComm_t comm) {
    tuttiCompressor_t c = makeCompressor(comm, tuttiCompressPowerSGD, -1, r4);
    std::vector<float> in(rows * cols), out(rows * cols);
    for (size_t i = 0; i < rows; ++i)
      for (size_t j = 0; j < cols; ++j) in[i * cols + j] = m(r, i, j);
    ASSERT_EQ(tuttiAllReduceCompressed(in.data(), out.data(), rows * cols, ncclFloat32, ncclAvg, c,
                                       3, rows, cols, nullptr),
              ncclSuccess)
        << ncclGetLastError(comm);
    outs.put(r, out.data(), out.size());
    tuttiCompressionStats_t st;
    st.size = sizeof(st);
    ASSERT_EQ(tuttiCompressorGetStats(c, &st), ncclSuccess);
    EXPECT_EQ(st.calls, 1u);
    EXPECT_EQ(st.exactCalls, 0u);
    EXPECT_EQ(st.payloadBytes, rows * cols * sizeof(float));
    EXPECT_EQ(tuttiCompressorDestroy(c), ncclSuccess);
  });
  outs.expectIdentical("PowerSGD");
  double err = 0, norm = 0;
  for (size_t i = 0; i < rows; ++i)
    for (size_t j = 0; j < cols; ++j) {
      double avg = 0;
      for (int r = 0; r < n; ++r) avg += m(r, i, j);
      avg /= n;
      err += std::pow(outs.byRank[0][i * cols + j] - avg, 2);
      norm += avg * avg;
    }
  // Exact up to float32 rounding, amplified by the conditioning of the
  // subspace: P = M Q is rounded to float32 before it is orthonormalised, so
  // the span found is off by about 6e-8 * cond(B^T Q) (B: the average's row
  // factor, Q Gaussian). When the average has rank r exactly, that r x r
  // matrix decides the whole subspace: with 5 ranks it brings the error to
  // 1.0e-5 (the other cases stay below 1.2e-6), so that case gets twice the
  // margin.
  const double tol = trueRank < r4 ? 1e-5 : 2e-5;
  EXPECT_LE(std::sqrt(err / norm), tol);
  std::printf("PowerSGD %d ranks, average of rank %d, r %d: relative error %.3g\n", n, trueRank,
              r4, std::sqrt(err / norm));
}

INSTANTIATE_TEST_SUITE_P(Ranks, PowerSgd,
                         ::testing::Combine(::testing::Values(1, 2, 3, 5),
                                            ::testing::Values(1, 3, 4)));

// PowerSGD with error feedback: outputs + mean residual telescope to the
// exact averages; thin matrices fall back to the exact all-reduce.
TEST(PowerSgdFeedback, TelescopesAndFallsBack) {
  const int n = 3;
  Env env = envFor(Where::kShm, n);
  const size_t rows = 64, cols = 48;
  const int steps = 6;
  std::deque<Outputs> outs;
  for (int t = 0; t < steps; ++t) outs.emplace_back(n);
  std::vector<std::vector<float>> residual(n);
  runRanks(n, [&](int r, ncclComm_t comm) {
    tuttiCompressor_t c = makeCompressor(comm, tuttiCompressPowerSGD, 1, 2);
    std::vector<float> in(rows * cols), out(rows * cols);
    for (int t = 0; t < steps; ++t) {
      for (size_t i = 0; i < in.size(); ++i) in[i] = inputOf(Data::kRandom, r, i, t);
      ASSERT_EQ(tuttiAllReduceCompressed(in.data(), out.data(), in.size(), ncclFloat32, ncclAvg,
                                         c, 5, rows, cols, nullptr),
                ncclSuccess)
          << ncclGetLastError(comm);
      outs[t].put(r, out.data(), out.size());
    }
    residual[r] = *capi::compressorResidual(c, 5);
    // A 2 x 1000 matrix gains nothing from rank 2: exact (integers stay exact).
    std::vector<float> thin(2000), thinOut(2000);
    for (size_t i = 0; i < thin.size(); ++i) thin[i] = static_cast<float>(r + i % 7);
    ASSERT_EQ(tuttiAllReduceCompressed(thin.data(), thinOut.data(), thin.size(), ncclFloat32,
                                       ncclSum, c, 6, 2, 1000, nullptr),
              ncclSuccess);
    for (size_t i = 0; i < thin.size(); ++i)
      ASSERT_EQ(thinOut[i], static_cast<float>(3 + 3 * (i % 7))) << i;
    tuttiCompressionStats_t st;
    st.size = sizeof(st);
    ASSERT_EQ(tuttiCompressorGetStats(c, &st), ncclSuccess);
    EXPECT_EQ(st.exactCalls, 1u);
    EXPECT_EQ(tuttiCompressorDestroy(c), ncclSuccess);
  });
  for (int t = 0; t < steps; ++t) outs[t].expectIdentical("step " + std::to_string(t));
  double worst = 0;
  for (size_t i = 0; i < rows * cols; ++i) {
    double lhs = 0, rhs = 0;
    for (int t = 0; t < steps; ++t) {
      lhs += outs[t].byRank[0][i];
      for (int r = 0; r < n; ++r) rhs += inputOf(Data::kRandom, r, i, t) / n;
    }
    for (int r = 0; r < n; ++r) lhs += residual[r][i] / n;
    worst = std::max(worst, std::fabs(lhs - rhs));
  }
  EXPECT_LE(worst, 1e-4);
}

// PowerSGD with one residual per node (compress/powersgd.h): the same outputs
// as with a residual per rank, up to rounding; each rank keeps only its rows of
// the node's residual; the node's residual is the sum of its ranks' ones.
class PowerSgdNodeShare : public ::testing::TestWithParam<std::tuple<int, Where>> {};

TEST_P(PowerSgdNodeShare, SameAsResidualPerRank) {
  const auto [n, where] = GetParam();
  Env env = envFor(where, n);
  const size_t rows = 37, cols = 29;  // 37 rows do not split evenly over 2, 3 or 5 ranks
  const int steps = 5;
  // Each rank's node and place in it, from the layout envFor set (one node for kShm).
  std::vector<int> nodeOf(n, 0), localOf(n), nodeSize;
  {
    const char* layout = getenv("TUTTI_TEST_NODES");
    std::vector<int> sizes;
    for (const char* p = layout ? layout : ""; *p;) {
      sizes.push_back(atoi(p));
      while (*p && *p != ',') ++p;
      if (*p == ',') ++p;
    }
    if (sizes.empty()) sizes.push_back(n);
    int r = 0;
    for (size_t k = 0; k < sizes.size(); ++k)
      for (int j = 0; j < sizes[k]; ++j, ++r) {
        nodeOf[r] = static_cast<int>(k);
        localOf[r] = j;
      }
    ASSERT_EQ(r, n);
    nodeSize = sizes;
  }
  struct Run {
    std::deque<Outputs> outs;
    std::vector<std::vector<float>> residual;
  };
  auto runMode = [&](bool shared, Run* run) {
    setenv("TUTTI_POWERSGD_NODE_FEEDBACK", shared ? "1" : "0", 1);
    setenv("TUTTI_POWERSGD_SHARE_MIN_BYTES", "0", 1);  // the default leaves out small matrices
    for (int t = 0; t < steps; ++t) run->outs.emplace_back(n);
    run->residual.resize(n);
    runRanks(n, [&](int r, ncclComm_t comm) {
      tuttiCompressor_t c = makeCompressor(comm, tuttiCompressPowerSGD, 1, 2);
      std::vector<float> in(rows * cols + 1), out(rows * cols + 1);
      for (int t = 0; t < steps; ++t) {
        for (size_t i = 0; i < rows * cols; ++i) in[i + 1] = inputOf(Data::kRandom, r, i, t);
        // Odd steps in place, and every buffer one float off alignment.
        float* dst = t % 2 ? in.data() + 1 : out.data() + 1;
        ASSERT_EQ(tuttiAllReduceCompressed(in.data() + 1, dst, rows * cols, ncclFloat32, ncclAvg, c,
                                           5, rows, cols, nullptr),
                  ncclSuccess)
            << ncclGetLastError(comm);
        run->outs[t].put(r, dst, rows * cols);
      }
      run->residual[r] = *capi::compressorResidual(c, 5);
      EXPECT_EQ(tuttiCompressorDestroy(c), ncclSuccess);
    });
    unsetenv("TUTTI_POWERSGD_NODE_FEEDBACK");
    unsetenv("TUTTI_POWERSGD_SHARE_MIN_BYTES");
  };
  Run shared, own;
  runMode(true, &shared);
  runMode(false, &own);
  if (HasFatalFailure()) return;
  double worstOut = 0, worstNode = 0, worstTele = 0, norm = 0;
  for (int t = 0; t < steps; ++t) {
    shared.outs[t].expectIdentical("shared, step " + std::to_string(t));
    own.outs[t].expectIdentical("per rank, step " + std::to_string(t));
    for (size_t i = 0; i < rows * cols; ++i) {
      worstOut = std::max<double>(
          worstOut, std::fabs(shared.outs[t].byRank[0][i] - own.outs[t].byRank[0][i]));
      norm = std::max<double>(norm, std::fabs(own.outs[t].byRank[0][i]));
    }
  }
  for (int r = 0; r < n; ++r) {
    // A shared residual lives in the rank's own rows only (and is not all zero there: the
    // data is random). Without sharing every rank keeps all rows.
    const size_t k = nodeSize[nodeOf[r]];
    const size_t r0 = k > 1 ? rows * localOf[r] / k : 0,
                 r1 = k > 1 ? rows * (localOf[r] + 1) / k : rows;
    size_t nonzeroInside = 0;
    for (size_t i = 0; i < rows; ++i)
      for (size_t j = 0; j < cols; ++j) {
        const float v = shared.residual[r][i * cols + j];
        if (i < r0 || i >= r1)
          ASSERT_EQ(v, 0.0f) << "rank " << r << " keeps row " << i << " outside [" << r0 << ", "
                             << r1 << ")";
        else
          nonzeroInside += v != 0.0f;
      }
    EXPECT_GT(nonzeroInside, (r1 - r0) * cols / 2) << "rank " << r;
  }
  // Per node, the ranks' residuals sum to the same node residual either way; and the
  // outputs plus the mean residual telescope to the exact averages.
  for (size_t i = 0; i < rows * cols; ++i) {
    std::vector<double> a(nodeSize.size(), 0), b(nodeSize.size(), 0);
    for (int r = 0; r < n; ++r) {
      a[nodeOf[r]] += shared.residual[r][i];
      b[nodeOf[r]] += own.residual[r][i];
    }
    for (size_t k = 0; k < a.size(); ++k) worstNode = std::max(worstNode, std::fabs(a[k] - b[k]));
    double lhs = 0, rhs = 0;
    for (int t = 0; t < steps; ++t) {
      lhs += shared.outs[t].byRank[0][i];
      for (int r = 0; r < n; ++r) rhs += inputOf(Data::kRandom, r, i, t) / n;
    }
    for (int r = 0; r < n; ++r) lhs += shared.residual[r][i] / n;
    worstTele = std::max(worstTele, std::fabs(lhs - rhs));
  }
  // Both runs round differently (the node's inputs are summed before the
  // projection), and a power step passes that on through the orthonormalisation:
  // float32 differences of a few ulps of values up to about n (residual sums) and
  // 1 (outputs), grown over 5 steps. Measured (printed below): at most 1.2e-6
  // (outputs), 3.8e-6 (node residuals, 5 ranks) and 2.9e-7 (telescoping); the
  // bounds leave about 10x.
  EXPECT_LE(worstOut, 1e-5 * std::max(norm, 1.0));
  EXPECT_LE(worstNode, 1e-5 * n);
  EXPECT_LE(worstTele, 3e-6);
  std::printf(
      "PowerSGD node-shared residual, %d ranks: |out - out per rank| <= %.3g (|out| <= "
      "%.3g), |node residual difference| <= %.3g, telescoping error %.3g\n",
      n, worstOut, norm, worstNode, worstTele);
}

INSTANTIATE_TEST_SUITE_P(Ranks, PowerSgdNodeShare,
                         ::testing::Combine(::testing::Values(2, 3, 5),
                                            ::testing::Values(Where::kShm, Where::kShmNodes,
                                                              Where::kTcpNodes)));

// A node share can be empty (fewer rows than ranks), and a failed read of a node
// member's input fails the call on every rank, without a hang; the next call
// starts the residual over and works.
TEST(PowerSgdNodeShare, EmptyShareAndFailedRead) {
  const int n = 3;
  Env env = envFor(Where::kShm, n);
  const size_t rows = 2, cols = 40;  // shares of 0, 1 and 1 rows
  compress::PowerSgdConfig pc;
  pc.rank = 1;
  pc.seed = 7;
  // M_r = u v^T (r + 1): the average has rank 1, so rank 1 recovers it.
  auto m = [&](int r, size_t i, size_t j) {
    return (1.0f + i) * unitValue(300, j, 0) * static_cast<float>(r + 1);
  };
  std::vector<std::vector<float>> inputs(n, std::vector<float>(rows * cols));
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < rows; ++i)
      for (size_t j = 0; j < cols; ++j) inputs[r][i * cols + j] = m(r, i, j);
  Outputs outs(n), later(n);
  std::vector<std::string> errors(n);
  runRanks(n, [&](int r, ncclComm_t comm) {
    compress::PowerSgdState state(rows, cols, pc, 1, compress::NodeShare{r, n, true});
    EXPECT_EQ(state.shareEnd() - state.shareBegin(), r == 0 ? 0u : 1u);
    auto sum = [&](float* data, size_t count) {
      return ncclAllReduce(data, data, count, ncclFloat32, ncclSum, comm, nullptr) == ncclSuccess
                 ? Status::ok()
                 : internalError(ncclGetLastError(comm));
    };
    bool failRead = false;
    auto read = [&](int member, size_t offset, void* dst, size_t bytes) {
      if (failRead) return systemError("test: this read fails");
      memcpy(dst, reinterpret_cast<const char*>(inputs[member].data()) + offset, bytes);
      return Status::ok();
    };
    std::vector<float> out(rows * cols);
    Status st = state.run(inputs[r].data(), out.data(), true, n, sum, read);
    ASSERT_TRUE(st) << st.message();
    outs.put(r, out.data(), out.size());
    failRead = r == 2;
    st = state.run(inputs[r].data(), out.data(), true, n, sum, read);
    errors[r] = st.message();
    EXPECT_FALSE(st) << "rank " << r;
    failRead = false;
    st = state.run(inputs[r].data(), out.data(), true, n, sum, read);
    ASSERT_TRUE(st) << st.message();
    later.put(r, out.data(), out.size());
  });
  outs.expectIdentical("first call");
  later.expectIdentical("after the failure");
  EXPECT_NE(errors[2].find("test: this read fails"), std::string::npos) << errors[2];
  for (int r : {0, 1})
    EXPECT_NE(errors[r].find("1 rank(s) could not read"), std::string::npos) << errors[r];
  double err = 0, norm = 0;
  for (size_t i = 0; i < rows * cols; ++i) {
    double avg = 0;
    for (int r = 0; r < n; ++r) avg += m(r, i / cols, i % cols) / n;
    err = std::max(err, std::fabs(outs.byRank[0][i] - avg));
    err = std::max(err, std::fabs(later.byRank[0][i] - avg));
    norm = std::max(norm, std::fabs(avg));
  }
  // Rank 1 average, r = 1: exact up to a few float32 roundings (the first call's residual is
  // then about zero, and so is the restarted one's).
  EXPECT_LE(err, 1e-5 * norm);
}

// The bytes on the wire shrink by what each codec promises.
TEST(CompressStats, WireBytes) {
  const int n = 2;
  Env env = envFor(Where::kShm, n);
  const size_t count = 1 << 16;
  std::vector<double> ratio(5, 0);
  runRanks(n, [&](int r, ncclComm_t comm) {
    std::vector<float> in(count, 1.0f + r), out(count);
    for (tuttiCompression_t kind : {tuttiCompressNone, tuttiCompressFp16, tuttiCompressBf16,
                                    tuttiCompressOneBit}) {
      tuttiCompressor_t c = makeCompressor(comm, kind);
      ASSERT_EQ(tuttiAllReduceCompressed(in.data(), out.data(), count, ncclFloat32, ncclSum, c, 1,
                                         count, 1, nullptr),
                ncclSuccess);
      tuttiCompressionStats_t st;
      st.size = sizeof(st);
      ASSERT_EQ(tuttiCompressorGetStats(c, &st), ncclSuccess);
      if (r == 0) ratio[kind] = static_cast<double>(st.payloadBytes) / st.wireBytesSent;
      EXPECT_EQ(tuttiCompressorDestroy(c), ncclSuccess);
    }
  });
  // 2 ranks: each sends half the payload twice (reduce-scatter, all-gather).
  EXPECT_NEAR(ratio[tuttiCompressNone], 1.0, 1e-9);
  EXPECT_NEAR(ratio[tuttiCompressFp16], 2.0, 1e-9);
  EXPECT_NEAR(ratio[tuttiCompressBf16], 2.0, 1e-9);
  // 32 sign bits per float, plus one 4-byte scale per 512 values.
  EXPECT_NEAR(ratio[tuttiCompressOneBit], 32.0 / (1.0 + 32.0 / 512.0), 1e-6);
}

TEST(CompressErrors, ClearMessages) {
  runRanks(2, [&](int r, ncclComm_t comm) {
    tuttiCompressionConfig_t cfg = TUTTI_COMPRESSION_CONFIG_INITIALIZER;
    tuttiCompressor_t c = nullptr;
    cfg.kind = static_cast<tuttiCompression_t>(9);
    EXPECT_EQ(tuttiCompressorCreate(comm, &cfg, &c), ncclInvalidArgument);
    EXPECT_NE(std::string(ncclGetLastError(comm)).find("unknown compression kind 9"),
              std::string::npos);
    cfg.kind = tuttiCompressFp16;
    cfg.errorFeedback = 1;
    EXPECT_EQ(tuttiCompressorCreate(comm, &cfg, &c), ncclInvalidArgument);
    EXPECT_NE(std::string(ncclGetLastError(comm)).find("error feedback"), std::string::npos);
    EXPECT_EQ(tuttiCompressorCreate(comm, nullptr, &c), ncclInvalidArgument);
    cfg.size = 4;
    EXPECT_EQ(tuttiCompressorCreate(comm, &cfg, &c), ncclInvalidArgument);
    EXPECT_EQ(c, nullptr);

    c = makeCompressor(comm, tuttiCompressOneBit);
    std::vector<float> buf(100, 1.0f);
    EXPECT_EQ(tuttiAllReduceCompressed(buf.data(), buf.data(), 100, ncclFloat64, ncclSum, c, 1, 0,
                                       0, nullptr),
              ncclInvalidArgument);
    EXPECT_NE(std::string(ncclGetLastError(comm)).find("ncclFloat32"), std::string::npos);
    EXPECT_EQ(tuttiAllReduceCompressed(buf.data(), buf.data(), 100, ncclFloat32, ncclMax, c, 1, 0,
                                       0, nullptr),
              ncclInvalidArgument);
    EXPECT_EQ(ncclGroupStart(), ncclSuccess);
    EXPECT_EQ(tuttiAllReduceCompressed(buf.data(), buf.data(), 100, ncclFloat32, ncclSum, c, 1, 0,
                                       0, nullptr),
              ncclInvalidUsage);
    EXPECT_EQ(ncclGroupEnd(), ncclSuccess);
    // A key keeps its count: checked before anything is sent, on every rank.
    ASSERT_EQ(tuttiAllReduceCompressed(buf.data(), buf.data(), 100, ncclFloat32, ncclSum, c, 1, 0,
                                       0, nullptr),
              ncclSuccess);
    EXPECT_EQ(tuttiAllReduceCompressed(buf.data(), buf.data(), 50, ncclFloat32, ncclSum, c, 1, 0,
                                       0, nullptr),
              ncclInvalidArgument);
    EXPECT_NE(std::string(ncclGetLastError(comm)).find("a key names one gradient"),
              std::string::npos);
    EXPECT_EQ(tuttiCompressorDestroy(c), ncclSuccess);
    EXPECT_EQ(tuttiAllReduceCompressed(buf.data(), buf.data(), 100, ncclFloat32, ncclSum, c, 1, 0,
                                       0, nullptr),
              ncclInvalidArgument);
    EXPECT_EQ(tuttiAllReduceCompressed(buf.data(), buf.data(), 100, ncclFloat32, ncclSum, nullptr,
                                       1, 0, 0, nullptr),
              ncclInvalidArgument);

    c = makeCompressor(comm, tuttiCompressPowerSGD);
    EXPECT_EQ(tuttiAllReduceCompressed(buf.data(), buf.data(), 100, ncclFloat32, ncclSum, c, 1, 7,
                                       7, nullptr),
              ncclInvalidArgument);
    EXPECT_NE(std::string(ncclGetLastError(comm)).find("rows 7 x cols 7"), std::string::npos);
    EXPECT_EQ(tuttiCompressorDestroy(c), ncclSuccess);
    EXPECT_EQ(tuttiCompressorDestroy(nullptr), ncclSuccess);
    (void)r;
  });
}

// TUTTI_COMPRESSION on plain ncclAllReduce: applied across nodes only.
TEST(CompressEnv, PlainAllReduceAcrossNodes) {
  for (const char* mode : {"fp16", "bf16", "bogus"}) {
    for (bool nodes : {false, true}) {
      Env env({{"TUTTI_COMPRESSION", mode},
               {"TUTTI_COMPRESSION_MIN_BYTES", "1024"},
               {"TUTTI_CHUNK_SIZE", "4096"},
               {"TUTTI_TEST_NODES", nodes ? "2,1" : "3"}});
      const size_t count = 3001;
      Outputs outs(3);
      runRanks(3, [&](int r, ncclComm_t comm) {
        std::vector<float> in(count), out(count);
        for (size_t i = 0; i < count; ++i) in[i] = unitValue(r, i, 0) + 1.0f / 3;
        ASSERT_EQ(ncclAllReduce(in.data(), out.data(), count, ncclFloat32, ncclSum, comm, nullptr),
                  ncclSuccess);
        outs.put(r, out.data(), count);
      });
      outs.expectIdentical(mode);
      // Uncompressed float sums of three values differ from the double sum by
      // at most two float roundings; compressed ones by the codec's units.
      bool compressed = nodes && std::string(mode) != "bogus";
      double worst = 0;
      for (size_t i = 0; i < count; ++i) {
        double exact = 0;
        for (int r = 0; r < 3; ++r) exact += static_cast<float>(unitValue(r, i, 0) + 1.0f / 3);
        worst = std::max(worst, std::fabs(outs.byRank[0][i] - exact));
      }
      if (compressed)
        EXPECT_GT(worst, 1e-6) << mode << ": looks uncompressed";
      else
        EXPECT_LE(worst, 4 * std::ldexp(1.0, -23) * 4) << mode << " nodes " << nodes;
      EXPECT_LE(worst, 4 * std::ldexp(1.0, -8) * 4) << mode;
    }
  }
}

}  // namespace
}  // namespace tutti::test
