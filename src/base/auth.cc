#include "base/auth.h"

#include <fmt/format.h>
#include <poll.h>
#include <sodium.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace tutti::auth {
namespace {

constexpr char kAnswerLabel[] = "tutti-auth-1 answer";
constexpr char kProofLabel[] = "tutti-auth-1 proof";
constexpr char kKeyLabel[] = "tutti-key-1";

bool sodiumReady() {
  // sodium_init is thread-safe and idempotent: 0 first time, 1 afterwards.
  static const bool ok = sodium_init() >= 0;
  return ok;
}

bool matches(const Identity& want, int32_t rank, int32_t channel) {
  return (want.rank == kAnyPeer.rank || want.rank == rank) &&
         (want.channel == kAnyPeer.channel || want.channel == channel);
}

std::string describe(const Identity& id) {
  std::string who = id.rank == -1 ? "the bootstrap root" : fmt::format("rank {}", id.rank);
  if (id.channel != 0 && id.channel != kAnyPeer.channel)
    who += fmt::format(" (channel {})", id.channel);
  return who;
}

}  // namespace

bool Key::isZero() const {
  return std::all_of(bytes.begin(), bytes.end(), [](uint8_t b) { return b == 0; });
}

Key deriveKey(std::string_view secret) {
  Key k;
  (void)sodiumReady();  // picks the fastest implementation; hashing works either way
  crypto_generichash_state st;
  crypto_generichash_init(&st, nullptr, 0, k.bytes.size());
  crypto_generichash_update(&st, reinterpret_cast<const uint8_t*>(kKeyLabel), sizeof(kKeyLabel));
  crypto_generichash_update(&st, reinterpret_cast<const uint8_t*>(secret.data()), secret.size());
  crypto_generichash_final(&st, k.bytes.data(), k.bytes.size());
  return k;
}

Status randomBytes(void* out, size_t n) {
  if (!sodiumReady()) return systemError("libsodium failed to initialise (no random source?)");
  randombytes_buf(out, n);
  return Status::ok();
}

Result<Key> randomKey() {
  Key k;
  TUTTI_RETURN_IF_ERROR(randomBytes(k.bytes.data(), k.bytes.size()));
  return k;
}

Handshake::Handshake(Role role, const Key& key, Purpose purpose, Identity self, Identity expect)
    : role_(role), key_(key), purpose_(purpose), expect_(expect) {
  HelloMsg& mine = role == Role::kInitiator ? hello_ : answer_.head;
  mine.magic = kMagic;
  mine.version = kVersion;
  mine.purpose = static_cast<uint16_t>(purpose);
  mine.rank = self.rank;
  mine.channel = self.channel;
  Status st = randomBytes(mine.nonce, sizeof(mine.nonce));
  if (!st) {
    fail(st.message());
    return;
  }
  if (role == Role::kInitiator) {
    setOutput(&hello_, sizeof(hello_));
    step_ = Step::kAnswer;
  } else {
    step_ = Step::kHello;
  }
}

Handshake::State Handshake::fail(std::string why) {
  state_ = State::kFailed;
  error_ = std::move(why);
  outLen_ = outOff_ = 0;
  return state_;
}

void Handshake::setOutput(const void* data, size_t n) {
  memcpy(out_, data, n);
  outLen_ = n;
  outOff_ = 0;
}

void Handshake::mac(const char* label, const uint8_t* data, size_t n,
                    uint8_t out[kMacBytes]) const {
  crypto_auth_hmacsha256_state st;
  crypto_auth_hmacsha256_init(&st, key_.bytes.data(), key_.bytes.size());
  crypto_auth_hmacsha256_update(&st, reinterpret_cast<const uint8_t*>(label), strlen(label));
  crypto_auth_hmacsha256_update(&st, data, n);
  crypto_auth_hmacsha256_final(&st, out);
}

size_t Handshake::wanted() const {
  if (state_ != State::kRunning) return 0;
  switch (step_) {
    case Step::kHello:
      return sizeof(HelloMsg) - inLen_;
    case Step::kAnswer:
      return sizeof(AnswerMsg) - inLen_;
    case Step::kProof:
      return sizeof(ProofMsg) - inLen_;
    case Step::kWelcome:
      return sizeof(WelcomeMsg) - inLen_;
    case Step::kEnd:
      return 0;
  }
  return 0;
}

void Handshake::finishIfDrained() {
  if (state_ == State::kRunning && step_ == Step::kEnd && outputBytes() == 0) state_ = State::kDone;
}

Handshake::State Handshake::consumeOutput(size_t n) {
  outOff_ += std::min(n, outputBytes());
  finishIfDrained();
  return state_;
}

Handshake::State Handshake::onBytes(const uint8_t* data, size_t n) {
  size_t take = std::min(n, wanted());
  if (take > 0) {
    memcpy(in_ + inLen_, data, take);
    inLen_ += take;
    if (wanted() == 0) {
      onMessage();
      inLen_ = 0;
    }
  }
  finishIfDrained();
  return state_;
}

Handshake::State Handshake::onMessage() {
  auto checkHead = [&](const HelloMsg& h) -> bool {
    if (h.magic != kMagic || h.version != kVersion) {
      fail("not a tutti connection (or a tutti of another protocol version)");
      return false;
    }
    if (h.purpose != static_cast<uint16_t>(purpose_)) {
      fail(fmt::format("connection meant for another listener (purpose {}, expected {})", h.purpose,
                       static_cast<uint16_t>(purpose_)));
      return false;
    }
    if (!matches(expect_, h.rank, h.channel)) {
      fail(fmt::format("the peer says it is {}, expected {}", describe({h.rank, h.channel}),
                       describe(expect_)));
      return false;
    }
    peer_ = {h.rank, h.channel};
    return true;
  };
  uint8_t want[kMacBytes];
  switch (step_) {
    case Step::kHello: {  // responder
      memcpy(&hello_, in_, sizeof(hello_));
      if (!checkHead(hello_)) return state_;
      uint8_t both[2 * sizeof(HelloMsg)];
      memcpy(both, &hello_, sizeof(HelloMsg));
      memcpy(both + sizeof(HelloMsg), &answer_.head, sizeof(HelloMsg));
      mac(kAnswerLabel, both, sizeof(both), answer_.mac);
      setOutput(&answer_, sizeof(answer_));
      step_ = Step::kProof;
      return state_;
    }
    case Step::kAnswer: {  // initiator
      memcpy(&answer_, in_, sizeof(answer_));
      if (!checkHead(answer_.head)) return state_;
      uint8_t both[2 * sizeof(HelloMsg)];
      memcpy(both, &hello_, sizeof(HelloMsg));
      memcpy(both + sizeof(HelloMsg), &answer_.head, sizeof(HelloMsg));
      mac(kAnswerLabel, both, sizeof(both), want);
      if (sodium_memcmp(want, answer_.mac, kMacBytes) != 0) {
        keyMismatch_ = true;
        return fail(fmt::format(
            "{} holds another key than this process (one of the two is a stranger or belongs "
            "to another job: were both given the same unique id, or the same "
            "TUTTI_BOOTSTRAP_SECRET with NCCL_COMM_ID?)",
            describe(peer_)));
      }
      uint8_t all[sizeof(HelloMsg) + sizeof(AnswerMsg)];
      memcpy(all, &hello_, sizeof(HelloMsg));
      memcpy(all + sizeof(HelloMsg), &answer_, sizeof(AnswerMsg));
      ProofMsg proof;
      mac(kProofLabel, all, sizeof(all), proof.mac);
      setOutput(&proof, sizeof(proof));
      step_ = Step::kWelcome;
      return state_;
    }
    case Step::kProof: {  // responder
      uint8_t all[sizeof(HelloMsg) + sizeof(AnswerMsg)];
      memcpy(all, &hello_, sizeof(HelloMsg));
      memcpy(all + sizeof(HelloMsg), &answer_, sizeof(AnswerMsg));
      mac(kProofLabel, all, sizeof(all), want);
      if (sodium_memcmp(want, in_, kMacBytes) != 0) {
        keyMismatch_ = true;
        return fail(
            fmt::format("a connection claiming to be {} does not know this "
                        "communicator's key (a stranger, or a process of another job)",
                        describe(peer_)));
      }
      WelcomeMsg w{kMagic, 1};
      setOutput(&w, sizeof(w));
      step_ = Step::kEnd;
      return state_;
    }
    case Step::kWelcome: {  // initiator
      WelcomeMsg w;
      memcpy(&w, in_, sizeof(w));
      if (w.magic != kMagic || w.accepted != 1)
        return fail(fmt::format("{} sent a malformed welcome", describe(peer_)));
      step_ = Step::kEnd;
      return state_;
    }
    case Step::kEnd:
      break;
  }
  return state_;
}

Handshake::State Handshake::advance(int fd) {
  for (;;) {
    if (state_ != State::kRunning) return state_;
    bool moved = false;
    if (outputBytes() > 0) {
      ssize_t n = ::send(fd, output(), outputBytes(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        consumeOutput(static_cast<size_t>(n));
        moved = true;
      } else if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        closedEarly_ = true;
        return fail(fmt::format("connection lost during the handshake: {}", strerror(errno)));
      }
    }
    if (state_ != State::kRunning) return state_;
    size_t want = wanted();
    if (want > 0) {
      uint8_t buf[sizeof(AnswerMsg)];
      ssize_t n = ::recv(fd, buf, want, MSG_DONTWAIT);
      if (n > 0) {
        onBytes(buf, static_cast<size_t>(n));
        moved = true;
      } else if (n == 0) {
        closedEarly_ = true;
        return fail(peerProven()
                        ? "the peer closed the connection during the handshake, after proving "
                          "the key (it was busy, or it ended)"
                        : "the peer closed the connection during the handshake (it may not know "
                          "this communicator's key, or it was busy turning strangers away)");
      } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        closedEarly_ = true;
        return fail(fmt::format("connection lost during the handshake: {}", strerror(errno)));
      }
    }
    if (!moved) return state_;
  }
}

bool Handshake::peerProven() const {
  // The initiator checks the answer's MAC before it waits for the welcome;
  // the responder checks the proof before it sends the welcome.
  return role_ == Role::kInitiator ? step_ == Step::kWelcome || step_ == Step::kEnd
                                   : step_ == Step::kEnd;
}

bool Handshake::heardHello() const { return role_ == Role::kResponder && step_ != Step::kHello; }

short Handshake::pollEvents() const { return outputBytes() > 0 ? POLLOUT : POLLIN; }

Status runHandshake(Handshake& h, int fd, std::chrono::steady_clock::time_point deadline,
                    const std::atomic<bool>* abortFlag, const std::string& what) {
  using Clock = std::chrono::steady_clock;
  for (;;) {
    auto st = h.advance(fd);
    if (st == Handshake::State::kDone) return Status::ok();
    if (st == Handshake::State::kFailed) {
      std::string msg = fmt::format("authenticating {}: {}", what, h.error());
      return h.keyMismatch() ? invalidUsage(std::move(msg)) : remoteError(std::move(msg));
    }
    if (abortFlag && abortFlag->load(std::memory_order_relaxed))
      return invalidUsage(fmt::format("aborted while authenticating {}", what));
    auto now = Clock::now();
    if (now >= deadline) return remoteError(fmt::format("timed out authenticating {}", what));
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
    pollfd p{fd, h.pollEvents(), 0};
    int rc = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left + 1, 50)));
    if (rc < 0 && errno != EINTR) return errnoError("poll while authenticating " + what, errno);
  }
}

}  // namespace tutti::auth
