// Fuzz target: auth::Handshake (base/auth.h), the challenge-response every
// connection runs before anything else is read, driven without sockets.
//
// Input: byte 0 picks the scenario and its options; the rest drives it.
// - Lone responder / lone initiator: the input is what the peer sends, in
//   pieces: each control byte gives a piece length (low 7 bits; longer than
//   wanted() at times) and whether the output is drained after it (high
//   bit; else a few bytes of it are consumed).
// - Pair: an initiator and a responder with the same key talk to each other;
//   each control byte moves up to 127 bytes one way or the other, and the
//   exchange is finished once the input runs out. Two more bytes name one
//   byte of the conversation to corrupt, and how.
//
// Invariants (a violation traps):
// - wanted() and outputBytes() never exceed 80 (the largest message), and
//   are 0 once the handshake has ended; a failed handshake says why.
// - onBytes takes no more than wanted(): offering more leaves the handshake
//   exactly where offering wanted() bytes does (checked on a copy).
// - Fed bytes by someone without the key, neither end ever completes.
// - Two ends with the same key, purpose and expected identities complete,
//   each learning the other's identity; with one byte of the conversation
//   corrupted the initiator never completes, nor does the responder when
//   the corrupted byte precedes its Welcome. Different purposes never
//   complete.
#include <cstdint>
#include <cstring>
#include <string>

#include "base/auth.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

using tutti::auth::Handshake;
using tutti::auth::Identity;
using tutti::auth::Key;
using tutti::auth::Purpose;
using State = Handshake::State;

constexpr size_t kLargestMessage = sizeof(tutti::auth::AnswerMsg);  // 80

// A fixed key that looks random (a zero key would be the keyless mode).
Key fixedKey() {
  static const uint8_t kBytes[32] = {0x3c, 0x9e, 0x51, 0x07, 0xd2, 0x8a, 0x64, 0xf1,
                                     0x1b, 0xc7, 0x39, 0x5d, 0xa0, 0x6e, 0xe8, 0x22,
                                     0x94, 0x0f, 0x7b, 0xb3, 0x48, 0xd9, 0x15, 0x6a,
                                     0xcf, 0x80, 0x2e, 0x73, 0xf6, 0x41, 0x9b, 0x05};
  Key k;
  std::memcpy(k.bytes.data(), kBytes, sizeof(kBytes));
  return k;
}

bool sameIdentity(const Identity& a, const Identity& b) {
  return a.rank == b.rank && a.channel == b.channel;
}

void checkBounds(const Handshake& h) {
  FUZZ_CHECK(h.wanted() <= kLargestMessage);
  FUZZ_CHECK(h.outputBytes() <= kLargestMessage);
  if (h.state() != State::kRunning) FUZZ_CHECK(h.wanted() == 0);
  if (h.state() == State::kFailed) {
    FUZZ_CHECK(h.outputBytes() == 0);
    FUZZ_CHECK(!h.error().empty());
  } else {
    FUZZ_CHECK(h.error().empty());
  }
}

// Where a handshake stands, as far as its user can see.
bool sameStanding(const Handshake& a, const Handshake& b) {
  return a.state() == b.state() && a.wanted() == b.wanted() && a.outputBytes() == b.outputBytes() &&
         std::memcmp(a.output(), b.output(), a.outputBytes()) == 0 && a.error() == b.error();
}

// Offers n bytes. When n exceeds wanted(), a copy is offered just wanted()
// bytes, and both must end up in the same place.
void feed(Handshake& h, const uint8_t* p, size_t n) {
  const size_t w = h.wanted();
  if (n > w) {
    Handshake careful = h;
    careful.onBytes(p, w);
    h.onBytes(p, n);
    FUZZ_CHECK(sameStanding(h, careful));
  } else {
    h.onBytes(p, n);
  }
  checkBounds(h);
}

void consume(Handshake& h, size_t n) {
  const size_t before = h.outputBytes();
  h.consumeOutput(n);
  FUZZ_CHECK(h.outputBytes() == before - (n < before ? n : before));
  checkBounds(h);
}

// Someone without the key talks to `h`.
void lone(Handshake& h, tutti::fuzz::Input& in) {
  checkBounds(h);
  while (!in.empty()) {
    const uint8_t c = in.byte();
    size_t got = 0;
    const uint8_t* piece = in.take(c & 0x7f, &got);
    feed(h, piece, got);
    consume(h, (c & 0x80) ? h.outputBytes() : got % 17);
    FUZZ_CHECK(h.state() != State::kDone);
  }
  consume(h, h.outputBytes());
  FUZZ_CHECK(h.state() != State::kDone);
}

// Moves up to `limit` bytes of from's output to `to`, as a careful caller
// (never more than `to` wants) would; `flipAt` (a position in the whole
// conversation) is corrupted with `flipXor` on the way.
size_t move(Handshake& from, Handshake& to, size_t limit, size_t* pos, size_t flipAt,
            uint8_t flipXor, bool* flipped) {
  size_t k = from.outputBytes();
  if (k > limit) k = limit;
  if (k > to.wanted()) k = to.wanted();
  if (k == 0) return 0;
  uint8_t buf[kLargestMessage];
  std::memcpy(buf, from.output(), k);
  if (flipAt >= *pos && flipAt < *pos + k) {
    buf[flipAt - *pos] ^= flipXor;
    *flipped = true;
  }
  *pos += k;
  consume(from, k);
  feed(to, buf, k);
  return k;
}

void pair(uint8_t mode, tutti::fuzz::Input& in) {
  const bool zeroKey = mode & 0x40;
  const bool otherPurpose = mode & 0x20;
  const bool specific = mode & 0x10;
  const Key key = zeroKey ? Key{} : fixedKey();
  const auto purpose = static_cast<Purpose>(1 + ((mode >> 2) & 3) % 3);
  const auto initiatorPurpose =
      otherPurpose ? static_cast<Purpose>(1 + static_cast<int>(purpose) % 3) : purpose;
  const int32_t channel = mode >> 7;
  const Identity root{-1, 0};
  const Identity rank{2, channel};

  Handshake initiator(Handshake::Role::kInitiator, key, initiatorPurpose, rank,
                      specific ? root : tutti::auth::kAnyPeer);
  Handshake responder(Handshake::Role::kResponder, key, purpose, root,
                      specific ? rank : tutti::auth::kAnyPeer);
  checkBounds(initiator);
  checkBounds(responder);
  FUZZ_CHECK(initiator.outputBytes() == sizeof(tutti::auth::HelloMsg));
  FUZZ_CHECK(responder.outputBytes() == 0);

  const bool tamper = (mode & 3) == 2;
  const size_t flipAt = tamper ? in.byte() : SIZE_MAX;
  uint8_t flipXor = in.byte();
  if (flipXor == 0) flipXor = 0x80;
  bool flipped = false;
  size_t pos = 0;

  while (!in.empty()) {
    const uint8_t c = in.byte();
    if (c & 1)
      move(responder, initiator, c >> 1, &pos, flipAt, flipXor, &flipped);
    else
      move(initiator, responder, c >> 1, &pos, flipAt, flipXor, &flipped);
  }
  // The rest of the conversation, whole messages at a time.
  for (int i = 0; i < 16; ++i) {
    size_t moved = move(initiator, responder, SIZE_MAX, &pos, flipAt, flipXor, &flipped);
    moved += move(responder, initiator, SIZE_MAX, &pos, flipAt, flipXor, &flipped);
    if (moved == 0) break;
  }
  // Output left over (the responder's Welcome, when the initiator failed).
  consume(initiator, initiator.outputBytes());
  consume(responder, responder.outputBytes());

  const bool initiatorDone = initiator.state() == State::kDone;
  const bool responderDone = responder.state() == State::kDone;
  if (otherPurpose) {
    FUZZ_CHECK(!initiatorDone && !responderDone);
    return;
  }
  if (flipped) {
    FUZZ_CHECK(!initiatorDone);
    // Hello, Answer and Proof come before the Welcome.
    if (flipAt < sizeof(tutti::auth::HelloMsg) + sizeof(tutti::auth::AnswerMsg) +
                     sizeof(tutti::auth::ProofMsg))
      FUZZ_CHECK(!responderDone);
    return;
  }
  FUZZ_CHECK(initiatorDone && responderDone);
  FUZZ_CHECK(sameIdentity(initiator.peer(), root));
  FUZZ_CHECK(sameIdentity(responder.peer(), rank));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  tutti::fuzz::Input in(data, size);
  const uint8_t mode = in.byte();
  const auto purpose = static_cast<Purpose>(1 + ((mode >> 2) & 3) % 3);
  const Identity self{3, 1};
  const Identity expect = (mode & 0x10) ? Identity{7, 0} : tutti::auth::kAnyPeer;
  switch (mode & 3) {
    case 0: {
      Handshake h(Handshake::Role::kResponder, fixedKey(), purpose, self, expect);
      FUZZ_CHECK(h.outputBytes() == 0);  // a responder speaks only when spoken to
      lone(h, in);
      break;
    }
    case 1: {
      Handshake h(Handshake::Role::kInitiator, fixedKey(), purpose, self, expect);
      FUZZ_CHECK(h.outputBytes() == sizeof(tutti::auth::HelloMsg));
      lone(h, in);
      break;
    }
    default:
      pair(mode, in);
      break;
  }
  return 0;
}
