// Plain enums shared by every layer; values equal NCCL's (include/nccl.h) so
// the C boundary converts by cast.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tutti {

enum class DataType : int {
  kInt8 = 0,
  kUint8 = 1,
  kInt32 = 2,
  kUint32 = 3,
  kInt64 = 4,
  kUint64 = 5,
  kFloat16 = 6,
  kFloat32 = 7,
  kFloat64 = 8,
  kBfloat16 = 9,
  kFloat8e4m3 = 10,
  kFloat8e5m2 = 11,
  kNumTypes = 12,
};

// Built-in reductions (values equal ncclRedOp_t). kPreMulSum is internal: it
// stands for the ops created by ncclRedOpCreatePreMulSum and for ncclAvg on
// floating types (scalar 1/nranks).
enum class RedOp : int { kSum = 0, kProd = 1, kMax = 2, kMin = 3, kAvg = 4, kPreMulSum = 5 };

inline size_t dataTypeSize(DataType t) {
  switch (t) {
    case DataType::kInt8:
    case DataType::kUint8:
    case DataType::kFloat8e4m3:
    case DataType::kFloat8e5m2:
      return 1;
    case DataType::kFloat16:
    case DataType::kBfloat16:
      return 2;
    case DataType::kInt32:
    case DataType::kUint32:
    case DataType::kFloat32:
      return 4;
    case DataType::kInt64:
    case DataType::kUint64:
    case DataType::kFloat64:
      return 8;
    default:
      return 0;
  }
}

inline bool isFloating(DataType t) {
  switch (t) {
    case DataType::kFloat16:
    case DataType::kFloat32:
    case DataType::kFloat64:
    case DataType::kBfloat16:
    case DataType::kFloat8e4m3:
    case DataType::kFloat8e5m2:
      return true;
    default:
      return false;
  }
}

const char* dataTypeName(DataType t);
const char* redOpName(RedOp op);

}  // namespace tutti
