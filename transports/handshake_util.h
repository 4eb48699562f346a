// Helpers shared by the transports' connect() handshakes.
//
// Contract: header-only, no state. Every wait built from these helpers looks at
// ctx.deadline and *ctx.abortFlag at least every kPollSlice, so a handshake
// never outlives its deadline by more than one slice and notices an abort
// within one slice. Tags: a handshake uses ctx.tagBase + k for k < kTagSpan;
// the caller must space tagBase values of concurrent handshakes by kTagSpan.
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "transports/transport.h"

namespace tutti::transport::detail {

inline constexpr std::chrono::milliseconds kPollSlice{10};
inline constexpr uint64_t kTagSpan = 4;

inline bool aborted(const ConnectContext& ctx) {
  return ctx.abortFlag != nullptr && ctx.abortFlag->load(std::memory_order_acquire);
}

// ok while neither aborted, nor past the deadline, nor waiting for a peer
// that gave up (ControlChannel::gaveUp); otherwise an error that names the
// peer and what we were waiting for.
inline Status checkWait(const ConnectContext& ctx, const char* transport, const char* what) {
  if (aborted(ctx)) {
    return internalError(fmt::format("{}: connect to rank {} (channel {}) aborted while {}",
                                     transport, ctx.peer, ctx.channel, what));
  }
  if (ctx.control != nullptr) {
    Status g = ctx.control->gaveUp(ctx.peer);
    if (!g.isOk())
      return g.withContext(
          fmt::format("{}: connecting to rank {} (channel {}) while {}", transport, ctx.peer,
                      ctx.channel, what));
  }
  if (Clock::now() >= ctx.deadline) {
    return remoteError(fmt::format("{}: timed out connecting to rank {} (channel {}) while {}",
                                   transport, ctx.peer, ctx.channel, what));
  }
  return Status::ok();
}

// Milliseconds to sleep/poll in one slice: min(kPollSlice, time left), >= 0.
inline int sliceMs(const ConnectContext& ctx) {
  auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(ctx.deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left + 1, 0, kPollSlice.count()));
}

inline Status checkContext(const ConnectContext& ctx, const char* transport) {
  if (ctx.control == nullptr)
    return invalidArgument(fmt::format("{}: no control channel", transport));
  if (ctx.peer < 0 || ctx.rank < 0 || ctx.peer == ctx.rank) {
    return invalidArgument(
        fmt::format("{}: bad rank pair (rank {}, peer {})", transport, ctx.rank, ctx.peer));
  }
  if (ctx.isLower != (ctx.rank < ctx.peer)) {
    return invalidArgument(fmt::format("{}: isLower inconsistent with rank {} / peer {}", transport,
                                       ctx.rank, ctx.peer));
  }
  return Status::ok();
}

// A control message from the peer, waiting until the deadline at most.
inline Result<std::vector<uint8_t>> controlRecv(const ConnectContext& ctx, uint64_t tagOffset,
                                                const char* transport, const char* what) {
  TUTTI_RETURN_IF_ERROR(checkWait(ctx, transport, what));
  auto r = ctx.control->recvUntil(ctx.peer, ctx.tagBase + tagOffset, ctx.deadline, ctx.abortFlag);
  if (!r.isOk()) {
    // Prefer our own, uniform message for timeout/abort.
    Status w = checkWait(ctx, transport, what);
    if (!w.isOk()) return w;
    return r.status().withContext(fmt::format("{}: {} from rank {}", transport, what, ctx.peer));
  }
  return r;
}

inline Status controlSend(const ConnectContext& ctx, uint64_t tagOffset, const void* data,
                          size_t bytes, const char* transport, const char* what) {
  TUTTI_RETURN_IF_ERROR(checkWait(ctx, transport, what));  // (a peer that gave up accepts nothing)
  Status s = ctx.control->send(ctx.peer, ctx.tagBase + tagOffset, data, bytes);
  if (!s.isOk()) {
    return s.withContext(fmt::format("{}: {} to rank {}", transport, what, ctx.peer));
  }
  return Status::ok();
}

}  // namespace tutti::transport::detail
