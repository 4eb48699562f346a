// Throughput of tutti::cpu::reduce (sum) for float32 / float16 / bfloat16 /
// int32 at 32 KiB, 1 MiB and 64 MiB per buffer, per instruction-set variant,
// next to memcpy of the same buffer size.
//
// Bytes/s counts the memory traffic the kernel must do: reduce = 2 reads + 1
// write per element (3 x buffer bytes per call); memcpy = 1 read + 1 write
// (2 x buffer bytes). Equal bytes/s therefore means "as fast as the memory
// system moves data". Run with --benchmark_repetitions=5
// --benchmark_report_aggregates_only=true for medians.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "backends/cpu/float_formats.h"
#include "backends/cpu/kernel_dispatch.h"
#include "backends/cpu/kernels.h"
#include "base/types.h"

namespace {

using tutti::DataType;
using tutti::RedOp;
using tutti::cpu::KernelIsa;

// Realistic finite values (no NaN/inf/subnormal slow paths).
void fill(std::vector<uint8_t>& buf, DataType dt, uint32_t seed) {
  const size_t n = buf.size() / tutti::dataTypeSize(dt);
  uint32_t x = seed;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    const float v = static_cast<float>(x >> 8) / 16777216.0f - 0.5f;
    switch (dt) {
      case DataType::kFloat32:
        std::memcpy(&buf[i * 4], &v, 4);
        break;
      case DataType::kInt32:
        std::memcpy(&buf[i * 4], &x, 4);
        break;
      case DataType::kFloat16: {
        const uint16_t h = tutti::cpu::floatToHalf(v);
        std::memcpy(&buf[i * 2], &h, 2);
        break;
      }
      case DataType::kBfloat16: {
        const uint16_t h = tutti::cpu::floatToBf16(v);
        std::memcpy(&buf[i * 2], &h, 2);
        break;
      }
      default:
        break;
    }
  }
}

void reduceSum(benchmark::State& state, DataType dt, KernelIsa isa) {
  if (!tutti::cpu::setActiveIsa(isa)) {
    state.SkipWithError("instruction set not supported by this CPU");
    return;
  }
  const size_t bytes = static_cast<size_t>(state.range(0));
  const size_t count = bytes / tutti::dataTypeSize(dt);
  std::vector<uint8_t> a(bytes), b(bytes), d(bytes);
  fill(a, dt, 1);
  fill(b, dt, 2);
  fill(d, dt, 3);
  for (auto _ : state) {
    tutti::cpu::reduce(d.data(), a.data(), b.data(), count, dt, RedOp::kSum);
    benchmark::DoNotOptimize(d.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 3 * bytes);
  state.counters["elems/s"] = benchmark::Counter(static_cast<double>(count) * state.iterations(),
                                                 benchmark::Counter::kIsRate);
}

void memcpyBaseline(benchmark::State& state) {
  const size_t bytes = static_cast<size_t>(state.range(0));
  std::vector<uint8_t> s(bytes, 1), d(bytes, 2);
  for (auto _ : state) {
    std::memcpy(d.data(), s.data(), bytes);
    benchmark::DoNotOptimize(d.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * 2 * bytes);
}

void applySizes(benchmark::internal::Benchmark* b) {
  b->Arg(32 << 10)->Arg(1 << 20)->Arg(64 << 20)->Unit(benchmark::kMicrosecond);
}

int registerAll() {
  benchmark::RegisterBenchmark("memcpy", memcpyBaseline)->Apply(applySizes);
  const struct {
    DataType dt;
    const char* name;
  } types[] = {{DataType::kFloat32, "float32"},
               {DataType::kFloat16, "float16"},
               {DataType::kBfloat16, "bfloat16"},
               {DataType::kInt32, "int32"}};
  for (KernelIsa isa : {KernelIsa::kGeneric, KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    if (!tutti::cpu::isaSupported(isa)) continue;
    for (const auto& t : types) {
      const std::string name = std::string("reduce_sum/") + t.name + "/" + tutti::cpu::isaName(isa);
      const DataType dt = t.dt;
      benchmark::RegisterBenchmark(name.c_str(), [dt, isa](benchmark::State& st) {
        reduceSum(st, dt, isa);
      })->Apply(applySizes);
    }
  }
  return 0;
}

const int kRegistered = registerAll();

}  // namespace

BENCHMARK_MAIN();
