#include "base/status.h"

namespace tutti {

const char* codeText(int code) {
  switch (static_cast<Code>(code)) {
    case Code::kOk:
      return "no error";
    case Code::kUnhandledDeviceError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case Code::kSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case Code::kInternalError:
      return "internal error - please report this issue to the tutti developers";
    case Code::kInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case Code::kInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case Code::kRemoteError:
      return "remote process exited or there was a network error";
    case Code::kInProgress:
      return "NCCL operation in progress";
  }
  return "unknown result code";
}

}  // namespace tutti
