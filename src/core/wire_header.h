// The header of every data message between two ranks, and how the receiver
// decides where a received header belongs.
//
// Contract
// - MsgHeader is wire format: the executor (core/executor.cc) writes one
//   before each message's payload, and the receiving executor reads it from
//   the connection before anything else of that message. Its fields come from
//   the peer: nothing in them is trusted until classifyHeader() has matched
//   them against a receive this rank posted.
// - classifyHeader() is pure (no I/O, no allocation, no state): given the
//   header, the peer it came from, the sequence number this operation expects
//   from that peer, this operation's receives (an index sorted by RecvKey,
//   without duplicates) and the payload size each receive expects on the
//   wire, it says whether the message is this operation's (and for which
//   receive), a later operation's (to be parked until that one runs), or a
//   protocol error (stale, unexpected, or of the wrong size).
// - Fuzzed by tests/fuzz/wire_header_fuzz.cc.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

namespace tutti::core {

// Wire header preceding every data message.
struct MsgHeader {
  uint64_t seq;    // per (sender, receiver) pair: which group/collective
  uint32_t inst;   // which schedule of the group
  uint32_t bytes;  // payload bytes
  uint64_t tag;    // message within the schedule
};
static_assert(sizeof(MsgHeader) == 24, "MsgHeader is wire format");
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
  kSizeMismatch,  // the receive `flat` expects another size
};

struct HeaderVerdict {
  HeaderClass kind;
  uint32_t flat = 0;       // kMatch, kSizeMismatch: the receive
  size_t expectBytes = 0;  // kMatch, kSizeMismatch: its wire size
};

// `expectBytes(flat)`: the payload bytes receive `flat` expects on the wire.
template <typename ExpectBytes>
HeaderVerdict classifyHeader(const MsgHeader& h, int peer, uint64_t recvSeq, const RecvIndex& index,
                             ExpectBytes&& expectBytes) {
  if (h.seq != recvSeq) return {h.seq > recvSeq ? HeaderClass::kLater : HeaderClass::kStale};
  const RecvKey key{peer, h.inst, h.tag};
  auto it = std::lower_bound(index.begin(), index.end(), key,
                             [](const auto& e, const RecvKey& k) { return e.first < k; });
  if (it == index.end() || !(it->first == key)) return {HeaderClass::kUnexpected};
  const size_t expect = expectBytes(it->second);
  if (expect != h.bytes) return {HeaderClass::kSizeMismatch, it->second, expect};
  return {HeaderClass::kMatch, it->second, expect};
}

}  // namespace tutti::core
