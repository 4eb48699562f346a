#include "core/link_probe.h"

#include <poll.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "base/backoff.h"
#include "base/log.h"

namespace tutti::core {
namespace {

using transport::Clock;

constexpr uint32_t kProbeMagic = 0x424f5250;  // "PROB"
enum : uint32_t { kPing = 1, kBulk = 2, kStop = 3, kBulkNext = 4 };
// A responder refuses bulk transfers larger than this (a corrupt command).
constexpr uint64_t kMaxBulkBytes = 64ull << 20;

// Moves whole buffers over the connection, waiting between attempts: poll on
// the connection's fd (at most 1 ms at a time, so the abort flag and the
// deadline are checked), or the backoff for shared memory.
class Mover {
 public:
  Mover(transport::Connection& c, const LinkProbeOptions& o)
      : c_(c), o_(o), fd_(c.waitHint()), backoff_(o.oversubscribed) {}

  Status send(const void* data, size_t bytes) {
    auto* p = static_cast<const uint8_t*>(data);
    while (bytes > 0) {
      TUTTI_ASSIGN_OR_RETURN(size_t n, c_.trySend(p, bytes));
      p += n;
      bytes -= n;
      if (n > 0)
        backoff_.progress();
      else
        TUTTI_RETURN_IF_ERROR(wait(POLLOUT));
    }
    return Status::ok();
  }

  Status recv(void* data, size_t bytes) {
    auto* p = static_cast<uint8_t*>(data);
    while (bytes > 0) {
      TUTTI_ASSIGN_OR_RETURN(size_t n, c_.tryRecv(p, bytes));
      p += n;
      bytes -= n;
      if (n > 0)
        backoff_.progress();
      else if (bytes > 0)
        TUTTI_RETURN_IF_ERROR(wait(POLLIN));
    }
    return Status::ok();
  }

 private:
  Status wait(short events) {
    if (o_.abortFlag && o_.abortFlag->load(std::memory_order_relaxed))
      return invalidUsage("link probe: communicator aborted");
    if (Clock::now() >= o_.deadline)
      return remoteError("link probe: timed out waiting for the peer");
    if (fd_ >= 0) {
      pollfd p{fd_, events, 0};
      (void)::poll(&p, 1, 1);
      return Status::ok();
    }
    backoff_.idle();
    // A dead peer on shared memory shows only here (a socket wakes poll).
    if (backoff_.pastSpin() && (backoff_.idleIters() & 1023) == 0) return c_.checkAlive();
    return Status::ok();
  }

  transport::Connection& c_;
  const LinkProbeOptions& o_;
  int fd_;
  base::Backoff backoff_;
};

ProbeCmd command(uint32_t kind, uint64_t bytes = 0) { return ProbeCmd{kProbeMagic, kind, bytes}; }

Status checkCmd(const ProbeCmd& got, uint32_t kind) {
  if (got.magic != kProbeMagic || got.kind != kind)
    return internalError(
        fmt::format("link probe: unexpected reply (magic {:#x} kind {}): the peer is not probing",
                    got.magic, got.kind));
  return Status::ok();
}

double usSince(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

}  // namespace

Result<LinkProbeResult> probeLink(transport::Connection& conn, const LinkProbeOptions& opt) {
  Mover m(conn, opt);
  LinkProbeResult res;
  const size_t bulkBytes = std::max<size_t>(opt.bulkBytes, 4096);
  std::vector<uint8_t> payload(std::max(bulkBytes, opt.warmupBytes), 0x5a);
  // Round trips; the first one is a warm-up (it also waits for the peer to
  // start answering, which is not the probe's time: the clock starts after it).
  auto start = Clock::now();
  std::vector<double> rtt;
  for (int i = 0; i <= std::max(opt.pings, 1); ++i) {
    const ProbeCmd ping = command(kPing, static_cast<uint64_t>(i));
    ProbeCmd echo{};
    const auto t = Clock::now();
    TUTTI_RETURN_IF_ERROR(m.send(&ping, sizeof(ping)));
    TUTTI_RETURN_IF_ERROR(m.recv(&echo, sizeof(echo)));
    const double us = usSince(t);
    TUTTI_RETURN_IF_ERROR(checkCmd(echo, kPing));
    if (i > 0)
      rtt.push_back(us);
    else
      start = Clock::now();
  }
  TUTTI_TRACE(log::kTuning, "link probe: {} round trips in {:.1f} us", rtt.size(), usSince(start));
  std::sort(rtt.begin(), rtt.end());
  const size_t h = rtt.size() / 2;
  const double medianRtt = rtt.size() % 2 ? rtt[h] : (rtt[h - 1] + rtt[h]) / 2;
  res.latencyUs = medianRtt / 2;
  res.pings = static_cast<int>(rtt.size());

  // Bulk transfers: a warm-up, then timed ones within the budget, each
  // timed by the responder from the end of the one before on its own clock
  // (kBulkNext): bytes / that time is the link's rate, whatever the round
  // trip or the sender's scheduling. The first is sent right behind the
  // warm-up, so the link is busy throughout and a rate limiter's burst,
  // spent by the warm-up, is never refilled; a later one follows the
  // previous answer, and the pause, counted in its time, is what a limiter
  // refilled in it (no more than its burst). The figure is the best.
  const double budgetUs = std::chrono::duration<double, std::micro>(opt.budget).count();
  const size_t warmup = std::max<size_t>(opt.warmupBytes, 4096);
  auto sendBulk = [&](uint32_t kind, size_t bytes) {
    const ProbeCmd bulk = command(kind, bytes);
    TUTTI_RETURN_IF_ERROR(m.send(&bulk, sizeof(bulk)));
    return m.send(payload.data(), bytes);
  };
  auto answer = [&](uint32_t kind, ProbeCmd* ack) {
    TUTTI_RETURN_IF_ERROR(m.recv(ack, sizeof(*ack)));
    return checkCmd(*ack, kind);
  };
  auto take = [&](size_t bytes, double initiatorUs, uint64_t responderUs) {
    // Never trust less than half the initiator's time to the bytes, nor a
    // responder's time below a quarter of it (it read what its buffers
    // already held: not the link).
    const double moveUs = std::max(initiatorUs - medianRtt, initiatorUs / 2);
    double gbs = static_cast<double>(bytes) / (moveUs * 1e3);
    if (responderUs > 0 && static_cast<double>(responderUs) >= initiatorUs / 4)
      gbs = static_cast<double>(bytes) / (static_cast<double>(responderUs) * 1e3);
    TUTTI_TRACE(log::kTuning, "link probe: timed {} bytes, {:.1f} us here, {} us at the peer",
                bytes, initiatorUs, responderUs);
    res.bandwidthGBs = std::max(res.bandwidthGBs, gbs);
    ++res.transfers;
  };
  ProbeCmd ack{};
  auto t = Clock::now();
  TUTTI_RETURN_IF_ERROR(sendBulk(kBulk, warmup));
  const auto timedSent = Clock::now();
  TUTTI_RETURN_IF_ERROR(sendBulk(kBulkNext, bulkBytes));
  TUTTI_RETURN_IF_ERROR(answer(kBulk, &ack));
  TUTTI_TRACE(log::kTuning, "link probe: warm-up {} bytes in {:.1f} us", warmup, usSince(t));
  TUTTI_RETURN_IF_ERROR(answer(kBulkNext, &ack));
  double lastUs = usSince(timedSent);
  take(bulkBytes, lastUs, ack.bytes);
  for (int i = 1; i < opt.bulkTransfers; ++i) {
    if (usSince(start) + lastUs > budgetUs) break;
    t = Clock::now();
    TUTTI_RETURN_IF_ERROR(sendBulk(kBulkNext, bulkBytes));
    TUTTI_RETURN_IF_ERROR(answer(kBulkNext, &ack));
    lastUs = usSince(t);
    take(bulkBytes, lastUs, ack.bytes);
  }
  const ProbeCmd stop = command(kStop);
  TUTTI_RETURN_IF_ERROR(m.send(&stop, sizeof(stop)));
  res.elapsedMs = usSince(start) / 1e3;
  return res;
}

Status skipLinkProbe(transport::Connection& conn, const LinkProbeOptions& opt) {
  Mover m(conn, opt);
  const ProbeCmd stop = command(kStop);
  return m.send(&stop, sizeof(stop));
}

Status serveLinkProbe(transport::Connection& conn, const LinkProbeOptions& opt) {
  Mover m(conn, opt);
  std::vector<uint8_t> sink;
  Clock::time_point lastEnd{};
  bool haveLast = false;
  for (;;) {
    ProbeCmd cmd{};
    TUTTI_RETURN_IF_ERROR(m.recv(&cmd, sizeof(cmd)));
    if (cmd.magic != kProbeMagic)
      return internalError(fmt::format(
          "link probe: unexpected bytes (magic {:#x}): the peer is not probing", cmd.magic));
    switch (cmd.kind) {
      case kStop:
        return Status::ok();
      case kPing:
        TUTTI_RETURN_IF_ERROR(m.send(&cmd, sizeof(cmd)));
        break;
      case kBulk:
      case kBulkNext: {
        if (cmd.bytes > kMaxBulkBytes)
          return internalError(
              fmt::format("link probe: bulk transfer of {} bytes refused", cmd.bytes));
        sink.resize(std::min<size_t>(static_cast<size_t>(cmd.bytes), 1 << 20));
        for (uint64_t left = cmd.bytes; left > 0;) {
          const size_t n = static_cast<size_t>(std::min<uint64_t>(left, sink.size()));
          TUTTI_RETURN_IF_ERROR(m.recv(sink.data(), n));
          left -= n;
        }
        // kBulkNext: the answer carries the microseconds since the previous
        // transfer's last byte (its payload followed that one's at once).
        const auto now = Clock::now();
        ProbeCmd reply = cmd;
        if (cmd.kind == kBulkNext)
          reply.bytes =
              haveLast ? static_cast<uint64_t>(std::max<int64_t>(
                             1, std::chrono::duration_cast<std::chrono::microseconds>(now - lastEnd)
                                    .count()))
                       : 0;
        lastEnd = now;
        haveLast = true;
        TUTTI_RETURN_IF_ERROR(m.send(&reply, sizeof(reply)));
        break;
      }
      default:
        return internalError(fmt::format("link probe: unknown command {}", cmd.kind));
    }
  }
}

}  // namespace tutti::core
