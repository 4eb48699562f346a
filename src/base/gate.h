// The door of every tutti listener: connections are accepted, authenticated
// (base/auth.h) and only then handed to their owner.
//
// Contract
// - A Gate watches listening sockets it does not own. step() accepts every
//   connection waiting on them and advances each pending handshake, without
//   blocking; it returns the connections that completed, with the identity
//   they proved.
// - A pending connection gets auth::kHandshakeSeconds to authenticate, then
//   it is closed. At most kMaxPending are held at once: when a new one comes,
//   the oldest that has not yet sent a whole hello goes (else the oldest).
//   Each step() first finishes the handshakes in flight, and answers a new
//   connection's hello as soon as it is accepted, so an honest peer (which
//   sends its hello at once and its proof one round trip later) is rarely
//   the one dropped; when it is, connectAuthenticated() connects again. So
//   any number of idle, partial or garbage connections cost at most
//   kMaxPending descriptors and a few hundred bytes each.
// - When the process is out of descriptors (accept fails with EMFILE or
//   ENFILE) the listener is left alone for kAcceptBackoff, so that a full
//   backlog is not a busy loop, and one pending connection is dropped (as
//   above) to make room.
// - Not thread-safe: one thread owns a Gate.
#pragma once

#include <poll.h>

#include <atomic>
#include <chrono>
#include <deque>
#include <string>
#include <vector>

#include "base/auth.h"
#include "base/socket.h"

namespace tutti::net {

class Gate {
 public:
  static constexpr size_t kMaxPending = 64;
  // New connections taken from one listener's backlog per step(), so that a
  // flood cannot keep the owner from its other work.
  static constexpr size_t kMaxAcceptsPerStep = 256;
  static constexpr std::chrono::milliseconds kAcceptBackoff{10};

  struct Admitted {
    Socket sock;
    auth::Identity peer;
    std::string from;  // the peer's address, for the log
  };

  // `what` names the listener in log lines ("bootstrap root 127.0.0.1:5000").
  Gate(const auth::Key& key, auth::Purpose purpose, auth::Identity self, auth::Identity expect,
       std::string what);

  void watch(int listenFd);
  // Appends the fds to poll (listeners not backing off, pending
  // connections) and lowers *timeoutMs to the next expiry or backoff end.
  void collect(std::vector<pollfd>* fds, int* timeoutMs) const;
  std::vector<Admitted> step();
  size_t pending() const { return pending_.size(); }
  // Connections closed so far for failing or not finishing their handshake.
  uint64_t rejected() const { return rejected_; }

 private:
  struct Pending {
    Socket sock;
    auth::Handshake hs;
    Clock::time_point deadline;
    std::string from;
  };
  struct Listener {
    int fd;
    Clock::time_point idleUntil;
  };
  void acceptSome(Listener& l, std::vector<Admitted>* done);
  // Moves p's handshake on; true when p is finished with (admitted into
  // `done`, or rejected and closed).
  bool advance(Pending& p, Clock::time_point now, std::vector<Admitted>* done);
  void evictOne(const std::string& why);
  void reject(Pending& p, const std::string& why);

  auth::Key key_;
  auth::Purpose purpose_;
  auth::Identity self_, expect_;
  std::string what_;
  std::vector<Listener> listeners_;
  std::deque<Pending> pending_;
  uint64_t rejected_ = 0;
};

// Connects to `addr` and runs the initiator's handshake, retrying (until the
// deadline) while the listener is not there yet or closes the connection
// before the handshake ended (it dropped us under a flood, or timed us out
// on a starved machine). A listener that answers with another key fails at
// once.
Result<Socket> connectAuthenticated(const SockAddr& addr, const auth::Key& key,
                                    auth::Purpose purpose, auth::Identity self,
                                    auth::Identity expect, Clock::time_point deadline,
                                    const std::atomic<bool>* abortFlag, const std::string& what);

}  // namespace tutti::net
