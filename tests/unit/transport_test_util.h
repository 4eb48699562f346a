// Test helpers for transport tests: an in-process ControlChannel (a mailbox
// keyed by (from, to, tag)), connect-context builders, and pumps that move a
// byte pattern through a Connection with a wall-clock limit.
//
// Contract: everything here is thread-safe where it says so (Mailbox), never
// blocks past the deadlines it is given, and reports failures as gtest
// failures or Status values rather than hanging.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <tuple>
#include <vector>

#include "transports/transport.h"

namespace tutti::transport::testing {

// Messages between ranks of one "communicator"; thread-safe.
class Mailbox {
 public:
  void put(int from, int to, uint64_t tag, const void* data, size_t bytes) {
    std::lock_guard<std::mutex> lk(mu_);
    auto* p = static_cast<const uint8_t*>(data);
    queues_[{from, to, tag}].emplace_back(p, p + bytes);
    cv_.notify_all();
  }

  // Waits until a message is there, the deadline passes, or *abortFlag is set
  // (checked every 10 ms). remove=false leaves the message in place.
  Result<std::vector<uint8_t>> take(int from, int to, uint64_t tag, Clock::time_point deadline,
                                    const std::atomic<bool>* abortFlag, bool remove = true) {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      auto it = queues_.find({from, to, tag});
      if (it != queues_.end() && !it->second.empty()) {
        std::vector<uint8_t> v = it->second.front();
        if (remove) it->second.pop_front();
        return v;
      }
      if (abortFlag != nullptr && abortFlag->load()) {
        return Status(Code::kInternalError, "control recv aborted");
      }
      auto now = Clock::now();
      if (now >= deadline) return Status(Code::kRemoteError, "control recv timed out");
      cv_.wait_until(lk, std::min(deadline, now + std::chrono::milliseconds(10)));
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::tuple<int, int, uint64_t>, std::deque<std::vector<uint8_t>>> queues_;
};

// One rank's view of a Mailbox.
class InProcControl : public ControlChannel {
 public:
  InProcControl(Mailbox* box, int self) : box_(box), self_(self) {}
  Status send(int peer, uint64_t tag, const void* data, size_t bytes) override {
    box_->put(self_, peer, tag, data, bytes);
    return Status::ok();
  }
  Result<std::vector<uint8_t>> recv(int peer, uint64_t tag) override {
    return box_->take(peer, self_, tag, Clock::now() + std::chrono::hours(1), nullptr);
  }
  Result<std::vector<uint8_t>> recvUntil(int peer, uint64_t tag, Clock::time_point deadline,
                                         const std::atomic<bool>* abortFlag) override {
    return box_->take(peer, self_, tag, deadline, abortFlag);
  }

 private:
  Mailbox* box_;
  int self_;
};

inline const uint8_t* testSecret() {
  static const uint8_t s[32] = {1,  2,  3,  4,  5,  6,  7,  8,  9,  10, 11, 12, 13, 14, 15, 16,
                                17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31, 32};
  return s;
}

// Unique per test run so shm names and mailbox tags never collide.
inline uint64_t uniqueCommHash() {
  static std::atomic<uint64_t> n{0};
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32 | rd()) ^ (n.fetch_add(1) << 56);
}

// Two ranks (0 and 1) of one communicator, channel by channel.
struct Pair {
  Mailbox box;
  InProcControl c0{&box, 0};
  InProcControl c1{&box, 1};
  uint64_t commHash = uniqueCommHash();
  std::atomic<bool> abort{false};

  ConnectContext ctx(int rank, int channel = 0,
                     std::chrono::milliseconds timeout = std::chrono::seconds(10),
                     size_t bufferBytes = 1 << 20) {
    ConnectContext c;
    c.rank = rank;
    c.peer = 1 - rank;
    c.channel = channel;
    c.isLower = rank == 0;
    c.peerSameHost = true;
    c.commHash = commHash;
    c.secret = testSecret();
    c.bufferBytes = bufferBytes;
    c.control = rank == 0 ? static_cast<ControlChannel*>(&c0) : &c1;
    c.deadline = Clock::now() + timeout;
    c.abortFlag = &abort;
    c.tagBase = 1000 + 16 * static_cast<uint64_t>(channel);
    return c;
  }
};

using ConnResult = Result<std::unique_ptr<Connection>>;

// Runs connect() for both sides at once.
inline std::pair<ConnResult, ConnResult> connectBoth(Transport& t0, Transport& t1,
                                                     const ConnectContext& a,
                                                     const ConnectContext& b) {
  ConnResult r1 = Status(Code::kInternalError, "not run");
  std::thread th([&] { r1 = t1.connect(b); });
  ConnResult r0 = t0.connect(a);
  th.join();
  return {std::move(r0), std::move(r1)};
}

inline uint8_t patternByte(uint64_t i, uint32_t seed) {
  uint64_t x = i * 0x9E3779B97F4A7C15ull + seed;
  return static_cast<uint8_t>((x >> 29) ^ (x >> 47) ^ i);
}

inline void fillPattern(uint8_t* p, size_t n, uint64_t offset, uint32_t seed) {
  for (size_t i = 0; i < n; ++i) p[i] = patternByte(offset + i, seed);
}

// Index of the first byte that breaks the pattern, or n.
inline size_t checkPattern(const uint8_t* p, size_t n, uint64_t offset, uint32_t seed) {
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != patternByte(offset + i, seed)) return i;
  }
  return n;
}

// Moves `total` pattern bytes both ways (either may be 0) on one thread with
// random-sized pieces, never blocking (fillFirst: send until full before the
// first read); returns an error on a transport error,
// a pattern mismatch or when `limit` passes.
inline Status pump(Connection& c, uint64_t sendTotal, uint32_t sendSeed, uint64_t recvTotal,
                   uint32_t recvSeed, size_t maxPiece, uint32_t rngSeed,
                   std::chrono::seconds limit = std::chrono::seconds(60), bool verify = true,
                   bool fillFirst = false) {
  std::mt19937 rng(rngSeed);
  std::uniform_int_distribution<size_t> piece(1, maxPiece);
  std::vector<uint8_t> sbuf(maxPiece), rbuf(maxPiece);
  uint64_t sent = 0, recvd = 0;
  size_t pendingLen = 0, pendingOff = 0;  // current send piece
  auto end = Clock::now() + limit;
  int idle = 0;
  while (sent < sendTotal || recvd < recvTotal) {
    bool progress = false;
    // fillFirst: keep sending, without reading, until the transport is full.
    while (sent < sendTotal) {
      if (pendingOff == pendingLen) {
        pendingLen = std::min<uint64_t>(piece(rng), sendTotal - sent);
        pendingOff = 0;
        if (verify) fillPattern(sbuf.data(), pendingLen, sent, sendSeed);
      }
      auto r = c.trySend(sbuf.data() + pendingOff, pendingLen - pendingOff);
      if (!r.isOk()) return r.status();
      pendingOff += *r;
      sent += *r;
      progress |= *r > 0;
      if (!fillFirst || *r == 0) break;
    }
    fillFirst = false;
    if (recvd < recvTotal) {
      size_t want = std::min<uint64_t>(piece(rng), recvTotal - recvd);
      auto r = c.tryRecv(rbuf.data(), want);
      if (!r.isOk()) return r.status();
      if (verify) {
        size_t bad = checkPattern(rbuf.data(), *r, recvd, recvSeed);
        if (bad != *r) {
          return Status(Code::kInternalError,
                        "pattern mismatch at byte " + std::to_string(recvd + bad));
        }
      }
      recvd += *r;
      progress |= *r > 0;
    }
    if (progress) {
      idle = 0;
    } else if (++idle > 64) {
      if (Clock::now() > end) {
        return Status(Code::kInternalError, "pump timed out: sent " + std::to_string(sent) +
                                                " recvd " + std::to_string(recvd));
      }
      std::this_thread::yield();
    }
  }
  // A transport that moves bytes only when called (an NCCL net plugin) may
  // still hold what this side "sent": push it out before returning, or the
  // peer's pump waits for bytes nobody drives (it did: about 1 run in 10 of
  // NcclNetStream.RetriesNullCommsAndNullRequests timed out so).
  while (c.needsProgress()) {
    auto idle = c.progress();
    if (!idle.isOk()) return idle.status();
    if (*idle) break;
    if (Clock::now() > end)
      return Status(Code::kInternalError, "pump timed out with sends not yet gone");
    std::this_thread::yield();
  }
  return Status::ok();
}

// Moves 256 MiB one way from `tx` to `rx` (unverified, 1 MiB at a time),
// reports the rate as the test property "GBps" and on stdout, labelled.
inline void measureOneWay256MiB(Connection& tx, Connection& rx, const char* label) {
  using namespace std::chrono_literals;
  const uint64_t total = 256ull << 20;
  Status s1;
  auto t = Clock::now();
  std::thread th([&] { s1 = pump(rx, 0, 0, total, 0, 1 << 20, 2, 60s, false); });
  Status s0 = pump(tx, total, 0, 0, 0, 1 << 20, 1, 60s, false);
  th.join();
  double sec = std::chrono::duration<double>(Clock::now() - t).count();
  ASSERT_TRUE(s0.isOk() && s1.isOk()) << s0.message() << s1.message();
  double gbs = total / sec / 1e9;
  ::testing::Test::RecordProperty("GBps", std::to_string(gbs));
  std::printf("%s: 256 MiB one-way in %.3f s = %.2f GB/s\n", label, sec, gbs);
}

}  // namespace tutti::transport::testing
