// tutti-perf: the NCCL datatypes and reduction operators the benchmark knows,
// and exact host conversions between double and every datatype's encoding.
//
// Contract: encodeValue/decodeValue are pure functions. encodeValue rounds to
// nearest even and saturates to the largest finite value; the benchmark only
// encodes values chosen to be exactly representable, so for those the result
// is exact. decodeValue is exact for every encoding (NaN decodes to NaN).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "nccl.h"

namespace tutti::perf {

struct TypeInfo {
  ncclDataType_t type;
  const char* name;  // as nccl-tests prints it
  size_t size;       // bytes per element
  bool is_float;
  bool is_signed;
  // Every integer in [-max_exact, max_exact] (or [0, max_exact] unsigned) is
  // representable; sums are kept within this bound.
  int64_t max_exact;
  // 2^max_pow2 (and -2^max_pow2 when signed) is representable; products of
  // +-1 and 2 are kept within this bound.
  int max_pow2;
};

// Looks a type up by name ("float", "fp32", "bf16", "f8e4m3", ...); nullptr if unknown.
const TypeInfo* findType(const std::string& name);
// The 12 NCCL 2.28 datatypes, in ncclDataType_t order.
const std::vector<const TypeInfo*>& allTypes();
const TypeInfo& typeInfo(ncclDataType_t type);
// "int8, uint8, ..." for help and error messages.
std::string typeNames();

// The reduction operators. kPreMulSum is created per communicator with
// ncclRedOpCreatePreMulSum; kNone marks collectives without a reduction.
enum class Op { kSum, kProd, kMax, kMin, kAvg, kPreMulSum, kNone };
const char* opName(Op op);
// "sum", "prod", "max", "min", "avg", "mulsum" (nccl-tests' name for
// ncclRedOpCreatePreMulSum; "premulsum" is accepted too); false if unknown.
bool parseOp(const std::string& name, Op* op);
const std::vector<Op>& allOps();

void encodeValue(const TypeInfo& t, double value, void* dst);
double decodeValue(const TypeInfo& t, const void* src);
// Unit roundoff (half an ulp at 1.0) of a floating type, 0 for integers.
double roundoff(const TypeInfo& t);

}  // namespace tutti::perf
