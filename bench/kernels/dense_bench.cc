// PowerSGD's dense kernels (backends/cpu/dense_kernels.h) on the target shape, a 4096 x 4096
// float32 gradient at rank 4, per instruction-set variant, next to memcpy of the same 64 MiB.
//
// Bytes/s counts the traffic on the big matrix the kernel must do (the rank-4 factors are
// 64 KiB and live in cache): project = read M (+ read and write E with error feedback);
// (pending: the same, the last call's residual update folded in); back = read Mp; approx = write
// out (+ read and write E). memcpy = 1 read + 1 write. Equal bytes/s therefore means "as fast as
// the memory system moves data". Run with
// --benchmark_repetitions=5 --benchmark_report_aggregates_only=true for medians.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cpu/dense_kernels.h"
#include "backends/cpu/kernel_dispatch.h"

namespace {

using tutti::cpu::KernelIsa;

constexpr size_t kRows = 4096;
constexpr size_t kCols = 4096;
constexpr size_t kRank = 4;
constexpr int64_t kMatrixBytes = static_cast<int64_t>(kRows * kCols * sizeof(float));

struct Data {
  std::vector<float> M, E, P, Q, out;
  Data()
      : M(kRows * kCols), E(kRows * kCols), P(kRows * kRank), Q(kCols * kRank), out(kRows * kCols) {
    tutti::cpu::fillGaussian(M.data(), M.size(), 1, 0);
    tutti::cpu::fillGaussian(E.data(), E.size(), 1, 1);
    tutti::cpu::fillGaussian(Q.data(), Q.size(), 1, 2);
    tutti::cpu::fillGaussian(P.data(), P.size(), 1, 3);
    tutti::cpu::orthonormalizeColumns(P.data(), kRows, kRank, 1e-8f);
  }
};

Data& data() {
  static Data d;
  return d;
}

bool selectIsa(benchmark::State& state, KernelIsa isa) {
  if (tutti::cpu::setActiveIsa(isa)) return true;
  state.SkipWithError("instruction set not supported by this CPU");
  return false;
}

// The error-feedback buffer grows a little each call (E += M); values stay far from overflow
// over any benchmark run, and the cost does not depend on them.
void project(benchmark::State& state, KernelIsa isa, bool withE) {
  if (!selectIsa(state, isa)) return;
  Data& d = data();
  for (auto _ : state) {
    tutti::cpu::powerProject(d.M.data(), withE ? d.E.data() : nullptr, kRows, kCols, d.Q.data(),
                             kRank, d.P.data());
    benchmark::DoNotOptimize(d.P.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kMatrixBytes * (withE ? 3 : 1));
}

// With error feedback and the previous call's residual update pending (PowerSGD's steady state):
// the same traffic as project_feedback, plus r fmas per element on cached factors.
void projectPending(benchmark::State& state, KernelIsa isa) {
  if (!selectIsa(state, isa)) return;
  Data& d = data();
  std::vector<float> qb(tutti::cpu::pendingQFloats(kCols, kRank));
  tutti::cpu::packPendingQ(d.Q.data(), kCols, kRank, qb.data());
  const tutti::cpu::PendingApprox pending{d.P.data(), qb.data(), kRank};
  std::vector<float> p(kRows * kRank);
  for (auto _ : state) {
    tutti::cpu::powerProject(d.M.data(), d.E.data(), kRows, kCols, d.Q.data(), kRank, p.data(),
                             &pending);
    benchmark::DoNotOptimize(p.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kMatrixBytes * 3);
}

void back(benchmark::State& state, KernelIsa isa) {
  if (!selectIsa(state, isa)) return;
  Data& d = data();
  for (auto _ : state) {
    tutti::cpu::powerBack(d.M.data(), kRows, kCols, d.P.data(), kRank, d.Q.data());
    benchmark::DoNotOptimize(d.Q.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kMatrixBytes);
}

void approx(benchmark::State& state, KernelIsa isa, bool withE) {
  if (!selectIsa(state, isa)) return;
  Data& d = data();
  for (auto _ : state) {
    tutti::cpu::powerApprox(d.P.data(), d.Q.data(), kRows, kCols, kRank, d.out.data(),
                            withE ? d.E.data() : nullptr);
    benchmark::DoNotOptimize(d.out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * kMatrixBytes * (withE ? 3 : 1));
}

void orthonormalize(benchmark::State& state) {
  Data& d = data();
  std::vector<float> p = d.P;
  for (auto _ : state) {
    tutti::cpu::orthonormalizeColumns(p.data(), kRows, kRank, 1e-8f);
    benchmark::DoNotOptimize(p.data());
    benchmark::ClobberMemory();
  }
}

void memcpyBaseline(benchmark::State& state) {
  Data& d = data();
  for (auto _ : state) {
    std::memcpy(d.out.data(), d.M.data(), static_cast<size_t>(kMatrixBytes));
    benchmark::DoNotOptimize(d.out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * 2 * kMatrixBytes);
}

int registerAll() {
  benchmark::RegisterBenchmark("memcpy/64MiB", memcpyBaseline)->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("orthonormalize/4096x4", orthonormalize)
      ->Unit(benchmark::kMicrosecond);
  for (KernelIsa isa : {KernelIsa::kGeneric, KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    if (!tutti::cpu::isaSupported(isa)) continue;
    const std::string suffix = std::string("/4096x4096_r4/") + tutti::cpu::isaName(isa);
    for (bool withE : {false, true}) {
      const std::string e = withE ? "_feedback" : "";
      benchmark::RegisterBenchmark(("powerProject" + e + suffix).c_str(),
                                   [isa, withE](benchmark::State& st) { project(st, isa, withE); })
          ->Unit(benchmark::kMillisecond);
    }
    benchmark::RegisterBenchmark(("powerProject_pending" + suffix).c_str(),
                                 [isa](benchmark::State& st) { projectPending(st, isa); })
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("powerBack" + suffix).c_str(), [isa](benchmark::State& st) {
      back(st, isa);
    })->Unit(benchmark::kMillisecond);
    for (bool withE : {false, true}) {
      const std::string e = withE ? "_feedback" : "";
      benchmark::RegisterBenchmark(("powerApprox" + e + suffix).c_str(), [isa, withE](
                                                                             benchmark::State& st) {
        approx(st, isa, withE);
      })->Unit(benchmark::kMillisecond);
    }
  }
  return 0;
}

const int kRegistered = registerAll();

}  // namespace

BENCHMARK_MAIN();
