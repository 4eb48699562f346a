// A receive from any source (tuttiRecvAny): which peer's message it takes.
//
// Messages are matched per pair and direction, in order (Comm::nextRecvSeq):
// a receive from any source takes the message of the first peer whose next
// operation towards this rank turns out to be point-to-point, and becomes an
// ordinary receive from that peer. That peer is found by reading each
// connection's next message header, as a run parks a later operation's
// header (Channel::rx): a run of that peer's operation finds it there. A
// peer not yet connected announces itself with a hello before its
// handshakes (Comm::connectPair); this rank then connects to it. (A
// collective's header read here misses the straggler telemetry of that one
// message: Telemetry::onHeader is the run's.)
#include <poll.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "base/log.h"
#include "core/bootstrap.h"
#include "core/comm.h"
#include "core/oneshot.h"
#include "core/wire_header.h"

namespace tutti::core {

Result<int> Comm::awaitAnySource() {
  using Clock = std::chrono::steady_clock;
  constexpr size_t kHdr = sizeof(MsgHeader);
  const OpSig p2p = p2pSig();
  const auto start = Clock::now();
  auto nextCheck = start + std::chrono::milliseconds(100);
  std::vector<pollfd> fds;
  // Channels that failed (a peer that left): not read again.
  std::vector<std::vector<uint8_t>> dead(nranks_, std::vector<uint8_t>(nChannels_, 0));
  bool noneLeft = false;  // the last check found no peer that could still send
  for (unsigned pass = 0;; ++pass) {
    if (aborted()) return invalidUsage("communicator aborted");
    if (revoked()) return revokedError();
    fds.clear();
    bool unpollable = false, connected = false;
    for (int p = 0; p < nranks_; ++p) {
      if (p == rank_) continue;
      if (!channels_[p][0].conn) {
        const uint64_t hello = connectTag(std::min(rank_, p), std::max(rank_, p), kHelloChannel);
        if (!bootstrap_->pending(p, hello)) continue;
        TUTTI_RETURN_IF_ERROR(connectPair(p));
        connected = true;
      }
      for (int ch = 0; ch < nChannels_; ++ch) {
        Channel& c = channels_[p][ch];
        if (dead[p][ch]) continue;
        RecvState& rx = c.rx;
        if (c.conn->needsProgress()) (void)c.conn->progress();
        if (!rx.haveHeader) {
          auto n =
              c.conn->tryRecv(reinterpret_cast<uint8_t*>(&rx.hdr) + rx.hdrGot, kHdr - rx.hdrGot);
          if (!n) {
            if (rx.hdrGot) return n.status().withContext("receiving from " + describePeer(p));
            dead[p][ch] = 1;
            continue;
          }
          rx.hdrGot += *n;
          rx.haveHeader = rx.hdrGot == kHdr;
        }
        if (rx.haveHeader) {
          // This peer's next operation towards this rank: point-to-point
          // (this receive's), or a collective (not this receive's).
          if (rx.hdr.seq == recvSeq_[p] && rx.hdr.sig == p2p) {
            clearWaiting();
            return p;
          }
          continue;
        }
        if (c.conn->waitHint() >= 0)
          fds.push_back({c.conn->waitHint(), POLLIN, 0});
        else
          unpollable = true;
      }
    }
    if (connected) continue;
    const auto now = Clock::now();
    if (now >= nextCheck) {
      nextCheck = now + std::chrono::milliseconds(100);
      // A peer that gave up or was aborted has broken the communicator; one
      // that left (destroyed its communicator) sends nothing more, but the
      // others may: the wait fails once none is left, after one more pass
      // over the headers (a peer's last message may have come as it left).
      std::vector<int> waiting;
      for (int p = 0; p < nranks_; ++p) {
        if (p == rank_) continue;
        TUTTI_RETURN_IF_ERROR(noticeFrom(p));
        if (oneShot_ && oneShot_->peerAborted(p))
          return peerAbortedError(p, " while this rank waited for a message from any rank");
        const bool gone = (oneShot_ && oneShot_->peerGone(p)) ||
                          (channels_[p][0].conn && std::all_of(dead[p].begin(), dead[p].end(),
                                                               [](uint8_t d) { return d; }));
        if (!gone) waiting.push_back(p);
      }
      if (waiting.empty() && noneLeft)
        return remoteError(
            "every other rank has left the communicator while this rank waited for a message "
            "from any rank");
      noneLeft = waiting.empty();
      noteWaiting(waiting);
      const double idle = std::chrono::duration<double>(now - start).count();
      if (idle >= timeoutSec_)
        return remoteError(fmt::format(
            "no point-to-point message from any rank for {:.0f} s (TUTTI_TIMEOUT) in a receive "
            "from any source",
            idle));
    }
    // Shared memory cannot be polled: a few passes at full speed, then
    // 1 ms sleeps. Sockets alone: poll them, waking every 10 ms for the
    // hellos of unconnected peers and an abort.
    if (unpollable && pass < 64) {
      sched_yield();
      continue;
    }
    (void)::poll(fds.data(), fds.size(), unpollable ? 1 : 10);
  }
}

}  // namespace tutti::core
