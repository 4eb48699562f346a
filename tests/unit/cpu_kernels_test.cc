// backends/cpu/kernels.h, every instruction-set variant, every datatype and op,
// against a reference computed independently in fp64 (floating types) or with
// exact 64-bit wrapping arithmetic (integers). Results must match bit for bit;
// where the reference is NaN the result must be a NaN (payload unspecified).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "backends/cpu/kernel_dispatch.h"
#include "backends/cpu/kernels.h"

namespace tutti::cpu {
namespace {

// ---- independent reference for the narrow float formats ----------------------

struct Narrow {
  int expBits;
  int manBits;
  bool ieee;  // false: e4m3fn (single NaN pattern, saturating)
};

int narrowBits(const Narrow& f) { return 1 + f.expBits + f.manBits; }

double narrowDecode(const Narrow& f, uint64_t v) {
  const int bias = (1 << (f.expBits - 1)) - 1;
  const int sign = (v >> (f.expBits + f.manBits)) & 1;
  const int e = (v >> f.manBits) & ((1 << f.expBits) - 1);
  const int m = v & ((1 << f.manBits) - 1);
  const int eMax = (1 << f.expBits) - 1;
  double mag;
  if ((f.ieee && e == eMax) || (!f.ieee && e == eMax && m == (1 << f.manBits) - 1)) {
    mag = (f.ieee && m == 0) ? std::numeric_limits<double>::infinity()
                             : std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    mag = std::ldexp(m, 1 - bias - f.manBits);
  } else {
    mag = std::ldexp(m + (1 << f.manBits), e - bias - f.manBits);
  }
  return sign ? -mag : mag;
}

// Round a double that holds an fp32 value to the format: nearest, ties to even
// encoding, overflow to inf (ieee) or saturate (e4m3). Returns bits; NaN in ->
// the all-ones NaN pattern.
class NarrowEncoder {
 public:
  explicit NarrowEncoder(Narrow f) : f_(f) {
    for (uint64_t v = 0; v < (1u << (narrowBits(f) - 1)); ++v) {
      const double d = narrowDecode(f, v);
      if (std::isfinite(d)) values_.push_back({d, v});
    }
    std::sort(values_.begin(), values_.end());
    max_ = values_.back().first;
    maxBits_ = values_.back().second;
    topUlp_ = std::ldexp(1.0, std::ilogb(max_) - f.manBits);
  }
  uint64_t encode(double x) const {
    const uint64_t sign = std::signbit(x) ? 1ull << (narrowBits(f_) - 1) : 0;
    const uint64_t inf = ((1ull << f_.expBits) - 1) << f_.manBits;
    const double v = std::fabs(x);
    if (std::isnan(v)) return sign | inf | ((1ull << f_.manBits) - 1);
    if (v > max_) return sign | (f_.ieee && v >= max_ + topUlp_ / 2 ? inf : maxBits_);
    auto it = std::lower_bound(values_.begin(), values_.end(), std::make_pair(v, uint64_t{0}));
    if (it->first == v) return sign | it->second;
    const auto lo = *(it - 1);
    const auto hi = *it;
    if (v - lo.first < hi.first - v) return sign | lo.second;
    if (hi.first - v < v - lo.first) return sign | hi.second;
    return sign | ((lo.second & 1) == 0 ? lo.second : hi.second);
  }

 private:
  Narrow f_;
  std::vector<std::pair<double, uint64_t>> values_;
  double max_ = 0;
  uint64_t maxBits_ = 0;
  double topUlp_ = 0;
};

// ---- per-type model --------------------------------------------------------------

enum class Kind { kSigned, kUnsigned, kF32, kF64, kNarrow };

struct TypeModel {
  DataType dt;
  const char* name;
  Kind kind;
  int bytes;
  Narrow narrow;  // kNarrow only
};

const TypeModel kTypes[] = {
    {DataType::kInt8, "int8", Kind::kSigned, 1, {}},
    {DataType::kUint8, "uint8", Kind::kUnsigned, 1, {}},
    {DataType::kInt32, "int32", Kind::kSigned, 4, {}},
    {DataType::kUint32, "uint32", Kind::kUnsigned, 4, {}},
    {DataType::kInt64, "int64", Kind::kSigned, 8, {}},
    {DataType::kUint64, "uint64", Kind::kUnsigned, 8, {}},
    {DataType::kFloat16, "float16", Kind::kNarrow, 2, {5, 10, true}},
    {DataType::kFloat32, "float32", Kind::kF32, 4, {}},
    {DataType::kFloat64, "float64", Kind::kF64, 8, {}},
    {DataType::kBfloat16, "bfloat16", Kind::kNarrow, 2, {8, 7, true}},
    {DataType::kFloat8e4m3, "e4m3", Kind::kNarrow, 1, {4, 3, false}},
    {DataType::kFloat8e5m2, "e5m2", Kind::kNarrow, 1, {5, 2, true}},
};

uint64_t mask(const TypeModel& t) { return t.bytes == 8 ? ~0ull : (1ull << (8 * t.bytes)) - 1; }

int64_t sext(const TypeModel& t, uint64_t v) {
  const int shift = 64 - 8 * t.bytes;
  return static_cast<int64_t>(v << shift) >> shift;
}

double f32Of(uint64_t v) {
  float f;
  const uint32_t u = static_cast<uint32_t>(v);
  std::memcpy(&f, &u, 4);
  return f;
}
uint64_t bitsOfF32(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
double f64Of(uint64_t v) {
  double d;
  std::memcpy(&d, &v, 8);
  return d;
}
uint64_t bitsOfF64(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}

// Values are carried as raw bits (uint64). Floating values are first decoded to
// double; a narrow type's computation is fp32 (every fp32 op computed in fp64
// and rounded to fp32 equals the IEEE fp32 op), then one rounding to the format.
struct Ref {
  const TypeModel& t;
  NarrowEncoder enc;
  explicit Ref(const TypeModel& type)
      : t(type), enc(type.kind == Kind::kNarrow ? type.narrow : Narrow{5, 10, true}) {}

  bool isFloat() const {
    return t.kind == Kind::kF32 || t.kind == Kind::kF64 || t.kind == Kind::kNarrow;
  }

  double toDouble(uint64_t v) const {
    switch (t.kind) {
      case Kind::kF32:
        return f32Of(v);
      case Kind::kF64:
        return f64Of(v);
      case Kind::kNarrow:
        return narrowDecode(t.narrow, v);
      default:
        return 0;
    }
  }
  // Rounds an fp64 result to the working precision (fp32 unless float64).
  double work(double x) const {
    return t.kind == Kind::kF64 ? x : static_cast<double>(static_cast<float>(x));
  }
  uint64_t fromWork(double x) const {
    switch (t.kind) {
      case Kind::kF32:
        return bitsOfF32(static_cast<float>(x));
      case Kind::kF64:
        return bitsOfF64(x);
      default:
        return enc.encode(x);
    }
  }
  bool isNan(uint64_t v) const { return isFloat() && std::isnan(toDouble(v)); }

  // Floating binary op in working precision.
  double fop(RedOp op, double a, double b) const {
    switch (op) {
      case RedOp::kProd:
        return work(a * b);
      case RedOp::kMax:
        return std::isnan(a) ? a : (a > b ? a : b);
      case RedOp::kMin:
        return std::isnan(a) ? a : (a < b ? a : b);
      default:
        return work(a + b);
    }
  }
  uint64_t iop(RedOp op, uint64_t a, uint64_t b) const {
    const bool sgn = t.kind == Kind::kSigned;
    switch (op) {
      case RedOp::kProd:
        return (a * b) & mask(t);
      case RedOp::kMax:
        return (sgn ? sext(t, a) > sext(t, b) : a > b) ? a : b;
      case RedOp::kMin:
        return (sgn ? sext(t, a) < sext(t, b) : a < b) ? a : b;
      default:
        return (a + b) & mask(t);
    }
  }
  uint64_t reduce(RedOp op, uint64_t a, uint64_t b) const {
    if (!isFloat()) return iop(op, a, b);
    return fromWork(fop(op, toDouble(a), toDouble(b)));
  }
  uint64_t reduceN(RedOp op, const std::vector<uint64_t>& xs) const {
    if (!isFloat()) {
      uint64_t acc = xs[0];
      for (size_t k = 1; k < xs.size(); ++k) acc = iop(op, acc, xs[k]);
      return acc;
    }
    double acc = work(toDouble(xs[0]));
    for (size_t k = 1; k < xs.size(); ++k) acc = fop(op, acc, toDouble(xs[k]));
    return fromWork(acc);
  }
  // The scalar as the kernels convert it (kernels.h).
  uint64_t intScalar(double s) const {
    if (std::isnan(s)) return 0;
    if (t.kind == Kind::kUnsigned && t.bytes == 8 && s >= 9223372036854775808.0) {
      return s >= 18446744073709551616.0 ? ~0ull : static_cast<uint64_t>(s);
    }
    const double c = std::max(-9223372036854775808.0, std::min(s, 9223372036854775807.0));
    const int64_t v = c >= 9223372036854775807.0 ? INT64_MAX : static_cast<int64_t>(c);
    return static_cast<uint64_t>(v) & mask(t);
  }
  double floatScalar(double s) const { return t.kind == Kind::kF64 ? s : work(s); }
  uint64_t preMul(double s, uint64_t a, uint64_t b) const {
    if (!isFloat()) return (a + intScalar(s) * b) & mask(t);
    const double p = work(floatScalar(s) * toDouble(b));
    return fromWork(work(toDouble(a) + p));
  }
  uint64_t scale(double s, uint64_t x) const {
    if (!isFloat()) return (intScalar(s) * x) & mask(t);
    return fromWork(work(floatScalar(s) * toDouble(x)));
  }
  uint64_t divide(int64_t n, uint64_t x) const {
    if (t.kind == Kind::kSigned) return static_cast<uint64_t>(sext(t, x) / n) & mask(t);
    if (t.kind == Kind::kUnsigned) return x / static_cast<uint64_t>(n);
    return fromWork(work(toDouble(x) / floatScalar(static_cast<double>(n))));
  }
};

// ---- buffers -------------------------------------------------------------------------

constexpr uint8_t kGuard = 0xa5;
constexpr size_t kPad = 16;

// A buffer of count elements starting `offset` bytes past a 16-aligned base,
// surrounded by guard bytes.
class Buf {
 public:
  Buf(const TypeModel& t, size_t count, size_t offset)
      : t_(t), count_(count), offset_(offset), mem_(count * t.bytes + 2 * kPad + 64, kGuard) {
    const uintptr_t base = reinterpret_cast<uintptr_t>(mem_.data()) + kPad;
    start_ = ((base + 15) & ~uintptr_t{15}) + offset - reinterpret_cast<uintptr_t>(mem_.data());
  }
  uint8_t* data() { return mem_.data() + start_; }
  uint64_t get(size_t i) const {
    uint64_t v = 0;
    std::memcpy(&v, mem_.data() + start_ + i * t_.bytes, t_.bytes);
    return v;
  }
  void set(size_t i, uint64_t v) { std::memcpy(mem_.data() + start_ + i * t_.bytes, &v, t_.bytes); }
  bool guardsIntact() const {
    for (size_t i = 0; i < start_; ++i)
      if (mem_[i] != kGuard) return false;
    for (size_t i = start_ + count_ * t_.bytes; i < mem_.size(); ++i)
      if (mem_[i] != kGuard) return false;
    return true;
  }

 private:
  const TypeModel& t_;
  size_t count_;
  size_t offset_;
  std::vector<uint8_t> mem_;
  size_t start_ = 0;
};

uint64_t randomValue(const TypeModel& t, std::mt19937_64& rng) {
  const uint64_t r = rng();
  switch (t.kind) {
    case Kind::kSigned:
    case Kind::kUnsigned: {
      // Mostly full-range (wrapping), some small values (division, products).
      if (rng() % 4 == 0) return (rng() % 200) & mask(t);
      return r & mask(t);
    }
    case Kind::kF32: {
      const int kind = static_cast<int>(rng() % 16);
      if (kind == 0) return r & 0xffffffffu;  // anything: NaN, inf, subnormal, huge
      if (kind == 1) {
        const float specials[] = {0.0f,
                                  -0.0f,
                                  std::numeric_limits<float>::infinity(),
                                  -std::numeric_limits<float>::infinity(),
                                  std::nanf(""),
                                  std::numeric_limits<float>::denorm_min(),
                                  std::numeric_limits<float>::max(),
                                  1.0f};
        return bitsOfF32(specials[rng() % 8]);
      }
      const uint32_t e = 127 - 12 + static_cast<uint32_t>(rng() % 25);
      return ((r & 1) << 31) | (e << 23) | ((r >> 8) & 0x7fffff);
    }
    case Kind::kF64: {
      const int kind = static_cast<int>(rng() % 16);
      if (kind == 0) return r;
      if (kind == 1) {
        const double specials[] = {0.0,
                                   -0.0,
                                   std::numeric_limits<double>::infinity(),
                                   std::nan(""),
                                   std::numeric_limits<double>::denorm_min(),
                                   std::numeric_limits<double>::max()};
        return bitsOfF64(specials[rng() % 6]);
      }
      const uint64_t e = 1023 - 12 + rng() % 25;
      return (r & (1ull << 63)) | (e << 52) | (rng() & ((1ull << 52) - 1));
    }
    case Kind::kNarrow: {
      const Narrow& f = t.narrow;
      uint64_t v = r & ((1ull << narrowBits(f)) - 1);
      if (rng() % 2 == 0) {  // similar magnitudes: rounding of nearby sums
        const uint64_t bias = (1ull << (f.expBits - 1)) - 1;
        const uint64_t e = bias - 2 + rng() % 5;
        v = (v & ~(((1ull << f.expBits) - 1) << f.manBits)) | (e << f.manBits);
      }
      return v;
    }
  }
  return 0;
}

const size_t kCounts[] = {0, 1, 7, 31, 1000, 4099};

enum class Alias { kNone, kDstIsA, kDstIsB };

std::string aliasName(Alias a) {
  return a == Alias::kNone ? "separate" : a == Alias::kDstIsA ? "dst==a" : "dst==b";
}

class CpuKernelTest : public ::testing::TestWithParam<std::tuple<KernelIsa, int>> {
 protected:
  void SetUp() override {
    isa_ = std::get<0>(GetParam());
    if (!isaSupported(isa_)) GTEST_SKIP() << isaName(isa_) << " not supported by this CPU";
    ASSERT_TRUE(setActiveIsa(isa_));
  }
  const TypeModel& type() const { return kTypes[std::get<1>(GetParam())]; }

  bool same(const Ref& ref, uint64_t got, uint64_t want) const {
    if (ref.isNan(want)) return ref.isNan(got);
    return got == want;
  }

  // Runs a two-input kernel over every count, alignment and aliasing mode and
  // compares with the element-wise reference.
  template <class Kernel, class Model>
  void checkBinary(const std::string& what, Kernel kernel, Model model) {
    const TypeModel& t = type();
    const Ref ref(t);
    std::mt19937_64 rng(0x51ed + std::get<1>(GetParam()));
    int failures = 0;
    for (size_t count : kCounts) {
      for (size_t off = 0; off < 8; ++off) {
        for (Alias alias : {Alias::kNone, Alias::kDstIsA, Alias::kDstIsB}) {
          Buf a(t, count, off), b(t, count, (off + 3) % 8), d(t, count, (off + 5) % 8);
          std::vector<uint64_t> va(count), vb(count);
          for (size_t i = 0; i < count; ++i) {
            va[i] = randomValue(t, rng);
            vb[i] = randomValue(t, rng);
            a.set(i, va[i]);
            b.set(i, vb[i]);
          }
          Buf* dst = alias == Alias::kDstIsA ? &a : alias == Alias::kDstIsB ? &b : &d;
          kernel(dst->data(), a.data(), b.data(), count);
          ASSERT_TRUE(dst->guardsIntact()) << what << " wrote outside dst, count " << count;
          if (alias != Alias::kDstIsA) {
            ASSERT_TRUE(a.guardsIntact());
          }
          for (size_t i = 0; i < count && failures < 10; ++i) {
            const uint64_t want = model(ref, va[i], vb[i]);
            const uint64_t got = dst->get(i);
            if (!same(ref, got, want)) {
              ++failures;
              ADD_FAILURE() << what << " " << t.name << " [" << isaName(isa_) << "] count " << count
                            << " offset " << off << " " << aliasName(alias) << " i=" << i
                            << ": a=0x" << std::hex << va[i] << " b=0x" << vb[i] << " got 0x" << got
                            << " want 0x" << want;
            }
          }
          if (alias == Alias::kNone) {
            for (size_t i = 0; i < count; ++i) ASSERT_EQ(a.get(i), va[i]) << "input modified";
          }
        }
      }
    }
    EXPECT_EQ(failures, 0);
  }

  template <class Kernel, class Model>
  void checkUnary(const std::string& what, Kernel kernel, Model model) {
    const TypeModel& t = type();
    const Ref ref(t);
    std::mt19937_64 rng(0xd1e + std::get<1>(GetParam()));
    int failures = 0;
    for (size_t count : kCounts) {
      for (size_t off = 0; off < 8; ++off) {
        for (bool inPlace : {false, true}) {
          Buf s(t, count, off), d(t, count, (off + 3) % 8);
          std::vector<uint64_t> vs(count);
          for (size_t i = 0; i < count; ++i) {
            vs[i] = randomValue(t, rng);
            s.set(i, vs[i]);
          }
          Buf* dst = inPlace ? &s : &d;
          kernel(dst->data(), s.data(), count);
          ASSERT_TRUE(dst->guardsIntact()) << what << " wrote outside dst";
          for (size_t i = 0; i < count && failures < 10; ++i) {
            const uint64_t want = model(ref, vs[i]);
            const uint64_t got = dst->get(i);
            if (!same(ref, got, want)) {
              ++failures;
              ADD_FAILURE() << what << " " << t.name << " [" << isaName(isa_) << "] count " << count
                            << " offset " << off << (inPlace ? " in place" : "") << " i=" << i
                            << ": x=0x" << std::hex << vs[i] << " got 0x" << got << " want 0x"
                            << want;
            }
          }
        }
      }
    }
    EXPECT_EQ(failures, 0);
  }

  KernelIsa isa_ = KernelIsa::kGeneric;
};

TEST_P(CpuKernelTest, ReduceAllOps) {
  for (RedOp op : {RedOp::kSum, RedOp::kProd, RedOp::kMax, RedOp::kMin}) {
    const DataType dt = type().dt;
    checkBinary(
        std::string("reduce ") + redOpName(op),
        [&](void* d, const void* a, const void* b, size_t n) { reduce(d, a, b, n, dt, op); },
        [&](const Ref& r, uint64_t a, uint64_t b) { return r.reduce(op, a, b); });
  }
}

TEST_P(CpuKernelTest, ReduceMapsAvgToSum) {
  const DataType dt = type().dt;
  checkBinary(
      "reduce avg-as-sum",
      [&](void* d, const void* a, const void* b, size_t n) { reduce(d, a, b, n, dt, RedOp::kAvg); },
      [&](const Ref& r, uint64_t a, uint64_t b) { return r.reduce(RedOp::kSum, a, b); });
}

TEST_P(CpuKernelTest, PreMulReduce) {
  const DataType dt = type().dt;
  for (double s : {1.0, -2.5, 0.3, 3.0, 1e10}) {
    checkBinary(
        "premulsum s=" + std::to_string(s),
        [&](void* d, const void* a, const void* b, size_t n) { preMulReduce(d, a, b, n, dt, s); },
        [&](const Ref& r, uint64_t a, uint64_t b) { return r.preMul(s, a, b); });
  }
}

TEST_P(CpuKernelTest, Scale) {
  const DataType dt = type().dt;
  for (double s : {1.0, -2.5, 0.3, 0.125, 1e10}) {
    checkUnary(
        "scale s=" + std::to_string(s),
        [&](void* d, const void* x, size_t n) { scale(d, x, n, dt, s); },
        [&](const Ref& r, uint64_t x) { return r.scale(s, x); });
  }
}

TEST_P(CpuKernelTest, Divide) {
  const DataType dt = type().dt;
  for (int64_t n : {1, 3, 7, 8}) {
    checkUnary(
        "divide n=" + std::to_string(n),
        [&](void* d, const void* x, size_t c) { divide(d, x, c, dt, n); },
        [&](const Ref& r, uint64_t x) { return r.divide(n, x); });
  }
}

TEST_P(CpuKernelTest, ReduceN) {
  const TypeModel& t = type();
  const Ref ref(t);
  std::mt19937_64 rng(0xabc + std::get<1>(GetParam()));
  int failures = 0;
  for (RedOp op : {RedOp::kSum, RedOp::kProd, RedOp::kMax, RedOp::kMin}) {
    for (int n = 1; n <= 5; ++n) {
      for (size_t count : kCounts) {
        for (bool dstIsFirst : {false, true}) {
          const size_t off = (count + n) % 8;
          std::vector<Buf> srcs;
          srcs.reserve(n);
          std::vector<std::vector<uint64_t>> vals(n, std::vector<uint64_t>(count));
          for (int k = 0; k < n; ++k) {
            srcs.emplace_back(t, count, (off + k) % 8);
            for (size_t i = 0; i < count; ++i) {
              vals[k][i] = randomValue(t, rng);
              srcs[k].set(i, vals[k][i]);
            }
          }
          Buf d(t, count, (off + 7) % 8);
          std::vector<const void*> ptrs;
          for (auto& s : srcs) ptrs.push_back(s.data());
          Buf* dst = dstIsFirst ? &srcs[0] : &d;
          reduceN(dst->data(), ptrs.data(), n, count, t.dt, op);
          ASSERT_TRUE(dst->guardsIntact());
          for (size_t i = 0; i < count && failures < 10; ++i) {
            std::vector<uint64_t> xs(n);
            for (int k = 0; k < n; ++k) xs[k] = vals[k][i];
            const uint64_t want = ref.reduceN(op, xs);
            const uint64_t got = dst->get(i);
            if (!same(ref, got, want)) {
              ++failures;
              ADD_FAILURE() << "reduceN " << redOpName(op) << " n=" << n << " " << t.name << " ["
                            << isaName(isa_) << "] count " << count
                            << (dstIsFirst ? " dst==srcs[0]" : "") << " i=" << i << " got 0x"
                            << std::hex << got << " want 0x" << want;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(failures, 0);
}

// dst == a == b is legal too (x OP x).
TEST_P(CpuKernelTest, ReduceWithItself) {
  const TypeModel& t = type();
  const Ref ref(t);
  std::mt19937_64 rng(77);
  for (RedOp op : {RedOp::kSum, RedOp::kProd, RedOp::kMax, RedOp::kMin}) {
    Buf a(t, 1000, 3);
    std::vector<uint64_t> va(1000);
    for (size_t i = 0; i < va.size(); ++i) a.set(i, va[i] = randomValue(t, rng));
    reduce(a.data(), a.data(), a.data(), va.size(), t.dt, op);
    for (size_t i = 0; i < va.size(); ++i) {
      ASSERT_TRUE(same(ref, a.get(i), ref.reduce(op, va[i], va[i]))) << redOpName(op) << " i=" << i;
    }
  }
}

std::string paramName(const ::testing::TestParamInfo<std::tuple<KernelIsa, int>>& info) {
  return std::string(isaName(std::get<0>(info.param))) + "_" + kTypes[std::get<1>(info.param)].name;
}

INSTANTIATE_TEST_SUITE_P(AllTypes, CpuKernelTest,
                         ::testing::Combine(::testing::Values(KernelIsa::kGeneric, KernelIsa::kAvx2,
                                                              KernelIsa::kAvx512),
                                            ::testing::Range(0, 12)),
                         paramName);

TEST(CpuKernelSpecial, MaxMinPropagateNanAndSignedZero) {
  const float nan = std::nanf("");
  const float a[] = {nan, 1.0f, -0.0f, 0.0f, 2.0f};
  const float b[] = {1.0f, nan, 0.0f, -0.0f, 2.0f};
  float mx[5], mn[5];
  reduce(mx, a, b, 5, DataType::kFloat32, RedOp::kMax);
  reduce(mn, a, b, 5, DataType::kFloat32, RedOp::kMin);
  EXPECT_TRUE(std::isnan(mx[0]) && std::isnan(mx[1]));
  EXPECT_TRUE(std::isnan(mn[0]) && std::isnan(mn[1]));
  EXPECT_FALSE(std::signbit(mx[2]));  // equal operands: b
  EXPECT_TRUE(std::signbit(mx[3]));
  EXPECT_EQ(mx[4], 2.0f);
}

TEST(CpuKernelSpecial, IntegerWrapAndScalarCast) {
  const int32_t a[] = {INT32_MAX, INT32_MIN, -7};
  const int32_t b[] = {1, -1, 2};
  int32_t d[3];
  reduce(d, a, b, 3, DataType::kInt32, RedOp::kSum);
  EXPECT_EQ(d[0], INT32_MIN);
  EXPECT_EQ(d[1], INT32_MAX);
  divide(d, a, 3, DataType::kInt32, 2);
  EXPECT_EQ(d[2], -3);                               // truncation toward zero
  preMulReduce(d, a, b, 3, DataType::kInt32, -2.7);  // scalar -> -2
  EXPECT_EQ(d[2], -11);
  const uint64_t u[] = {3};
  uint64_t du[1];
  scale(du, u, 1, DataType::kUint64, 18446744073709549568.0);  // 2^64 - 2048
  EXPECT_EQ(du[0], 18446744073709549568ull * 3);
}

TEST(CpuKernelSpecial, E4M3SaturatesInKernels) {
  const uint8_t a[] = {0x7e, 0xfe};  // +-448
  const uint8_t b[] = {0x7e, 0xfe};
  uint8_t d[2];
  reduce(d, a, b, 2, DataType::kFloat8e4m3, RedOp::kSum);
  EXPECT_EQ(d[0], 0x7e);
  EXPECT_EQ(d[1], 0xfe);
}

TEST(CpuKernelSpecial, CountZeroTouchesNothing) {
  reduce(nullptr, nullptr, nullptr, 0, DataType::kFloat32, RedOp::kSum);
  preMulReduce(nullptr, nullptr, nullptr, 0, DataType::kFloat16, 2.0);
  scale(nullptr, nullptr, 0, DataType::kInt8, 2.0);
  divide(nullptr, nullptr, 0, DataType::kInt64, 3);
  reduceN(nullptr, nullptr, 3, 0, DataType::kBfloat16, RedOp::kMax);
}

TEST(CpuKernelSpecial, InvalidEnumsDoNothing) {
  float a[4] = {1, 2, 3, 4}, d[4] = {9, 9, 9, 9};
  reduce(d, a, a, 4, static_cast<DataType>(42), RedOp::kSum);
  reduce(d, a, a, 4, DataType::kFloat32, static_cast<RedOp>(42));
  for (float x : d) EXPECT_EQ(x, 9.0f);
}

TEST(CpuKernelDispatch, ActiveIsaIsSupported) {
  EXPECT_TRUE(isaSupported(KernelIsa::kGeneric));
  EXPECT_TRUE(isaSupported(activeIsa()));
  EXPECT_TRUE(setActiveIsa(KernelIsa::kGeneric));
  EXPECT_EQ(activeIsa(), KernelIsa::kGeneric);
}

}  // namespace
}  // namespace tutti::cpu
