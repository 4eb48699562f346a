#include "base/gate.h"

#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

#include "base/log.h"

namespace tutti::net {

Gate::Gate(const auth::Key& key, auth::Purpose purpose, auth::Identity self, auth::Identity expect,
           std::string what)
    : key_(key), purpose_(purpose), self_(self), expect_(expect), what_(std::move(what)) {}

void Gate::watch(int listenFd) { listeners_.push_back({listenFd, Clock::time_point{}}); }

void Gate::collect(std::vector<pollfd>* fds, int* timeoutMs) const {
  auto now = Clock::now();
  auto lower = [&](Clock::time_point t) {
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(t - now).count() + 1;
    *timeoutMs = static_cast<int>(std::clamp<int64_t>(ms, 0, *timeoutMs));
  };
  for (const auto& l : listeners_) {
    if (l.idleUntil > now)
      lower(l.idleUntil);
    else
      fds->push_back({l.fd, POLLIN, 0});
  }
  for (const auto& p : pending_) {
    fds->push_back({p.sock.fd(), p.hs.pollEvents(), 0});
    lower(p.deadline);
  }
}

void Gate::reject(Pending& p, const std::string& why) {
  ++rejected_;
  TUTTI_INFO(log::kBootstrap | log::kNet, "{}: closed a connection from {}: {}", what_, p.from,
             why);
  p.sock.close();
}

void Gate::evictOne(const std::string& why) {
  // Strangers that have not even said hello go first: an honest peer sends
  // its whole hello at once, so it is rarely among them.
  auto it = std::find_if(pending_.begin(), pending_.end(),
                         [](const Pending& p) { return !p.hs.heardHello(); });
  if (it == pending_.end()) it = pending_.begin();
  reject(*it, why);
  pending_.erase(it);
}

bool Gate::advance(Pending& p, Clock::time_point now, std::vector<Admitted>* done) {
  auto st = p.hs.advance(p.sock.fd());
  if (st == auth::Handshake::State::kDone) {
    done->push_back({std::move(p.sock), p.hs.peer(), p.from});
    return true;
  }
  if (st == auth::Handshake::State::kFailed) {
    reject(p, p.hs.error());
    return true;
  }
  if (now >= p.deadline) {
    reject(p, fmt::format("not authenticated within {} s", auth::kHandshakeSeconds));
    return true;
  }
  return false;
}

void Gate::acceptSome(Listener& l, std::vector<Admitted>* done) {
  for (size_t accepted = 0; accepted < kMaxAcceptsPerStep; ++accepted) {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    int fd = ::accept4(l.fd, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // Out of descriptors: make room, and let the backlog wait a little.
        if (!pending_.empty()) evictOne("out of descriptors");
        l.idleUntil = Clock::now() + kAcceptBackoff;
      }
      return;  // EAGAIN: nothing more waiting
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    SockAddr from;
    memcpy(&from.ss, &ss, sizeof(ss));
    from.len = len;
    Pending p{Socket(fd),
              auth::Handshake(auth::Handshake::Role::kResponder, key_, purpose_, self_, expect_),
              deadlineIn(auth::kHandshakeSeconds), from.str()};
    // An honest peer's hello is usually here already: answer it now, so
    // that it is not taken for a silent stranger below.
    if (advance(p, Clock::now(), done)) continue;
    if (pending_.size() >= kMaxPending)
      evictOne(fmt::format("{} connections waiting to authenticate", kMaxPending));
    pending_.push_back(std::move(p));
  }
}

std::vector<Gate::Admitted> Gate::step() {
  // Handshakes in flight first, so that an honest one completes before a
  // burst of new connections could push it out.
  std::vector<Admitted> done;
  auto now = Clock::now();
  for (auto& p : pending_)
    if (advance(p, now, &done)) p.sock.close();
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(),
                                [](const Pending& p) { return !p.sock.valid(); }),
                 pending_.end());
  for (auto& l : listeners_)
    if (l.idleUntil <= Clock::now()) acceptSome(l, &done);
  return done;
}

Result<Socket> connectAuthenticated(const SockAddr& addr, const auth::Key& key,
                                    auth::Purpose purpose, auth::Identity self,
                                    auth::Identity expect, Clock::time_point deadline,
                                    const std::atomic<bool>* abortFlag, const std::string& what) {
  int delayMs = 1;
  for (;;) {
    TUTTI_ASSIGN_OR_RETURN(Socket s, Socket::connect(addr, deadline, abortFlag, what));
    auth::Handshake hs(auth::Handshake::Role::kInitiator, key, purpose, self, expect);
    Status st = auth::runHandshake(hs, s.fd(), deadline, abortFlag, what + " at " + addr.str());
    if (st) return s;
    if (!hs.closedEarly() || Clock::now() >= deadline) return st;
    TUTTI_INFO(log::kBootstrap | log::kNet, "{}; connecting again", st.message());
    std::this_thread::sleep_for(std::chrono::milliseconds(delayMs));
    delayMs = std::min(delayMs * 2, 100);
  }
}

}  // namespace tutti::net
