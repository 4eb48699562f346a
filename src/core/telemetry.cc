#include "core/telemetry.h"

#include <algorithm>
#include <climits>
#include <cstring>

#include "base/log.h"
#include "core/comm.h"

namespace tutti::core {
namespace {

constexpr int64_t kNone = INT64_MIN;

uint16_t sat16(int64_t v) { return static_cast<uint16_t>(std::clamp<int64_t>(v, 0, 65535)); }

// Whether a view measured in collective call `theirs` (low 16 bits) is
// still news at call `mine`: measured at most kFreshCalls calls before (the
// calls between two large operations, say, are small ones that measure no
// link).
constexpr uint16_t kFreshCalls = 8;
bool fresh(uint16_t theirs, uint32_t mine) {
  const auto d = static_cast<uint16_t>(static_cast<uint16_t>(mine) - theirs);
  return d <= kFreshCalls;
}

}  // namespace

Telemetry::Telemetry(Comm* comm)
    : comm_(comm),
      rank_(comm->rank()),
      nranks_(comm->nranks()),
      lateUs_(comm->nranks(), kNone),
      sent_(comm->nranks(), 0),
      seen_(comm->nranks()),
      based_(comm->nranks(), 0),
      mbps_(comm->nranks(), 0),
      busy_(comm->nranks(), 0),
      avgMBps_(comm->nranks(), 0),
      avgBusy_(comm->nranks(), 0) {}

void Telemetry::begin(uint32_t call, Clock::time_point start) {
  measuring_ = true;
  call_ = call;
  gapUs_ =
      ended_ ? std::chrono::duration_cast<std::chrono::microseconds>(start - lastEnd_).count() : 0;
  start_ = start;
  std::fill(lateUs_.begin(), lateUs_.end(), kNone);
  std::fill(sent_.begin(), sent_.end(), 0);
  std::fill(based_.begin(), based_.end(), 0);
  // What is still fresh of the view (link rates reach the others one
  // operation late).
  if (!fresh(static_cast<uint16_t>(late_.call), call)) late_ = Late{};
  if (!fresh(static_cast<uint16_t>(link_.call), call)) link_ = Link{};
  if (!fresh(static_cast<uint16_t>(fastCall_), call)) fastMBps_ = 0;
}

Gossip Telemetry::stamp(Clock::time_point now) const {
  Gossip g;
  const auto since = std::chrono::duration_cast<std::chrono::microseconds>(now - start_).count();
  g.sinceStart = sat16(since / 64);
  g.gap = sat16(gapUs_ / 64);
  uint32_t oldest = call_;
  if (late_.rank >= 0) {
    g.lateRank = static_cast<int16_t>(late_.rank);
    g.lateMs = sat16(late_.ms);
    oldest = late_.call;
  }
  if (link_.from >= 0) {
    g.linkFrom = static_cast<int16_t>(link_.from);
    g.linkTo = static_cast<int16_t>(link_.to);
    g.slowMBps = sat16(link_.slowMBps);
    if (call_ - link_.call > call_ - oldest) oldest = link_.call;
  }
  if (fastMBps_) {
    g.fastMBps = sat16(fastMBps_);
    if (call_ - fastCall_ > call_ - oldest) oldest = fastCall_;
  }
  g.viewCall = static_cast<uint16_t>(oldest);
  return g;
}

void Telemetry::onHeader(int peer, const Gossip& g, Clock::time_point now) {
  if (!measuring_ || peer < 0 || peer >= nranks_) return;
  // When the peer started, on this rank's clock; how much after this rank.
  const int64_t late = std::chrono::duration_cast<std::chrono::microseconds>(now - start_).count() -
                       int64_t{g.sinceStart} * 64;
  if (lateUs_[peer] == kNone || late < lateUs_[peer]) lateUs_[peer] = late;
  // Late because it spent longer outside tutti than this rank (not because
  // its previous operation ended later, which a slow link does): by the
  // lesser of the two measures.
  const int64_t longer = int64_t{g.gap} * 64 - gapUs_;
  const int64_t ms = std::min(lateUs_[peer], longer) / 1000;
  if (ms * 1000 > std::chrono::microseconds(kLateMin).count())
    takeLate({peer, static_cast<uint32_t>(ms), call_});
  merge(g);
}

// A peer's view, when still fresh: a later rank or a slower link than this
// rank's view replaces it (the call it was measured in comes with it).
void Telemetry::merge(const Gossip& g) {
  if (!fresh(g.viewCall, call_)) return;
  const uint32_t call = call_ - static_cast<uint16_t>(static_cast<uint16_t>(call_) - g.viewCall);
  if (g.lateRank >= 0 && g.lateRank < nranks_) takeLate({g.lateRank, g.lateMs, call});
  if (g.fastMBps >= fastMBps_) {
    fastMBps_ = g.fastMBps;
    fastCall_ = std::max(fastCall_, call);
  }
  if (g.linkFrom >= 0 && g.linkFrom < nranks_ && g.linkTo >= 0 && g.linkTo < nranks_ &&
      g.linkFrom != g.linkTo && g.slowMBps > 0)
    takeLink({g.linkFrom, g.linkTo, g.slowMBps, call});
}

// Into the view: a later rank, or the same one measured since.
void Telemetry::takeLate(const Late& l) {
  if (late_.rank < 0 || l.ms > late_.ms || (l.rank == late_.rank && l.call > late_.call)) late_ = l;
}

// Into the view: a slower saturated link, or the same one measured since.
void Telemetry::takeLink(const Link& l) {
  if (link_.from < 0 || l.slowMBps < link_.slowMBps ||
      (l.from == link_.from && l.to == link_.to && l.call > link_.call))
    link_ = l;
}

// The link to `peer`'s counters, summed over its channels (false when a
// channel's transport has none: shared memory, net plugins).
bool Telemetry::countersOf(int peer, std::vector<transport::Connection::LinkCounters>* out) const {
  out->assign(comm_->nChannels(), {});
  for (int ch = 0; ch < comm_->nChannels(); ++ch) {
    const auto& conn = comm_->channel(peer, ch).conn;
    if (!conn || !conn->linkCounters(&(*out)[ch])) return false;
  }
  return true;
}

void Telemetry::willSend(int peer, uint64_t bytes) {
  if (measuring_ && bytes >= kRateMinBytes && peer >= 0 && peer < nranks_)
    based_[peer] = countersOf(peer, &seen_[peer]);
}

// The links this operation sent enough over (see the header): their
// counters now against those at its start.
void Telemetry::measureLinks(int64_t tookUs) {
  std::fill(mbps_.begin(), mbps_.end(), 0.0);
  std::fill(busy_.begin(), busy_.end(), 0.0);
  algo::LinkLoad next;  // this operation's, to the next node
  for (int q = 0; q < nranks_; ++q) {
    if (!based_[q]) continue;
    based_[q] = 0;
    std::vector<transport::Connection::LinkCounters> now;
    if (sent_[q] < kRateMinBytes || !countersOf(q, &now)) continue;
    // The link's bytes are the channels' sum. Its busy time is the union of
    // theirs, which the counters cannot give: the longest is taken (the
    // channels of a saturated link, fed from one queue, are busy at the
    // same time; summing would halve the rate of two). Counters of the
    // whole link (an emulated one) are taken once.
    uint64_t busy = 0, acked = 0;
    for (size_t ch = 0; ch < now.size(); ++ch) {
      busy = std::max(busy, now[ch].busyUs - seen_[q][ch].busyUs);
      acked += now[ch].bytesAcked - seen_[q][ch].bytesAcked;
      if (now[ch].wholeLink) break;
    }
    // The re-plan's sums take every operation's (the kernel's busy time is
    // counted in ticks: many small figures add up to a fair one).
    if (static_cast<size_t>(q) < where_.size() && where_[q] == kNextNode) {
      next.bytes += acked;
      next.busyUs = std::max(next.busyUs, busy);
      next.opUs = static_cast<uint64_t>(std::max<int64_t>(tookUs, 1));
    }
    if (busy < kRateMinBusyUs || acked < kRateMinBytes) continue;
    TUTTI_TRACE(log::kNet, "telemetry: link {} -> {}: {} bytes acknowledged, busy {} us of {} us",
                rank_, q, acked, busy, tookUs);
    mbps_[q] = static_cast<double>(acked) / static_cast<double>(busy);  // bytes/us = MB/s
    // (The acknowledgement of the last bytes may come after the operation
    // ended on this rank.)
    busy_[q] = std::min(
        1.0, static_cast<double>(busy) / static_cast<double>(std::max<int64_t>(tookUs, 1)));
  }
  // Only when this rank sent across nodes to the next node alone.
  for (int q = 0; q < nranks_ && next.opUs; ++q)
    if (static_cast<size_t>(q) < where_.size() && where_[q] == kOtherNode && sent_[q] > 0)
      next = {};
  nextLoad_.bytes += next.bytes;
  nextLoad_.busyUs += next.busyUs;
  nextLoad_.opUs += next.opUs;
}

void Telemetry::end(Clock::time_point now) {
  if (!measuring_) return;
  measuring_ = false;
  ended_ = true;
  lastEnd_ = now;
  const int64_t tookUs =
      std::chrono::duration_cast<std::chrono::microseconds>(now - start_).count();
  measureLinks(tookUs);
  std::vector<StragglerRow> rows;
  for (int q = 0; q < nranks_; ++q) {
    if (lateUs_[q] == kNone && mbps_[q] == 0) continue;
    StragglerRow r{};
    r.kind = tuttiStragglerObserved;
    r.rank = rank_;
    r.peer = q;
    if (lateUs_[q] != kNone) r.lateMs = static_cast<double>(lateUs_[q]) / 1000.0;
    r.mbps = mbps_[q];
    rows.push_back(r);
    if (r.mbps > 0) {  // the link's figures, smoothed over operations
      auto smooth = [](double& avg, double v) {
        avg = avg > 0 ? (1 - kSmoothing) * avg + kSmoothing * v : v;
      };
      smooth(avgMBps_[q], r.mbps);
      smooth(avgBusy_[q], std::max(busy_[q], 1e-3));
    }
  }
  // This rank's saturated links as it last measured them (a link it sends
  // little over may go unmeasured for many operations).
  for (int q = 0; q < nranks_; ++q) {
    if (avgMBps_[q] <= 0 || avgBusy_[q] < kSaturated) continue;
    const auto mbps = static_cast<uint32_t>(std::max(1.0, avgMBps_[q]));
    if (mbps >= fastMBps_) {
      fastMBps_ = mbps;
      fastCall_ = call_;
    }
    takeLink({rank_, q, mbps, call_});
  }
  name(std::max<int64_t>(std::chrono::microseconds(kLateMin).count(), tookUs / 10), &rows);
  std::lock_guard<std::mutex> lk(mu_);
  rows_ = std::move(rows);
}

// Counts the operations a verdict (`key`, -1: none) holds in a row; whether
// to name it now: after kWarnAfter in a row, unless it is the one named last
// and was away less than kQuietOps operations before this run began.
bool Telemetry::Episode::advance(int64_t k, uint64_t op) {
  run = k >= 0 && k == key ? run + 1 : (k >= 0 ? 1 : 0);
  key = k;
  const bool isNamed = k >= 0 && k == named;
  if (isNamed && run == 1) away = op - heldAt;
  if (isNamed) heldAt = op;
  if (run < static_cast<uint64_t>(kWarnAfter) || (isNamed && away <= kQuietOps)) return false;
  named = k;
  heldAt = op;
  away = 0;
  return true;
}

// Keeps the view's verdicts, names them when they held long enough, and
// adds them to *rows.
void Telemetry::name(int64_t lateMinUs, std::vector<StragglerRow>* rows) {
  ++ops_;
  // Late (the late rank names itself too, from the others' gossip).
  Late late = late_;
  if (int64_t{late.ms} * 1000 <= lateMinUs) late = Late{};
  if (lateEp_.advance(late.rank, ops_))
    TUTTI_WARN(
        "straggler: {} arrives late at the collectives: {} ms after the others, in each of the "
        "last {} operations (it computes longer before calling, or is held up outside tutti)",
        comm_->describePeer(late.rank), late.ms, lateEp_.run);
  // Slow link: saturated, and slower than the reference.
  Link link = link_;
  // The probe's figure when there is one: a saturated link's rate may still
  // hold bytes that left in a rate limiter's burst (an even network's links
  // measured up to 2x their rate under load).
  const double probed = comm_->knownInterMBps();
  const double reference = probed > 0 ? probed : static_cast<double>(fastMBps_);
  if (link.from < 0 || link.slowMBps >= kSlowRatio * reference) link = Link{};
  const double ratio = link.from >= 0 ? reference / link.slowMBps : 0;
  if (linkEp_.advance(link.from < 0 ? -1 : int64_t{link.from} * nranks_ + link.to, ops_))
    TUTTI_WARN(
        "straggler: slow link from {} to {}: {} MB/s while saturated, {:.1f}x slower than {} "
        "({:.0f} "
        "MB/s), in each of the last {} operations",
        comm_->describePeer(link.from), comm_->describePeer(link.to), link.slowMBps, ratio,
        probed > 0 ? "the inter-node bandwidth measured at init" : "the fastest saturated link",
        reference, linkEp_.run);
  if (lateEp_.run) {
    StragglerRow r{};
    r.kind = tuttiStragglerLate;
    r.rank = late.rank;
    r.peer = -1;
    r.lateMs = late.ms;
    r.ops = lateEp_.run;
    rows->push_back(r);
  }
  if (linkEp_.run) {
    StragglerRow r{};
    r.kind = tuttiStragglerSlowLink;
    r.rank = link.to;
    r.peer = link.from;
    r.mbps = link.slowMBps;
    r.ratio = ratio;
    r.ops = linkEp_.run;
    rows->push_back(r);
  }
}

std::vector<StragglerRow> Telemetry::report() const {
  std::lock_guard<std::mutex> lk(mu_);
  return rows_;
}

}  // namespace tutti::core
