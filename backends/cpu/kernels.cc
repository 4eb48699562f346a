// Public entry points of kernels.h and the run-time choice of instruction set.
#include "backends/cpu/kernels.h"

#include <atomic>
#include <string>

#include "backends/cpu/kernel_dispatch.h"
#include "base/log.h"
#include "base/params.h"

namespace tutti::cpu {

namespace {

const KernelTable& tableFor(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kAvx512:
      return isa_avx512::kernelTable();
    case KernelIsa::kAvx2:
      return isa_avx2::kernelTable();
    default:
      return isa_generic::kernelTable();
  }
}

bool cpuHas(KernelIsa isa) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  const bool f16c = __builtin_cpu_supports("f16c");
  const bool avx2 = __builtin_cpu_supports("avx2") && f16c;
  switch (isa) {
    case KernelIsa::kGeneric:
      return true;
    case KernelIsa::kAvx2:
      return avx2;
    case KernelIsa::kAvx512:
      return avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  }
  return false;
#else
  return isa == KernelIsa::kGeneric;
#endif
}

KernelIsa chooseIsa() {
  const std::string want = params::getStr("TUTTI_CPU_ISA", "");
  KernelIsa best = KernelIsa::kGeneric;
  if (cpuHas(KernelIsa::kAvx512)) {
    best = KernelIsa::kAvx512;
  } else if (cpuHas(KernelIsa::kAvx2)) {
    best = KernelIsa::kAvx2;
  }
  if (!want.empty()) {
    for (KernelIsa isa : {KernelIsa::kGeneric, KernelIsa::kAvx2, KernelIsa::kAvx512}) {
      if (want == isaName(isa)) {
        if (cpuHas(isa)) return isa;
        TUTTI_WARN("TUTTI_CPU_ISA={} is not supported by this CPU; using {}", want, isaName(best));
        return best;
      }
    }
    TUTTI_WARN("TUTTI_CPU_ISA={} unknown (generic, avx2, avx512); using {}", want, isaName(best));
  }
  return best;
}

std::atomic<int> g_isa{-1};
std::atomic<const KernelTable*> g_table{nullptr};

const KernelTable& table() {
  const KernelTable* t = g_table.load(std::memory_order_acquire);
  if (t != nullptr) return *t;
  const KernelIsa isa = chooseIsa();
  int expected = -1;
  g_isa.compare_exchange_strong(expected, static_cast<int>(isa));
  t = &tableFor(static_cast<KernelIsa>(g_isa.load()));
  g_table.store(t, std::memory_order_release);
  TUTTI_INFO(log::kInit, "CPU kernels: {}", isaName(static_cast<KernelIsa>(g_isa.load())));
  return *t;
}

}  // namespace

const char* isaName(KernelIsa isa) {
  switch (isa) {
    case KernelIsa::kGeneric:
      return "generic";
    case KernelIsa::kAvx2:
      return "avx2";
    case KernelIsa::kAvx512:
      return "avx512";
  }
  return "unknown";
}

bool isaSupported(KernelIsa isa) { return cpuHas(isa); }

KernelIsa activeIsa() {
  table();
  return static_cast<KernelIsa>(g_isa.load());
}

bool setActiveIsa(KernelIsa isa) {
  if (!cpuHas(isa)) return false;
  table();  // make the lazy first choice before overriding it
  g_isa.store(static_cast<int>(isa));
  g_table.store(&tableFor(isa), std::memory_order_release);
  return true;
}

void reduce(void* dst, const void* a, const void* b, size_t count, DataType dt, RedOp op) {
  if (count == 0) return;
  table().reduce(dst, a, b, count, dt, op);
}

void preMulReduce(void* dst, const void* a, const void* b, size_t count, DataType dt,
                  double scalar) {
  if (count == 0) return;
  table().preMulReduce(dst, a, b, count, dt, scalar);
}

void scale(void* dst, const void* src, size_t count, DataType dt, double scalar) {
  if (count == 0) return;
  table().scale(dst, src, count, dt, scalar);
}

void divide(void* dst, const void* src, size_t count, DataType dt, int64_t n) {
  if (count == 0) return;
  table().divide(dst, src, count, dt, n);
}

void reduceN(void* dst, const void* const* srcs, int n, size_t count, DataType dt, RedOp op) {
  if (count == 0 || n < 1) return;
  table().reduceN(dst, srcs, n, count, dt, op);
}

}  // namespace tutti::cpu
