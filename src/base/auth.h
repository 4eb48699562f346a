// Mutual challenge-response authentication of a stream connection.
//
// Contract
// - Both ends hold the same 32-byte key (auth::Key): the communicator's, from
//   its unique id. Neither end ever sends it. Each proves that it knows the
//   key with HMAC-SHA-256 (libsodium) over both ends' fresh random nonces and
//   both ends' claimed identities, so a recorded handshake is worthless for
//   any other connection, and a responder's answer cannot be replayed as an
//   initiator's proof (the two MACs carry different labels).
// - Four messages of fixed size, in this order:
//     Hello   initiator -> responder  48 bytes  magic, version, purpose,
//                                               identity (rank, channel), nonce
//     Answer  responder -> initiator  80 bytes  the same fields of the
//                                               responder, and its MAC
//     Proof   initiator -> responder  32 bytes  the initiator's MAC
//     Welcome responder -> initiator   8 bytes  the proof was accepted
//   The initiator checks the responder's MAC before it proves anything, so a
//   stranger posing as a root or a peer learns nothing it could use. The
//   responder asks for no byte beyond the proof until it has checked it:
//   whatever a stranger sends is never read past 80 bytes and never
//   allocates.
// - `purpose` keeps uses apart (bootstrap root, bootstrap peer, TCP data): a
//   handshake for one cannot complete against a listener of another.
// - Handshake is sans-I/O and allocation-free: bytes in (onBytes), bytes out
//   (output/consumeOutput); advance(fd) does both on a non-blocking socket,
//   runHandshake() drives it on one socket until a deadline. The caller
//   decides whether the identity the peer proved is the one it wanted
//   (peer() once done).
// - The all-zero key is what a job without a key uses (NCCL_COMM_ID without
//   TUTTI_BOOTSTRAP_SECRET): the handshake still runs, but anybody can
//   complete it; the bootstrap warns about that once.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <type_traits>

#include "base/status.h"

namespace tutti::auth {

constexpr size_t kKeyBytes = 32;
constexpr size_t kNonceBytes = 32;
constexpr size_t kMacBytes = 32;
// How long a responder gives a connection to authenticate itself. Every
// listener closes a connection that has not proven itself by then.
constexpr double kHandshakeSeconds = 2.0;

struct Key {
  std::array<uint8_t, kKeyBytes> bytes{};
  bool isZero() const;
};

// A key from an operator's secret (TUTTI_BOOTSTRAP_SECRET's text or the
// bytes of a key file): BLAKE2b-256 of a label and the secret. The same
// secret gives the same key on every host.
Key deriveKey(std::string_view secret);
// A fresh key from the OS's random source.
Result<Key> randomKey();
// Fills `out` with random bytes from the OS's random source.
Status randomBytes(void* out, size_t n);

enum class Purpose : uint16_t { kBootstrapRoot = 1, kBootstrapPeer = 2, kTcpData = 3 };

// Who an end says it is. The root of a bootstrap is rank -1.
struct Identity {
  int32_t rank = -1;
  int32_t channel = 0;
};
// An expectation that any identity meets.
constexpr Identity kAnyPeer{INT32_MIN, INT32_MIN};

constexpr uint32_t kMagic = 0x54415554;  // "TUAT"
constexpr uint16_t kVersion = 1;

struct HelloMsg {
  uint32_t magic;
  uint16_t version;
  uint16_t purpose;
  int32_t rank;
  int32_t channel;
  uint8_t nonce[kNonceBytes];
};
struct AnswerMsg {
  HelloMsg head;
  uint8_t mac[kMacBytes];
};
struct ProofMsg {
  uint8_t mac[kMacBytes];
};
struct WelcomeMsg {
  uint32_t magic;
  uint32_t accepted;
};
static_assert(sizeof(HelloMsg) == 48 && std::is_trivially_copyable_v<HelloMsg>);
static_assert(sizeof(AnswerMsg) == 80 && std::is_trivially_copyable_v<AnswerMsg>);
static_assert(sizeof(ProofMsg) == 32 && std::is_trivially_copyable_v<ProofMsg>);
static_assert(sizeof(WelcomeMsg) == 8 && std::is_trivially_copyable_v<WelcomeMsg>);

class Handshake {
 public:
  enum class Role { kInitiator, kResponder };
  enum class State { kRunning, kDone, kFailed };

  // The initiator's Hello is ready in output() at once. A peer claiming an
  // identity other than `expect` fails the handshake before any MAC is
  // computed (fields of kAnyPeer's value match anything). A failure of the
  // random source leaves the handshake failed (error() says so).
  Handshake(Role role, const Key& key, Purpose purpose, Identity self, Identity expect = kAnyPeer);

  State state() const { return state_; }
  // How many bytes the handshake wants to read next (0: none now). Reading
  // no more than this keeps whatever follows the handshake in the socket.
  size_t wanted() const;
  // Feeds received bytes: the first min(n, wanted()) of them are taken (the
  // rest of the message due, never more); feed the others again. Returns
  // the new state.
  State onBytes(const uint8_t* data, size_t n);
  // Bytes due to the peer (valid until the next call of onBytes).
  const uint8_t* output() const { return out_ + outOff_; }
  size_t outputBytes() const { return outLen_ - outOff_; }
  State consumeOutput(size_t n);

  // Reads and writes what is due on a non-blocking socket without waiting.
  // A connection closed or failing before the end fails the handshake.
  State advance(int fd);
  // What to poll the socket for while running: POLLOUT while output is due,
  // else POLLIN.
  short pollEvents() const;

  // Valid once done: who the peer proved to be.
  Identity peer() const { return peer_; }
  // Why it failed ("" while it has not).
  const std::string& error() const { return error_; }
  // Failed because the connection closed or broke before the end, not
  // because of anything either side sent: an initiator may try again (the
  // listener may have been busy turning strangers away, net::Gate).
  bool closedEarly() const { return closedEarly_; }
  // A responder has received the whole Hello (what net::Gate keeps longest
  // when it must drop someone: strangers that say nothing go first).
  bool heardHello() const;
  // Failed because the peer's MAC did not match: it holds another key.
  bool keyMismatch() const { return keyMismatch_; }

 private:
  enum class Step { kHello, kAnswer, kProof, kWelcome, kEnd };
  State fail(std::string why);
  bool peerProven() const;
  void finishIfDrained();
  void setOutput(const void* data, size_t n);
  void mac(const char* label, const uint8_t* data, size_t n, uint8_t out[kMacBytes]) const;
  State onMessage();

  Role role_;
  Key key_;
  Purpose purpose_;
  Identity expect_;
  Step step_ = Step::kHello;  // the message expected next
  State state_ = State::kRunning;
  HelloMsg hello_{};    // the initiator's (sent or received)
  AnswerMsg answer_{};  // the responder's (sent or received)
  Identity peer_;
  uint8_t in_[sizeof(AnswerMsg)]{};
  size_t inLen_ = 0;
  uint8_t out_[sizeof(AnswerMsg)]{};
  size_t outLen_ = 0;
  size_t outOff_ = 0;
  std::string error_;
  bool closedEarly_ = false;
  bool keyMismatch_ = false;
};

// Runs h on the non-blocking socket fd until it is done, failed, past the
// deadline or aborted. The error names `what` (who the peer is meant to be);
// its code is kInvalidUsage when the two ends hold different keys (a wrong
// unique id or TUTTI_BOOTSTRAP_SECRET), kRemoteError otherwise.
Status runHandshake(Handshake& h, int fd, std::chrono::steady_clock::time_point deadline,
                    const std::atomic<bool>* abortFlag, const std::string& what);

}  // namespace tutti::auth
