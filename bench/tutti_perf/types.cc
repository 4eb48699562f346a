#include "types.h"

#include <cmath>
#include <cstring>
#include <limits>

namespace tutti::perf {
namespace {

// A binary floating-point format narrower than float: fp16, bf16 and the two
// OCP fp8 formats. `ieee` formats reserve the top exponent for inf/NaN; e4m3
// ("fn") has no infinity and only S.1111.111 is NaN.
struct MiniFloat {
  int exp_bits;
  int man_bits;
  int bias;
  bool ieee;
};

constexpr MiniFloat kHalf{5, 10, 15, true};
constexpr MiniFloat kBf16{8, 7, 127, true};
constexpr MiniFloat kE4m3{4, 3, 7, false};
constexpr MiniFloat kE5m2{5, 2, 15, true};

uint32_t miniMaxFinite(const MiniFloat& f) {
  uint32_t exp_all = (1u << f.exp_bits) - 1;
  uint32_t man_all = (1u << f.man_bits) - 1;
  if (f.ieee) return ((exp_all - 1) << f.man_bits) | man_all;
  return (exp_all << f.man_bits) | (man_all - 1);
}

uint32_t miniEncode(const MiniFloat& f, double v) {
  const uint32_t sign = std::signbit(v) ? 1u << (f.exp_bits + f.man_bits) : 0u;
  const uint32_t exp_all = (1u << f.exp_bits) - 1;
  const uint32_t man_all = (1u << f.man_bits) - 1;
  if (std::isnan(v))
    return sign | (exp_all << f.man_bits) | (f.ieee ? 1u << (f.man_bits - 1) : man_all);
  double a = std::fabs(v);
  if (std::isinf(a)) return sign | (f.ieee ? exp_all << f.man_bits : miniMaxFinite(f));
  if (a == 0) return sign;
  int e = 0;
  double frac = std::frexp(a, &e);  // a = frac * 2^e, frac in [0.5, 1)
  int biased = e - 1 + f.bias;
  uint32_t man;
  if (biased >= 1) {
    man = static_cast<uint32_t>(std::nearbyint(std::ldexp(2 * frac - 1, f.man_bits)));
    if (man > man_all) {
      man = 0;
      ++biased;
    }
  } else {
    man = static_cast<uint32_t>(std::nearbyint(std::ldexp(a, f.man_bits - 1 + f.bias)));
    biased = man > man_all ? 1 : 0;
    if (man > man_all) man = 0;
  }
  uint32_t bits = (static_cast<uint32_t>(biased) << f.man_bits) | man;
  if (biased > static_cast<int>(exp_all) || bits > miniMaxFinite(f)) bits = miniMaxFinite(f);
  return sign | bits;
}

double miniDecode(const MiniFloat& f, uint32_t bits) {
  const uint32_t exp_all = (1u << f.exp_bits) - 1;
  const uint32_t man_all = (1u << f.man_bits) - 1;
  const bool neg = (bits >> (f.exp_bits + f.man_bits)) & 1;
  const uint32_t ef = (bits >> f.man_bits) & exp_all;
  const uint32_t mf = bits & man_all;
  double v;
  if (f.ieee && ef == exp_all) {
    v = mf ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (!f.ieee && ef == exp_all && mf == man_all) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (ef == 0) {
    v = std::ldexp(static_cast<double>(mf), 1 - f.bias - f.man_bits);
  } else {
    v = std::ldexp(static_cast<double>((1u << f.man_bits) | mf),
                   static_cast<int>(ef) - f.bias - f.man_bits);
  }
  return neg ? -v : v;
}

const MiniFloat* miniFormat(ncclDataType_t t) {
  switch (t) {
    case ncclFloat16:
      return &kHalf;
    case ncclBfloat16:
      return &kBf16;
    case ncclFloat8e4m3:
      return &kE4m3;
    case ncclFloat8e5m2:
      return &kE5m2;
    default:
      return nullptr;
  }
}

constexpr int64_t k2p30 = int64_t{1} << 30;
constexpr int64_t k2p40 = int64_t{1} << 40;

const TypeInfo kTypes[] = {
    {ncclInt8, "int8", 1, false, true, 127, 6},
    {ncclUint8, "uint8", 1, false, false, 255, 7},
    {ncclInt32, "int32", 4, false, true, k2p30, 30},
    {ncclUint32, "uint32", 4, false, false, k2p30, 30},
    {ncclInt64, "int64", 8, false, true, k2p40, 30},
    {ncclUint64, "uint64", 8, false, false, k2p40, 30},
    {ncclFloat16, "half", 2, true, true, 2048, 15},
    {ncclFloat32, "float", 4, true, true, int64_t{1} << 24, 30},
    {ncclFloat64, "double", 8, true, true, k2p40, 30},
    {ncclBfloat16, "bfloat16", 2, true, true, 256, 30},
    {ncclFloat8e4m3, "f8e4m3", 1, true, true, 16, 8},
    {ncclFloat8e5m2, "f8e5m2", 1, true, true, 8, 15},
};

struct Alias {
  const char* alias;
  ncclDataType_t type;
};
const Alias kAliases[] = {
    {"char", ncclInt8},          {"int", ncclInt32},       {"float16", ncclFloat16},
    {"fp16", ncclFloat16},       {"float32", ncclFloat32}, {"fp32", ncclFloat32},
    {"float64", ncclFloat64},    {"fp64", ncclFloat64},    {"bf16", ncclBfloat16},
    {"fp8e4m3", ncclFloat8e4m3}, {"e4m3", ncclFloat8e4m3}, {"float8e4m3", ncclFloat8e4m3},
    {"fp8e5m2", ncclFloat8e5m2}, {"e5m2", ncclFloat8e5m2}, {"float8e5m2", ncclFloat8e5m2},
};

}  // namespace

const std::vector<const TypeInfo*>& allTypes() {
  static const std::vector<const TypeInfo*> types = [] {
    std::vector<const TypeInfo*> v;
    for (const TypeInfo& t : kTypes) v.push_back(&t);
    return v;
  }();
  return types;
}

const TypeInfo& typeInfo(ncclDataType_t type) {
  for (const TypeInfo& t : kTypes) {
    if (t.type == type) return t;
  }
  return kTypes[7];
}

const TypeInfo* findType(const std::string& name) {
  for (const TypeInfo& t : kTypes) {
    if (name == t.name) return &t;
  }
  for (const Alias& a : kAliases) {
    if (name == a.alias) return &typeInfo(a.type);
  }
  return nullptr;
}

std::string typeNames() {
  std::string s;
  for (const TypeInfo& t : kTypes) {
    if (!s.empty()) s += ", ";
    s += t.name;
  }
  return s;
}

const char* opName(Op op) {
  switch (op) {
    case Op::kSum:
      return "sum";
    case Op::kProd:
      return "prod";
    case Op::kMax:
      return "max";
    case Op::kMin:
      return "min";
    case Op::kAvg:
      return "avg";
    case Op::kPreMulSum:
      return "mulsum";  // nccl-tests' spelling
    case Op::kNone:
      break;
  }
  return "none";
}

bool parseOp(const std::string& name, Op* op) {
  for (Op o : allOps()) {
    if (name == opName(o)) {
      *op = o;
      return true;
    }
  }
  if (name == "premulsum") {
    *op = Op::kPreMulSum;
    return true;
  }
  return false;
}

const std::vector<Op>& allOps() {
  static const std::vector<Op> ops = {Op::kSum, Op::kProd, Op::kMax,
                                      Op::kMin, Op::kAvg,  Op::kPreMulSum};
  return ops;
}

void encodeValue(const TypeInfo& t, double value, void* dst) {
  switch (t.type) {
    case ncclInt8: {
      auto v = static_cast<int8_t>(value);
      std::memcpy(dst, &v, 1);
      return;
    }
    case ncclUint8: {
      auto v = static_cast<uint8_t>(value);
      std::memcpy(dst, &v, 1);
      return;
    }
    case ncclInt32: {
      auto v = static_cast<int32_t>(value);
      std::memcpy(dst, &v, 4);
      return;
    }
    case ncclUint32: {
      auto v = static_cast<uint32_t>(value);
      std::memcpy(dst, &v, 4);
      return;
    }
    case ncclInt64: {
      auto v = static_cast<int64_t>(value);
      std::memcpy(dst, &v, 8);
      return;
    }
    case ncclUint64: {
      auto v = static_cast<uint64_t>(value);
      std::memcpy(dst, &v, 8);
      return;
    }
    case ncclFloat32: {
      auto v = static_cast<float>(value);
      std::memcpy(dst, &v, 4);
      return;
    }
    case ncclFloat64:
      std::memcpy(dst, &value, 8);
      return;
    default:
      break;
  }
  const MiniFloat* f = miniFormat(t.type);
  if (f == nullptr) return;
  uint32_t bits = miniEncode(*f, value);
  if (t.size == 2) {
    auto v = static_cast<uint16_t>(bits);
    std::memcpy(dst, &v, 2);
  } else {
    auto v = static_cast<uint8_t>(bits);
    std::memcpy(dst, &v, 1);
  }
}

double decodeValue(const TypeInfo& t, const void* src) {
  switch (t.type) {
    case ncclInt8: {
      int8_t v;
      std::memcpy(&v, src, 1);
      return v;
    }
    case ncclUint8: {
      uint8_t v;
      std::memcpy(&v, src, 1);
      return v;
    }
    case ncclInt32: {
      int32_t v;
      std::memcpy(&v, src, 4);
      return v;
    }
    case ncclUint32: {
      uint32_t v;
      std::memcpy(&v, src, 4);
      return v;
    }
    case ncclInt64: {
      int64_t v;
      std::memcpy(&v, src, 8);
      return static_cast<double>(v);
    }
    case ncclUint64: {
      uint64_t v;
      std::memcpy(&v, src, 8);
      return static_cast<double>(v);
    }
    case ncclFloat32: {
      float v;
      std::memcpy(&v, src, 4);
      return v;
    }
    case ncclFloat64: {
      double v;
      std::memcpy(&v, src, 8);
      return v;
    }
    default:
      break;
  }
  const MiniFloat* f = miniFormat(t.type);
  if (f == nullptr) return std::numeric_limits<double>::quiet_NaN();
  uint32_t bits;
  if (t.size == 2) {
    uint16_t v;
    std::memcpy(&v, src, 2);
    bits = v;
  } else {
    uint8_t v;
    std::memcpy(&v, src, 1);
    bits = v;
  }
  return miniDecode(*f, bits);
}

double roundoff(const TypeInfo& t) {
  if (!t.is_float) return 0;
  switch (t.type) {
    case ncclFloat32:
      return std::ldexp(1.0, -24);
    case ncclFloat64:
      return std::ldexp(1.0, -53);
    default:
      return std::ldexp(1.0, -(miniFormat(t.type)->man_bits + 1));
  }
}

}  // namespace tutti::perf
