#include "base/types.h"

namespace tutti {

const char* dataTypeName(DataType t) {
  switch (t) {
    case DataType::kInt8:
      return "int8";
    case DataType::kUint8:
      return "uint8";
    case DataType::kInt32:
      return "int32";
    case DataType::kUint32:
      return "uint32";
    case DataType::kInt64:
      return "int64";
    case DataType::kUint64:
      return "uint64";
    case DataType::kFloat16:
      return "half";
    case DataType::kFloat32:
      return "float";
    case DataType::kFloat64:
      return "double";
    case DataType::kBfloat16:
      return "bfloat16";
    case DataType::kFloat8e4m3:
      return "f8e4m3";
    case DataType::kFloat8e5m2:
      return "f8e5m2";
    default:
      return "invalid";
  }
}

const char* redOpName(RedOp op) {
  switch (op) {
    case RedOp::kSum:
      return "sum";
    case RedOp::kProd:
      return "prod";
    case RedOp::kMax:
      return "max";
    case RedOp::kMin:
      return "min";
    case RedOp::kAvg:
      return "avg";
    case RedOp::kPreMulSum:
      return "premulsum";
  }
  return "invalid";
}

}  // namespace tutti
