// A Connection that hands the one it wraps only what a token bucket lets
// through: an emulated link between two ranks of one host, for the
// straggler tests (TUTTI_TEST_LINK_MBPS, core/comm.cc). The channels of one
// link share one bucket (a link's bandwidth goes to whichever channel
// sends). Everything else passes through. A send the bucket cuts short
// returns fewer bytes, as a full socket buffer would; the executor tries
// again on its next pass.
#pragma once

#include <algorithm>
#include <chrono>
#include <memory>

#include "transports/transport.h"

namespace tutti::transport {

// `mbps` MB/s (10^6 bytes a second) with a burst of 10 ms at that rate
// (64 KiB at least), as a kernel's token bucket filter would be set: a
// sender that loses its core for a time slice does not lose the link's
// bandwidth with it. Not thread-safe: the channels of a link are driven by
// one thread.
//
// Its counters (Connection::linkCounters) are those of the link it stands
// for: every byte let through is acknowledged, and keeps the link busy for
// its time at the rate, so that the telemetry reads the emulated link, not
// the loopback socket below it.
struct TokenBucket {
  explicit TokenBucket(double mbps)
      : bytesPerNs(mbps * 1e-3),
        burst(std::max(65536.0, mbps * 1e4)),
        tokens(burst),
        last(std::chrono::steady_clock::now()) {}
  // The link runs at `mbps` from now (TUTTI_TEST_LINK_MBPS tests change it
  // between calls, on the thread that drives the link).
  void setRate(double mbps) {
    bytesPerNs = mbps * 1e-3;
    burst = std::max(65536.0, mbps * 1e4);
    tokens = std::min(tokens, burst);
  }
  void took(size_t bytes) {
    tokens -= static_cast<double>(bytes);
    counters.bytesAcked += bytes;
    busyNs += static_cast<double>(bytes) / bytesPerNs;
    counters.busyUs = static_cast<uint64_t>(busyNs / 1000);
  }
  // Refills the bucket for the time since the last look; how many of
  // `bytes` it lets through now.
  size_t allowance(size_t bytes) {
    const auto now = std::chrono::steady_clock::now();
    const double ns = static_cast<double>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(now - last).count());
    last = now;
    tokens = std::min(burst, tokens + ns * bytesPerNs);
    return tokens < 1 ? 0 : std::min(bytes, static_cast<size_t>(tokens));
  }
  double bytesPerNs, burst, tokens;
  std::chrono::steady_clock::time_point last;
  Connection::LinkCounters counters;
  double busyNs = 0;
};

class RateLimitedConnection final : public Connection {
 public:
  RateLimitedConnection(std::unique_ptr<Connection> inner, std::shared_ptr<TokenBucket> bucket)
      : inner_(std::move(inner)), bucket_(std::move(bucket)) {}

  Result<size_t> trySend(const void* data, size_t bytes) override {
    const size_t n = bucket_->allowance(bytes);
    if (n == 0) return size_t{0};
    auto sent = inner_->trySend(data, n);
    if (sent) bucket_->took(*sent);
    return sent;
  }
  Result<size_t> trySend2(const void* a, size_t na, const void* b, size_t nb) override {
    const size_t n = bucket_->allowance(na + nb);
    if (n == 0) return size_t{0};
    auto sent = n <= na ? inner_->trySend(a, n) : inner_->trySend2(a, na, b, n - na);
    if (sent) bucket_->took(*sent);
    return sent;
  }
  Result<size_t> tryRecv(void* data, size_t bytes) override { return inner_->tryRecv(data, bytes); }
  const void* peek(size_t* avail) override { return inner_->peek(avail); }
  void consume(size_t bytes) override { inner_->consume(bytes); }
  bool supportsPeek() const override { return inner_->supportsPeek(); }
  int waitHint() const override { return inner_->waitHint(); }
  size_t buffered() const override { return inner_->buffered(); }
  bool needsProgress() const override { return inner_->needsProgress(); }
  Result<bool> progress() override { return inner_->progress(); }
  Status checkAlive() override { return inner_->checkAlive(); }
  // The link's (every channel of the link reports them).
  bool linkCounters(LinkCounters* out) const override {
    *out = bucket_->counters;
    out->wholeLink = true;
    return true;
  }
  void abort() override { inner_->abort(); }
  const char* name() const override { return inner_->name(); }

 private:
  std::unique_ptr<Connection> inner_;
  std::shared_ptr<TokenBucket> bucket_;
};

}  // namespace tutti::transport
