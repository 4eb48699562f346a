// Throughput of the wire-codec kernels (backends/cpu/codec_kernels.h) on a
// 16 Mi-element (64 MiB) float32 buffer, per format and instruction-set
// variant: encode with error feedback, decode, decodeAdd, quantize with error
// feedback, and maxAbs.
//
// Bytes/s counts float32 input bytes (4 x elements per call), not memory
// traffic: "how fast a gradient of this size goes through the codec". The
// traffic per element is larger, e.g. encode with err reads src and err,
// writes err and the wire (14 bytes per element for kHalf / kBf16). Run with
// --benchmark_repetitions=5 --benchmark_report_aggregates_only=true for medians.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>
#include <vector>

#include "backends/cpu/codec_kernels.h"
#include "backends/cpu/kernel_dispatch.h"

namespace {

using tutti::cpu::KernelIsa;
using tutti::cpu::WireFormat;

constexpr size_t kCount = size_t{16} << 20;
constexpr int kExp = 8;  // values below are in [-0.5, 0.5): 2^8 keeps binary16 in range

enum class Op { kEncode, kDecode, kDecodeAdd, kQuantize, kMaxAbs };

// Realistic finite values (no NaN/inf/subnormal slow paths).
std::vector<float> values(uint32_t seed) {
  std::vector<float> v(kCount);
  uint32_t x = seed;
  for (float& f : v) {
    x = x * 1664525u + 1013904223u;
    f = static_cast<float>(x >> 8) / 16777216.0f - 0.5f;
  }
  return v;
}

void run(benchmark::State& state, WireFormat f, Op op, KernelIsa isa) {
  if (!tutti::cpu::setActiveIsa(isa)) {
    state.SkipWithError("instruction set not supported by this CPU");
    return;
  }
  const std::vector<float> src = values(1);
  std::vector<float> err(kCount, 0.0f), dst = values(2), local = values(3);
  std::vector<uint8_t> wire(tutti::cpu::wireBytes(f, kCount));
  tutti::cpu::encode(f, kExp, src.data(), nullptr, kCount, wire.data());
  float sink = 0;
  for (auto _ : state) {
    switch (op) {
      case Op::kEncode:
        tutti::cpu::encode(f, kExp, src.data(), err.data(), kCount, wire.data());
        break;
      case Op::kDecode:
        tutti::cpu::decode(f, kExp, wire.data(), kCount, dst.data());
        break;
      case Op::kDecodeAdd:
        tutti::cpu::decodeAdd(f, kExp, wire.data(), kCount, local.data(), 1.0f, dst.data());
        break;
      case Op::kQuantize:
        tutti::cpu::quantize(f, kExp, src.data(), 1.0f, err.data(), kCount, dst.data());
        break;
      case Op::kMaxAbs:
        sink += tutti::cpu::maxAbs(src.data(), kCount);
        break;
    }
    benchmark::DoNotOptimize(sink);
    benchmark::DoNotOptimize(wire.data());
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(kCount * sizeof(float)));
}

int registerAll() {
  const struct {
    WireFormat f;
    const char* name;
  } formats[] = {
      {WireFormat::kHalf, "half"}, {WireFormat::kBf16, "bf16"}, {WireFormat::kSign, "sign"}};
  const struct {
    Op op;
    const char* name;
  } ops[] = {{Op::kEncode, "encode_err"},
             {Op::kDecode, "decode"},
             {Op::kDecodeAdd, "decode_add"},
             {Op::kQuantize, "quantize_err"}};
  // kAvx512 runs the same (AVX2) codec loops as kAvx2.
  for (KernelIsa isa : {KernelIsa::kGeneric, KernelIsa::kAvx2}) {
    if (!tutti::cpu::isaSupported(isa)) continue;
    const std::string suffix = std::string("/") + tutti::cpu::isaName(isa);
    benchmark::RegisterBenchmark(("max_abs" + suffix).c_str(), [isa](benchmark::State& st) {
      run(st, WireFormat::kHalf, Op::kMaxAbs, isa);
    })->Unit(benchmark::kMillisecond);
    for (const auto& fmt : formats) {
      for (const auto& o : ops) {
        const std::string name = std::string(o.name) + "/" + fmt.name + suffix;
        const WireFormat f = fmt.f;
        const Op op = o.op;
        benchmark::RegisterBenchmark(name.c_str(), [f, op, isa](benchmark::State& st) {
          run(st, f, op, isa);
        })->Unit(benchmark::kMillisecond);
      }
    }
  }
  return 0;
}

const int kRegistered = registerAll();

}  // namespace

BENCHMARK_MAIN();
