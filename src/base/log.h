// The logger: one for the whole library, NCCL's format and levels.
//
// Contract: configured lazily from NCCL_DEBUG (VERSION|WARN|INFO|ABORT|TRACE),
// NCCL_DEBUG_SUBSYS (comma list, ^ to negate, ALL) and NCCL_DEBUG_FILE (%h host,
// %p pid), read through params::lookup (the environment, then config files,
// such as the one NCCL_CONF_FILE names). Lines look like NCCL's: "host:pid:tid [rank] NCCL INFO
// message". Thread-safe; never blocks longer than one write(2). Logging never fails.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>

namespace tutti::log {

enum class Level : int { kNone = 0, kVersion = 1, kWarn = 2, kInfo = 3, kAbort = 4, kTrace = 5 };

enum Subsys : uint32_t {
  kInit = 1u << 0,
  kColl = 1u << 1,
  kP2p = 1u << 2,
  kShm = 1u << 3,
  kNet = 1u << 4,
  kGraph = 1u << 5,
  kTuning = 1u << 6,
  kEnv = 1u << 7,
  kAlloc = 1u << 8,
  kCall = 1u << 9,
  kProxy = 1u << 10,
  kBootstrap = 1u << 12,
  kReg = 1u << 13,
  kAll = ~0u,
};

bool enabled(Level level, uint32_t subsys);
void write(Level level, uint32_t subsys, const std::string& msg);
// Rank shown in the "[x]" field for messages from this thread (-1: none).
void setThreadRank(int rank);
// Re-reads the environment (tests, ncclResetDebugInit); config files are
// re-read only after params::resetForTesting().
void reset();

}  // namespace tutti::log

#define TUTTI_LOG_(lvl, sub, ...)                                \
  do {                                                           \
    if (::tutti::log::enabled(lvl, sub))                         \
      ::tutti::log::write(lvl, sub, ::fmt::format(__VA_ARGS__)); \
  } while (0)

#define TUTTI_WARN(...) TUTTI_LOG_(::tutti::log::Level::kWarn, ::tutti::log::kAll, __VA_ARGS__)
#define TUTTI_INFO(sub, ...) TUTTI_LOG_(::tutti::log::Level::kInfo, sub, __VA_ARGS__)
#define TUTTI_TRACE(sub, ...) TUTTI_LOG_(::tutti::log::Level::kTrace, sub, __VA_ARGS__)
