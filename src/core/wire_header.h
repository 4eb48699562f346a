// The header of every data message between two ranks, and how the receiver
// decides where a received header belongs.
//
// Contract
// - MsgHeader is wire format: the executor (core/executor.cc) writes one
//   before each message's payload, and the receiving executor reads it from
//   the connection before anything else of that message. Its fields come from
//   the peer: nothing in them is trusted until classifyHeader() has matched
//   them against a receive this rank posted.
// - Every message carries its operation's fingerprint (OpSig: the call's
//   collective, count, datatype, reduction, root, its number among the
//   communicator's collective calls and a hash of the algorithm planned), so
//   that ranks whose calls differ find out from the first message they
//   exchange instead of combining bytes of different meaning.
// - classifyHeader() is pure (no I/O, no allocation, no state): given the
//   header, the peer it came from, the sequence number this operation expects
//   from that peer, this operation's receives (an index sorted by RecvKey,
//   without duplicates), the payload size each receive expects on the wire
//   and the fingerprint of each of this operation's schedules, it says
//   whether the message is this operation's (and for which receive), a later
//   operation's (to be parked until that one runs), or a protocol error
//   (stale, unexpected, of another call, or of the wrong size).
// - Fuzzed by tests/fuzz/wire_header_fuzz.cc.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

namespace tutti::core {

// An operation's fingerprint, as each rank's own call describes it: equal on
// every rank when the calls match. Point-to-point schedules carry
// kP2pSig (their sizes are checked per message).
struct OpSig {
  uint64_t count = 0;  // the call's count (a fused set: its packed count)
  uint32_t call = 0;   // its number among the communicator's collective calls (low 32 bits)
  int32_t root = -1;   // broadcast, reduce, gather, scatter; else -1
  uint32_t plan = 0;   // hash of the algorithm planned (algoHash ^ Schedule::planKey)
  uint8_t coll = 0;    // algo::Collective
  uint8_t dt = 0;      // ncclDataType_t (a fused all-gather or broadcast: uint8)
  uint8_t op = 0xff;   // ncclRedOp_t of a reduction (5: a PreMulSum operator); else 0xff
  uint8_t reserved = 0;
  bool operator==(const OpSig& o) const {
    return count == o.count && call == o.call && root == o.root && plan == o.plan &&
           coll == o.coll && dt == o.dt && op == o.op;
  }
  bool operator!=(const OpSig& o) const { return !(*this == o); }
};
static_assert(sizeof(OpSig) == 24, "OpSig is wire format");

// FNV-1a of an algorithm's name: OpSig::plan.
inline uint32_t algoHash(const char* name) {
  uint32_t h = 2166136261u;
  for (; *name; ++name) h = (h ^ static_cast<uint8_t>(*name)) * 16777619u;
  return h;
}

// The fingerprint of a group's point-to-point schedule (instance 0): their
// sizes are checked message by message. (8: algo::Collective::kSend.)
inline OpSig p2pSig() {
  OpSig g;
  g.coll = 8;
  g.plan = algoHash("p2p");
  return g;
}

// What a message tells its receiver about the sender's operation and about
// the stragglers the sender knows of (core/telemetry.h). Hints only: nothing
// in them decides where bytes go, and a rank out of range is ignored.
struct Gossip {
  uint16_t sinceStart = 0;  // units of 64 us from the sender's start of the operation (saturating)
  uint16_t gap = 0;         // units of 64 us the sender spent outside tutti before it (saturating)
  uint16_t viewCall = 0;    // low 16 bits of the oldest collective call the view below is from
  int16_t lateRank = -1;    // the rank the sender's view has arrive late (-1: none)
  uint16_t lateMs = 0;      // by how much, in ms (saturating)
  int16_t linkFrom = -1;    // the slowest network link the sender knows (-1: none) ...
  int16_t linkTo = -1;      // ... from linkFrom to linkTo
  uint16_t slowMBps = 0;    // its rate, MB/s (saturating)
  uint16_t fastMBps = 0;    // the fastest saturated network link's the sender knows, MB/s
  uint8_t reserved[6] = {};
};
static_assert(sizeof(Gossip) == 24, "Gossip is wire format");

// Wire header preceding every data message.
struct MsgHeader {
  uint64_t seq;    // per (sender, receiver) pair: which group/collective
  uint32_t inst;   // which schedule of the group
  uint32_t bytes;  // payload bytes
  uint64_t tag;    // message within the schedule
  OpSig sig;       // the schedule's operation, as the sender called it
  Gossip gossip;   // telemetry (not checked by classifyHeader)
};
static_assert(sizeof(MsgHeader) == 72, "MsgHeader is wire format");
static_assert(std::is_trivially_copyable_v<MsgHeader>, "MsgHeader is wire format");

// A receive as its messages name it: from whom, of which schedule, with which tag.
struct RecvKey {
  int peer;
  uint32_t inst;
  uint64_t tag;
  bool operator==(const RecvKey& o) const {
    return peer == o.peer && inst == o.inst && tag == o.tag;
  }
  bool operator<(const RecvKey& o) const {
    if (peer != o.peer) return peer < o.peer;
    if (inst != o.inst) return inst < o.inst;
    return tag < o.tag;
  }
};

// An operation's receives, sorted by key: (key, flat receive index).
using RecvIndex = std::vector<std::pair<RecvKey, uint32_t>>;

enum class HeaderClass {
  kMatch,         // this operation's message for receive `flat`
  kLater,         // a later operation's (seq ahead): park it
  kStale,         // an earlier operation's (seq behind): an error
  kUnexpected,    // this operation's sequence, but no receive has its key
  kSigMismatch,   // a receive `flat` has its key, but the sender's call differs from ours
  kSizeMismatch,  // the receive `flat` expects another size
};

struct HeaderVerdict {
  HeaderClass kind;
  uint32_t flat = 0;       // kMatch, kSigMismatch, kSizeMismatch: the receive
  size_t expectBytes = 0;  // kMatch, kSizeMismatch: its wire size
};

// `expectBytes(flat)`: the payload bytes receive `flat` expects on the wire;
// `expectSig(inst)`: the fingerprint of this operation's schedule `inst`
// (asked only for a schedule some receive belongs to). A differing
// fingerprint is reported before a differing size: it names both calls.
template <typename ExpectBytes, typename ExpectSig>
HeaderVerdict classifyHeader(const MsgHeader& h, int peer, uint64_t recvSeq, const RecvIndex& index,
                             ExpectBytes&& expectBytes, ExpectSig&& expectSig) {
  if (h.seq != recvSeq) return {h.seq > recvSeq ? HeaderClass::kLater : HeaderClass::kStale};
  const RecvKey key{peer, h.inst, h.tag};
  auto it = std::lower_bound(index.begin(), index.end(), key,
                             [](const auto& e, const RecvKey& k) { return e.first < k; });
  if (it == index.end() || !(it->first == key)) return {HeaderClass::kUnexpected};
  if (!(expectSig(h.inst) == h.sig)) return {HeaderClass::kSigMismatch, it->second};
  const size_t expect = expectBytes(it->second);
  if (expect != h.bytes) return {HeaderClass::kSizeMismatch, it->second, expect};
  return {HeaderClass::kMatch, it->second, expect};
}

}  // namespace tutti::core
