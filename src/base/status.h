// Status and Result<T>: the error currency inside tutti.
//
// Contract: every fallible internal function returns Status or Result<T>.
// A Status carries a code (mapped 1:1 onto ncclResult_t at the C boundary)
// and a human-readable message. Nothing inside tutti throws across a module
// boundary; exceptions (std::bad_alloc, ...) are caught in src/capi (guard())
// and on every thread tutti starts (base::startThread, base/thread.h).
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace tutti {

// Values equal ncclResult_t's so mapping is a cast.
enum class Code : int {
  kOk = 0,
  kUnhandledDeviceError = 1,  // ncclUnhandledCudaError
  kSystemError = 2,
  kInternalError = 3,
  kInvalidArgument = 4,
  kInvalidUsage = 5,
  kRemoteError = 6,
  kInProgress = 7,
};

// What a code means, in NCCL's words (ncclGetErrorString); any other value
// is "unknown result code".
const char* codeText(int code);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(Code code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok() { return Status(); }
  bool isOk() const { return code_ == Code::kOk; }
  explicit operator bool() const { return isOk(); }
  Code code() const { return code_; }
  const std::string& message() const { return message_; }

  // Prepends context: "while connecting to rank 3: <message>". The context
  // is a view, so a successful call on a hot path (every API call checks its
  // communicator with the function's name) builds no string.
  Status withContext(std::string_view ctx) const {
    if (isOk()) return Status();
    std::string m;
    m.reserve(ctx.size() + 2 + message_.size());
    m.append(ctx).append(": ").append(message_);
    return Status(code_, std::move(m));
  }
  // The same for a C string, measured (strlen) only on an error.
  Status withContext(const char* ctx) const {
    if (isOk()) return Status();
    return withContext(std::string_view(ctx));
  }

 private:
  Code code_ = Code::kOk;
  std::string message_;
};

inline Status invalidArgument(std::string m) {
  return Status(Code::kInvalidArgument, std::move(m));
}
inline Status invalidUsage(std::string m) { return Status(Code::kInvalidUsage, std::move(m)); }
inline Status systemError(std::string m) { return Status(Code::kSystemError, std::move(m)); }
inline Status internalError(std::string m) { return Status(Code::kInternalError, std::move(m)); }
inline Status remoteError(std::string m) { return Status(Code::kRemoteError, std::move(m)); }

// errno-aware system error: "what: strerror(err)".
Status errnoError(const std::string& what, int err);

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}         // NOLINT(implicit)
  Result(Status status) : v_(std::move(status)) {}  // NOLINT(implicit)

  bool isOk() const { return v_.index() == 0; }
  explicit operator bool() const { return isOk(); }
  T& value() & { return std::get<0>(v_); }
  T&& value() && { return std::get<0>(std::move(v_)); }
  const T& value() const& { return std::get<0>(v_); }
  T* operator->() { return &value(); }
  T& operator*() { return value(); }
  Status status() const { return isOk() ? Status() : std::get<1>(v_); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace tutti

#define TUTTI_CONCAT_INNER_(a, b) a##b
#define TUTTI_CONCAT_(a, b) TUTTI_CONCAT_INNER_(a, b)

#define TUTTI_RETURN_IF_ERROR(expr)          \
  do {                                       \
    ::tutti::Status tutti_st_ = (expr);      \
    if (!tutti_st_.isOk()) return tutti_st_; \
  } while (0)

// TUTTI_ASSIGN_OR_RETURN(auto x, f()) -- declares x from a Result<T>.
#define TUTTI_ASSIGN_OR_RETURN(lhs, expr) \
  TUTTI_ASSIGN_OR_RETURN_IMPL_(TUTTI_CONCAT_(tutti_res_, __LINE__), lhs, expr)
#define TUTTI_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.isOk()) return tmp.status();              \
  lhs = std::move(tmp).value()
