// Fuzz target: core::classifyHeader (core/wire_header.h), the executor's
// check of the header of a data message received from a peer: is it this
// operation's message and for which receive, a later operation's, or a
// protocol error?
//
// Input: the peer (1 byte), the sequence number expected from it (8), the
// number of receives posted (1) and each one's peer, schedule, tag and wire
// size (1 + 1 + 2 + 4), the fingerprint each of the 4 schedules expects (a
// byte each: 0 = the header's own, else the header's with `call` changed),
// then the 48 header bytes as they came off the wire.
//
// Invariants (a violation traps): the verdict is the one a linear search of
// the receives gives; a match names a receive of that peer with the
// header's schedule, tag, fingerprint and size; the expected size and
// fingerprint are asked for at most once each, and only of a receive (and
// its schedule) that exists.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/wire_header.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

using tutti::core::HeaderClass;
using tutti::core::HeaderVerdict;
using tutti::core::MsgHeader;
using tutti::core::OpSig;
using tutti::core::RecvIndex;
using tutti::core::RecvKey;

struct Posted {
  RecvKey key;
  uint32_t wireBytes;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tutti::fuzz::Input in(data, size);
  const int peer = in.byte() % 8;
  const uint64_t recvSeq = in.value<uint64_t>();
  const size_t count = in.byte() % 33;

  // The receives as the executor posts them: flat index = position, the
  // index sorted by key, no key twice (Run::start refuses duplicates).
  std::vector<Posted> posted;
  for (size_t i = 0; i < count; ++i) {
    Posted p;
    p.key.peer = in.byte() % 8;
    p.key.inst = in.byte() % 4;
    p.key.tag = in.value<uint16_t>();
    p.wireBytes = in.value<uint32_t>();
    const bool dup =
        std::any_of(posted.begin(), posted.end(), [&](const Posted& q) { return q.key == p.key; });
    if (!dup) posted.push_back(p);
  }
  RecvIndex index;
  for (uint32_t i = 0; i < posted.size(); ++i) index.push_back({posted[i].key, i});
  std::sort(index.begin(), index.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });

  uint8_t sigDiffers[4];
  for (uint8_t& d : sigDiffers) d = in.byte() & 1;

  MsgHeader h{};
  uint8_t raw[sizeof(MsgHeader)] = {};
  size_t got = 0;
  const uint8_t* bytes = in.take(sizeof(raw), &got);
  std::memcpy(raw, bytes, got);
  std::memcpy(&h, raw, sizeof(h));

  int asked = 0, askedSig = 0;
  const HeaderVerdict v = tutti::core::classifyHeader(
      h, peer, recvSeq, index,
      [&](uint32_t flat) -> size_t {
        ++asked;
        FUZZ_CHECK(flat < posted.size());
        return posted[flat].wireBytes;
      },
      [&](uint32_t inst) {
        ++askedSig;
        FUZZ_CHECK(inst < 4);
        FUZZ_CHECK(std::any_of(posted.begin(), posted.end(),
                               [&](const Posted& p) { return p.key.inst == inst; }));
        OpSig s = h.sig;
        if (sigDiffers[inst]) s.call ^= 1;
        return s;
      });
  FUZZ_CHECK(asked <= 1 && askedSig <= 1);

  // The same question, answered by a linear search.
  if (h.seq != recvSeq) {
    FUZZ_CHECK(v.kind == (h.seq > recvSeq ? HeaderClass::kLater : HeaderClass::kStale));
    FUZZ_CHECK(asked == 0 && askedSig == 0);
    return 0;
  }
  const RecvKey key{peer, h.inst, h.tag};
  auto it =
      std::find_if(posted.begin(), posted.end(), [&](const Posted& p) { return p.key == key; });
  if (it == posted.end()) {
    FUZZ_CHECK(v.kind == HeaderClass::kUnexpected);
    FUZZ_CHECK(asked == 0 && askedSig == 0);
    return 0;
  }
  const uint32_t flat = static_cast<uint32_t>(it - posted.begin());
  FUZZ_CHECK(askedSig == 1);
  if (sigDiffers[h.inst]) {
    FUZZ_CHECK(v.kind == HeaderClass::kSigMismatch && v.flat == flat && asked == 0);
    return 0;
  }
  FUZZ_CHECK(asked == 1);
  FUZZ_CHECK(v.flat == flat);
  FUZZ_CHECK(v.expectBytes == it->wireBytes);
  FUZZ_CHECK(v.kind ==
             (it->wireBytes == h.bytes ? HeaderClass::kMatch : HeaderClass::kSizeMismatch));
  if (v.kind == HeaderClass::kMatch) {
    FUZZ_CHECK(posted[v.flat].key.peer == peer && posted[v.flat].key.inst == h.inst &&
               posted[v.flat].key.tag == h.tag && v.expectBytes == h.bytes);
  }
  return 0;
}
