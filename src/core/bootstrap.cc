#include "core/bootstrap.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <stdexcept>
#include <system_error>
#include <unordered_map>

#include "base/gate.h"
#include "base/log.h"
#include "base/params.h"
#include "base/thread.h"
#include "topology/topology.h"

namespace tutti::core {
namespace {

// How many payload bytes of unread control messages a rank holds before it
// drops the connection that brings more (a peer sending what nobody reads).
constexpr size_t kMaxMailboxBytes = size_t{64} << 20;

// A peer whose bootstrap listener still refuses connections after this long
// is gone (Bootstrap::sendUntil). Generous: a listener whose backlog is full
// drops connection requests, and the kernel retries them after 1 s, then 3 s.
constexpr auto kPeerGoneAfter = std::chrono::seconds(10);
// How long one connection attempt to a peer on this host lasts before its
// process is looked at again (Bootstrap::sendUntil).
constexpr auto kLocalConnectSlice = std::chrono::milliseconds(100);
// How often a wait for a control message looks at the processes of this
// host it waits on (Bootstrap::recvUntil).
constexpr auto kLivenessEvery = std::chrono::milliseconds(100);

// TUTTI_INIT_TIMEOUT: how long each rank's init waits for the others, and
// how long a root waits for its first registration and then for the rest.
double initTimeout() { return static_cast<double>(params::getInt("TUTTI_INIT_TIMEOUT", 120)); }

// How long a rank retries a refused connection to the root of an id from
// ncclGetUniqueId. That root listened before the id existed, so a refusal
// means it has ended (the id expired or was used): no reason to wait for the
// whole init deadline. The seconds also cover a lost SYN or two on a slow
// network (retransmitted after 1 s, then 2 s more).
constexpr double kRootRefusedSec = 5;

void toWire(const net::SockAddr& a, uint16_t* family, uint16_t* port, uint8_t ip[16]) {
  *family = static_cast<uint16_t>(a.family());
  *port = a.port();
  memset(ip, 0, 16);
  if (a.family() == AF_INET)
    memcpy(ip, &reinterpret_cast<const sockaddr_in*>(&a.ss)->sin_addr, 4);
  else
    memcpy(ip, &reinterpret_cast<const sockaddr_in6*>(&a.ss)->sin6_addr, 16);
}

net::SockAddr fromWire(uint16_t family, uint16_t port, const uint8_t ip[16]) {
  net::SockAddr a;
  if (family == AF_INET6) {
    auto* s6 = reinterpret_cast<sockaddr_in6*>(&a.ss);
    s6->sin6_family = AF_INET6;
    memcpy(&s6->sin6_addr, ip, 16);
    a.len = sizeof(sockaddr_in6);
  } else {
    auto* s4 = reinterpret_cast<sockaddr_in*>(&a.ss);
    s4->sin_family = AF_INET;
    memcpy(&s4->sin_addr, ip, 4);
    a.len = sizeof(sockaddr_in);
  }
  a.setPort(port);
  return a;
}

auth::Key keyOf(const UniqueIdData& id) {
  auth::Key k;
  static_assert(sizeof(id.secret) == k.bytes.size());
  memcpy(k.bytes.data(), id.secret, k.bytes.size());
  return k;
}

// The operator's key for NCCL_COMM_ID (bootstrap.h's contract); *noKey when
// neither setting is there.
Result<auth::Key> operatorKey(bool* noKey) {
  *noKey = false;
  auto text = params::get("TUTTI_BOOTSTRAP_SECRET");
  auto file = params::get("TUTTI_BOOTSTRAP_SECRET_FILE");
  if (text && !text->empty() && file && !file->empty())
    return invalidArgument(
        "both TUTTI_BOOTSTRAP_SECRET and TUTTI_BOOTSTRAP_SECRET_FILE are set: set one");
  if (text && !text->empty()) return auth::deriveKey(*text);
  if (file && !file->empty()) {
    int fd = ::open(file->c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errnoError("TUTTI_BOOTSTRAP_SECRET_FILE=" + *file + ": open", errno);
    struct stat sb {};
    if (fstat(fd, &sb) == 0 && (sb.st_mode & 077))
      TUTTI_WARN(
          "TUTTI_BOOTSTRAP_SECRET_FILE={}: other users may read the key (mode {:o}); "
          "chmod 600 it",
          *file, sb.st_mode & 0777);
    std::string bytes;
    char buf[4096];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof(buf))) > 0 && bytes.size() < (1u << 16))
      bytes.append(buf, static_cast<size_t>(n));
    int err = errno;
    ::close(fd);
    if (n < 0) return errnoError("TUTTI_BOOTSTRAP_SECRET_FILE=" + *file + ": read", err);
    // A trailing newline (echo secret > file) is not part of the secret.
    while (!bytes.empty() && (bytes.back() == '\n' || bytes.back() == '\r')) bytes.pop_back();
    if (bytes.empty()) return invalidArgument("TUTTI_BOOTSTRAP_SECRET_FILE=" + *file + " is empty");
    return auth::deriveKey(bytes);
  }
  *noKey = true;
  return auth::Key{};
}

struct RootRequest {
  int32_t rank;
  int32_t nranks;
  PeerInfo info;
};
static_assert(std::is_trivially_copyable_v<RootRequest>);

struct RootReply {
  int32_t status;  // 0 ok, else error text follows
  uint32_t bytes;
  uint64_t nonce;  // the communicator's (with status 0)
};
static_assert(sizeof(RootReply) == 16 && std::is_trivially_copyable_v<RootReply>);
constexpr uint32_t kMaxRootErrorBytes = 4096;

std::string rankList(const std::vector<int>& ranks) {
  std::string s;
  size_t shown = 0;
  for (int r : ranks) {
    if (shown == 16) {
      s += ", ...";
      break;
    }
    s += (s.empty() ? "" : ", ") + std::to_string(r);
    ++shown;
  }
  return s;
}

// Listens on `addr` and, when `withLoopback` and addr is not loopback, on
// loopback of its family too (bootstrap.h's contract). `*loopbackPort`
// receives the second listener's port (0: none).
Status listenPair(const net::SockAddr& addr, bool withLoopback, net::Socket* main,
                  net::SockAddr* bound, net::Socket* loopback, uint16_t* loopbackPort) {
  TUTTI_ASSIGN_OR_RETURN(*main, net::Socket::listen(addr, bound));
  *loopbackPort = 0;
  if (withLoopback && !addr.isLoopback()) {
    net::SockAddr lo = net::loopbackAddr(addr.family()), loBound;
    lo.setPort(0);
    TUTTI_ASSIGN_OR_RETURN(*loopback, net::Socket::listen(lo, &loBound));
    *loopbackPort = loBound.port();
  }
  return Status::ok();
}

// The root of one unique id (bootstrap.h's contract): collects one
// registration per rank, sends every rank the table, and ends; it ends early
// when a registered rank hangs up or at its deadline, and tells the
// registered ranks why (tellRegistered). It runs on a detached thread that
// may still be running while the process exits, so after construction it
// reads no parameter and no static: its timeout is given here.
class Root {
 public:
  Root(net::Socket listener, net::Socket loopback, std::string addr, const UniqueIdData& id,
       double timeoutSec)
      : listener_(std::move(listener)),
        loopback_(std::move(loopback)),
        addr_(std::move(addr)),
        id_(id),
        timeoutSec_(timeoutSec),
        gate_(keyOf(id), auth::Purpose::kBootstrapRoot, {-1, 0}, auth::kAnyPeer,
              "bootstrap root " + addr_) {
    gate_.watch(listener_.fd());
    if (loopback_.valid()) gate_.watch(loopback_.fd());
  }

  // Ok once every rank has the table, or when nobody registered before the
  // deadline (nobody to tell); else why the communicator cannot be created.
  Status serve();
  // Sends `why` to every registered rank still connected.
  void tellRegistered(const Status& why);

 private:
  // An authenticated connection whose registration is still arriving.
  struct Joining {
    net::Socket sock;
    int32_t rank;  // as proven in the handshake
    RootRequest req{};
    size_t got = 0;
    net::Clock::time_point deadline;
  };
  // Reads what has arrived of j's registration; false when j is finished
  // with (registered, refused or gone).
  bool readRegistration(Joining& j);
  // Keeps a complete registration, or answers why it is refused.
  void admit(Joining& j);
  static void replyError(net::Socket& s, const std::string& msg);

  net::Socket listener_, loopback_;
  std::string addr_;  // where it listens, for the log
  UniqueIdData id_;
  double timeoutSec_;
  net::Gate gate_;
  std::vector<Joining> joining_;
  int nranks_ = -1;  // set by the first registration
  int count_ = 0;
  std::vector<net::Socket> conns_;  // per rank, once registered
  std::vector<PeerInfo> infos_;
};

void Root::replyError(net::Socket& s, const std::string& msg) {
  std::string text = msg.substr(0, kMaxRootErrorBytes);
  RootReply r{1, static_cast<uint32_t>(text.size()), 0};
  auto dl = net::deadlineIn(5);
  if (s.sendAll(&r, sizeof(r), dl, nullptr, "rank"))
    (void)s.sendAll(text.data(), text.size(), dl, nullptr, "rank");
}

void Root::tellRegistered(const Status& why) {
  for (auto& c : conns_)
    if (c.valid()) replyError(c, why.message());
}

bool Root::readRegistration(Joining& j) {
  for (;;) {
    ssize_t n = ::recv(j.sock.fd(), reinterpret_cast<uint8_t*>(&j.req) + j.got,
                       sizeof(j.req) - j.got, MSG_DONTWAIT);
    if (n > 0) {
      j.got += static_cast<size_t>(n);
      if (j.got < sizeof(j.req)) continue;
      admit(j);
      return false;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (net::Clock::now() < j.deadline) return true;
      TUTTI_INFO(log::kBootstrap, "bootstrap root {}: rank {} did not register in time", addr_,
                 j.rank);
    }
    return false;  // closed, broken or late: dropped
  }
}

void Root::admit(Joining& j) {
  const RootRequest& req = j.req;
  if (req.rank != j.rank)
    return replyError(j.sock, fmt::format("rank {} registered as rank {}", j.rank, req.rank));
  if (nranks_ < 0) {
    if (req.nranks <= 0) return replyError(j.sock, fmt::format("invalid nranks {}", req.nranks));
    nranks_ = req.nranks;
    conns_.resize(nranks_);
    infos_.resize(nranks_);
  }
  if (req.nranks != nranks_)
    return replyError(j.sock, fmt::format("rank {} says nranks={} but rank(s) before it said {}",
                                          req.rank, req.nranks, nranks_));
  if (req.rank < 0 || req.rank >= nranks_)
    return replyError(j.sock, fmt::format("rank {} out of range [0, {})", req.rank, nranks_));
  if (conns_[req.rank].valid())
    return replyError(
        j.sock,
        fmt::format("rank {} joined twice (two processes were given the same rank)", req.rank));
  infos_[req.rank] = req.info;
  infos_[req.rank].hostname[sizeof(PeerInfo::hostname) - 1] = '\0';
  conns_[req.rank] = std::move(j.sock);
  ++count_;
}

Status Root::serve() {
  auto deadline = net::deadlineIn(timeoutSec_);
  std::vector<pollfd> fds;
  while (nranks_ < 0 || count_ < nranks_) {
    auto now = net::Clock::now();
    if (now >= deadline) {
      if (nranks_ < 0) {
        TUTTI_INFO(log::kBootstrap,
                   "bootstrap root {}: no rank registered within {} s (TUTTI_INIT_TIMEOUT); it "
                   "ends and the unique id expires",
                   addr_, timeoutSec_);
        return Status::ok();
      }
      std::vector<int> missing;
      for (int r = 0; r < nranks_; ++r)
        if (!conns_[r].valid()) missing.push_back(r);
      std::string msg =
          fmt::format("bootstrap timed out after {} s: {} of {} ranks joined; missing rank(s) {}",
                      timeoutSec_, count_, nranks_, rankList(missing));
      TUTTI_WARN("{}", msg);
      return remoteError(msg);
    }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1;
    int timeoutMs = static_cast<int>(std::min<int64_t>(left, 1000));
    fds.clear();
    gate_.collect(&fds, &timeoutMs);
    for (auto& j : joining_) fds.push_back({j.sock.fd(), POLLIN, 0});
    const size_t connsAt = fds.size();
    std::vector<int> fdRank;  // fds[connsAt + k] is rank fdRank[k]'s connection
    for (int r = 0; r < static_cast<int>(conns_.size()); ++r)
      if (conns_[r].valid()) {
        fds.push_back({conns_[r].fd(), POLLIN, 0});
        fdRank.push_back(r);
      }
    for (const auto& j : joining_)
      timeoutMs = static_cast<int>(std::clamp<int64_t>(
          std::chrono::duration_cast<std::chrono::milliseconds>(j.deadline - now).count() + 1, 0,
          timeoutMs));
    int rc = ::poll(fds.data(), fds.size(), timeoutMs);
    if (rc < 0 && errno != EINTR) return errnoError("bootstrap root: poll", errno);
    // A registered rank sends nothing more: a readable connection has been
    // closed (its init failed or was aborted, or its process ended), and the
    // communicator can no longer be created.
    for (size_t k = connsAt; rc > 0 && k < fds.size(); ++k)
      if (fds[k].revents) {
        int r = fdRank[k - connsAt];
        std::string msg = fmt::format(
            "bootstrap: rank {} left before every rank had joined ({} of {} had; its init failed "
            "or was aborted, or its process ended)",
            r, count_, nranks_);
        TUTTI_WARN("{}", msg);
        conns_[r].close();
        return remoteError(msg);
      }
    for (auto& a : gate_.step())
      joining_.push_back(
          {std::move(a.sock), a.peer.rank, {}, 0, net::deadlineIn(auth::kHandshakeSeconds)});
    const bool first = nranks_ < 0;
    joining_.erase(std::remove_if(joining_.begin(), joining_.end(),
                                  [&](Joining& j) { return !readRegistration(j); }),
                   joining_.end());
    if (first && nranks_ > 0) deadline = net::deadlineIn(timeoutSec_);
  }
  RootReply ok{0, static_cast<uint32_t>(nranks_ * sizeof(PeerInfo)), id_.nonce};
  auto dl = net::deadlineIn(timeoutSec_);
  for (auto& c : conns_) {
    if (!c.sendAll(&ok, sizeof(ok), dl, nullptr, "rank")) continue;
    (void)c.sendAll(infos_.data(), infos_.size() * sizeof(PeerInfo), dl, nullptr, "rank");
  }
  return Status::ok();
}

// Starts the root of `id` listening on `bindAddr` (port 0: one the system
// picks, written into id->port) and, with `withLoopback`, on loopback too
// (id->loopbackPort). A root draws the communicator's nonce when the id has
// none (NCCL_COMM_ID: every rank made its id alone).
Status startRoot(const net::SockAddr& bindAddr, bool withLoopback, UniqueIdData* id) {
  net::SockAddr bound;
  net::Socket listener, loopback;
  TUTTI_RETURN_IF_ERROR(
      listenPair(bindAddr, withLoopback, &listener, &bound, &loopback, &id->loopbackPort));
  id->port = bound.port();
  UniqueIdData served = *id;
  while (served.nonce == 0) TUTTI_RETURN_IF_ERROR(auth::randomBytes(&served.nonce, 8));
  std::string where = bound.str();
  if (id->loopbackPort) where += fmt::format(" and loopback port {}", id->loopbackPort);
  auto root = std::make_shared<Root>(std::move(listener), std::move(loopback), bound.str(), served,
                                     initTimeout());
  auto serve = [root] { return root->serve(); };
  auto tell = [root](Status st) {
    if (!st) root->tellRegistered(st);
  };
  TUTTI_ASSIGN_OR_RETURN(std::thread t,
                         base::startThread("root", "bootstrap root thread (" + bound.str() + ")",
                                           std::move(serve), std::move(tell)));
  t.detach();
  TUTTI_INFO(log::kBootstrap, "bootstrap root listening on {}", where);
  return Status::ok();
}

}  // namespace

Status createUniqueId(uint8_t out[kUniqueIdBytes]) {
  if (auto commId = params::get("NCCL_COMM_ID")) {
    UniqueIdData id{};
    id.magic = kIdMagic;
    id.version = kIdVersion;
    TUTTI_ASSIGN_OR_RETURN(net::SockAddr addr, net::parseAddr(*commId));
    id.flags = kIdRootByRank0;
    toWire(addr, &id.family, &id.port, id.ip);
    bool noKey = false;
    TUTTI_ASSIGN_OR_RETURN(auth::Key key, operatorKey(&noKey));
    if (noKey) id.flags |= kIdNoKey;
    memcpy(id.secret, key.bytes.data(), kSecretBytes);
    id.nonce = 0;  // drawn by the root (rank 0)
    memcpy(out, &id, sizeof(id));
    return Status::ok();
  }
  return createFreshId(out);
}

Status createFreshId(uint8_t out[kUniqueIdBytes]) {
  UniqueIdData id{};
  id.magic = kIdMagic;
  id.version = kIdVersion;
  TUTTI_RETURN_IF_ERROR(auth::randomBytes(id.secret, kSecretBytes));
  while (id.nonce == 0) TUTTI_RETURN_IF_ERROR(auth::randomBytes(&id.nonce, sizeof(id.nonce)));
  std::string ifName;
  TUTTI_ASSIGN_OR_RETURN(net::SockAddr ext, net::selectInterface(&ifName));
  id.rootHostId = topo::localHostId();
  net::SockAddr bindAddr = ext;
  bindAddr.setPort(0);
  toWire(ext, &id.family, &id.port, id.ip);
  TUTTI_RETURN_IF_ERROR(startRoot(bindAddr, !net::interfacePinned(), &id));
  memcpy(out, &id, sizeof(id));
  return Status::ok();
}

namespace {

std::mutex gJoinMu;
std::unordered_map<uint64_t, std::vector<JoinMember>>& joinWatch() {
  static auto* m = new std::unordered_map<uint64_t, std::vector<JoinMember>>();
  return *m;
}

std::vector<JoinMember> takeExpectedMembers(uint64_t nonce) {
  std::lock_guard<std::mutex> lk(gJoinMu);
  auto it = joinWatch().find(nonce);
  if (it == joinWatch().end()) return {};
  std::vector<JoinMember> v = std::move(it->second);
  joinWatch().erase(it);
  return v;
}

// The first watched member whose process is gone, as the error.
Status memberGone(const std::vector<JoinMember>& watch, int rank, int nranks) {
  for (const JoinMember& m : watch)
    if (base::processDead(static_cast<pid_t>(m.pid)))
      return remoteError(fmt::format(
          "rank {} of {}: rank {} of the communicator this one was made from (pid {}) is gone: "
          "its process no longer exists, and it can never join",
          rank, nranks, m.parentRank, m.pid));
  return Status::ok();
}

}  // namespace

void expectMembers(const uint8_t id[kUniqueIdBytes], std::vector<JoinMember> members) {
  if (members.empty()) return;
  UniqueIdData d;
  memcpy(&d, id, sizeof(d));
  std::lock_guard<std::mutex> lk(gJoinMu);
  joinWatch()[d.nonce] = std::move(members);
}

Result<UniqueIdData> parseUniqueId(const uint8_t in[kUniqueIdBytes]) {
  UniqueIdData id;
  memcpy(&id, in, sizeof(id));
  if (id.magic != kIdMagic)
    return invalidArgument(
        "ncclUniqueId was not produced by ncclGetUniqueId of this library (bad magic); was it "
        "copied intact to every rank?");
  if (id.version != kIdVersion)
    return invalidArgument(fmt::format(
        "ncclUniqueId has version {}, this library reads version {}: do all ranks run the same "
        "tutti release?",
        id.version, kIdVersion));
  if (id.family != AF_INET && id.family != AF_INET6)
    return invalidArgument("ncclUniqueId names no root address (was it copied intact?)");
  return id;
}

net::Clock::time_point Bootstrap::deadline() const { return net::deadlineIn(timeoutSec_); }

auth::Key Bootstrap::key() const { return keyOf(id_); }

Result<std::unique_ptr<Bootstrap>> Bootstrap::init(const UniqueIdData& id, int rank, int nranks,
                                                   const std::atomic<bool>* abortFlag) {
  std::unique_ptr<Bootstrap> b(new Bootstrap());
  b->id_ = id;
  b->rank_ = rank;
  b->nranks_ = nranks;
  b->abortFlag_ = abortFlag;
  b->timeoutSec_ = initTimeout();
  TUTTI_RETURN_IF_ERROR(b->start());
  return b;
}

Status Bootstrap::connectRoot(const net::SockAddr& rootAddr, net::Clock::time_point deadline,
                              net::Socket* out) {
  std::string what = "bootstrap root " + rootAddr.str();
  const bool rootByRank0 = id_.flags & kIdRootByRank0;
  auto connected = net::connectAuthenticated(
      rootAddr, key(), auth::Purpose::kBootstrapRoot, {rank_, 0}, {-1, 0},
      rootByRank0 ? deadline : std::min(deadline, net::deadlineIn(kRootRefusedSec)), abortFlag_,
      what);
  if (connected) {
    *out = std::move(connected.value());
    return Status::ok();
  }
  Status st = connected.status();
  if (abortFlag_ && abortFlag_->load()) return st;
  if (st.code() == Code::kInvalidUsage) return st;  // another key: nothing to add
  return Status(
      st.code(),
      fmt::format("{}: {}", st.message(),
                  rootByRank0
                      ? "with NCCL_COMM_ID rank 0 runs the root during its init, until every rank "
                        "has joined or TUTTI_INIT_TIMEOUT passes: is rank 0 running, and did this "
                        "rank start in time?"
                      : "the root of this unique id has ended: it serves one communicator and "
                        "ends once every rank has joined (or one gave up), or TUTTI_INIT_TIMEOUT "
                        "seconds after ncclGetUniqueId if nobody joins; this id has expired or "
                        "was already used (each communicator needs a fresh ncclGetUniqueId, and "
                        "its ranks must start their init in time)"));
}

Status Bootstrap::start() {
  auto deadline = this->deadline();
  if (id_.flags & kIdNoKey) {
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true))
      TUTTI_WARN(
          "NCCL_COMM_ID is set but neither TUTTI_BOOTSTRAP_SECRET nor "
          "TUTTI_BOOTSTRAP_SECRET_FILE: this job's connections are not authenticated, and any "
          "process that can reach its addresses can join it or feed it data (docs/security.md)");
  }
  // Rank 0 hosts the root when the id came from NCCL_COMM_ID.
  net::SockAddr rootAddr = fromWire(id_.family, id_.port, id_.ip);
  if ((id_.flags & kIdRootByRank0) && rank_ == 0) {
    UniqueIdData copy = id_;
    TUTTI_RETURN_IF_ERROR(
        startRoot(rootAddr, false, &copy)
            .withContext("NCCL_COMM_ID=" + rootAddr.str() + ": rank 0 cannot listen there"));
  }
  if (id_.loopbackPort != 0 && id_.rootHostId == topo::localHostId()) {
    rootAddr = net::loopbackAddr(rootAddr.family());
    rootAddr.setPort(id_.loopbackPort);
  }

  // Own listeners for point-to-point control messages, on the interface
  // NCCL_SOCKET_IFNAME names, else on the one that reaches the root's
  // advertised address (loopback when the root is there).
  auto route = net::interfacePinned()
                   ? Result<net::SockAddr>(invalidArgument("pinned"))
                   : net::routeTo(fromWire(id_.family, id_.port, id_.ip), &ifName_);
  if (route) {
    localAddr_ = route.value();
  } else {
    TUTTI_ASSIGN_OR_RETURN(localAddr_, net::selectInterface(&ifName_));
  }
  net::SockAddr bindAddr = localAddr_, bound;
  bindAddr.setPort(0);
  uint16_t loopbackPort = 0;
  TUTTI_RETURN_IF_ERROR(listenPair(bindAddr, !net::interfacePinned(), &listener_, &bound,
                                   &loopbackListener_, &loopbackPort));
  localAddr_.setPort(bound.port());

  RootRequest req{};
  req.rank = rank_;
  req.nranks = nranks_;
  req.info.rank = rank_;
  req.info.pid = getpid();
  req.info.hostId = topo::localHostId();
  toWire(localAddr_, &req.info.family, &req.info.port, req.info.ip);
  snprintf(req.info.hostname, sizeof(req.info.hostname), "%s", topo::localHostName().c_str());
  req.info.nranks = nranks_;
  req.info.loopbackPort = loopbackPort;

  net::Socket root;
  TUTTI_RETURN_IF_ERROR(connectRoot(rootAddr, deadline, &root));
  std::string what = "bootstrap root " + rootAddr.str();
  TUTTI_RETURN_IF_ERROR(root.sendAll(&req, sizeof(req), deadline, abortFlag_, what));
  RootReply reply{};
  // The root gives up at its own deadline and tells us who is missing; wait a
  // little longer than it does.
  auto replyDeadline = deadline + std::chrono::seconds(10);
  // A split's or shrink's members on this host are looked at while waiting:
  // one that died fails the init at once (and, closing this connection,
  // everyone else's through the root).
  const std::vector<JoinMember> watch = takeExpectedMembers(id_.nonce);
  while (!watch.empty()) {
    pollfd p{root.fd(), POLLIN, 0};
    if (::poll(&p, 1, 100) != 0) break;  // the reply, or an error, is there
    if (net::Clock::now() >= replyDeadline || (abortFlag_ && abortFlag_->load())) break;
    TUTTI_RETURN_IF_ERROR(memberGone(watch, rank_, nranks_));
  }
  Status st = root.recvAll(&reply, sizeof(reply), replyDeadline, abortFlag_,
                           "the other ranks to join (via " + what + ")");
  if (!st) {
    TUTTI_RETURN_IF_ERROR(memberGone(watch, rank_, nranks_));  // the cause, when it is that
    return st.withContext(fmt::format("rank {} of {}", rank_, nranks_));
  }
  if (reply.status != 0) {
    std::string msg(std::min<uint32_t>(reply.bytes, kMaxRootErrorBytes), '\0');
    (void)root.recvAll(msg.data(), msg.size(), replyDeadline, abortFlag_, what);
    TUTTI_RETURN_IF_ERROR(memberGone(watch, rank_, nranks_));
    return remoteError(msg);
  }
  if (reply.bytes != nranks_ * sizeof(PeerInfo)) return internalError("bootstrap: bad table size");
  peers_.resize(nranks_);
  TUTTI_RETURN_IF_ERROR(root.recvAll(peers_.data(), reply.bytes, replyDeadline, abortFlag_, what));
  id_.nonce = reply.nonce;
  // With every rank on this host, peers reach this rank on loopback only
  // (peerAddr): the listener on the outward address is not needed.
  const bool allHere = std::all_of(peers_.begin(), peers_.end(),
                                   [&](const PeerInfo& p) { return p.hostId == req.info.hostId; });
  if (allHere && loopbackListener_.valid()) listener_.close();
  // The service thread's early end (an exception, say) is kept for recv.
  // Without the eventfd (none to be had) its poll still ends every 50 ms.
  wakeFd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  TUTTI_ASSIGN_OR_RETURN(service_,
                         base::startThread(
                             "service", fmt::format("bootstrap service thread of rank {}", rank_),
                             [this] { return serviceLoop(); },
                             [this](Status st) {
                               if (st) return;
                               std::lock_guard<std::mutex> lk(mu_);
                               serviceError_ = std::move(st);
                               cv_.notify_all();
                             }));
  return Status::ok();
}

Bootstrap::~Bootstrap() {
  stop_.store(true);
  if (wakeFd_ >= 0) {
    const uint64_t one = 1;
    (void)!::write(wakeFd_, &one, sizeof(one));
  }
  // Without the wake-up, destroying or aborting a communicator waited for the
  // service thread's poll to time out: up to 50 ms, 25 on average.
  if (service_.joinable()) service_.join();
  if (wakeFd_ >= 0) ::close(wakeFd_);
}

net::SockAddr Bootstrap::peerAddr(int peer) const {
  const PeerInfo& p = peers_[peer];
  net::SockAddr a = fromWire(p.family, p.port, p.ip);
  if (p.loopbackPort != 0 && p.hostId == peers_[rank_].hostId) {
    a = net::loopbackAddr(a.family());
    a.setPort(p.loopbackPort);
  }
  return a;
}

void Bootstrap::deliver(int peer, uint64_t tag, std::vector<uint8_t> payload) {
  mailboxBytes_ += payload.size();
  mailbox_[{peer, tag}].push_back(std::move(payload));
}

Status Bootstrap::serviceLoop() {
  struct In {
    net::Socket sock;
    int rank;
    FrameReader reader;
  };
  net::Gate gate(key(), auth::Purpose::kBootstrapPeer, {rank_, 0}, auth::kAnyPeer,
                 fmt::format("bootstrap service of rank {}", rank_));
  if (listener_.valid()) gate.watch(listener_.fd());
  if (loopbackListener_.valid()) gate.watch(loopbackListener_.fd());
  std::vector<In> ins;
  std::vector<pollfd> fds;
  std::vector<FrameReader::Frame> frames;
  std::vector<uint8_t> buf(64 << 10);
  while (!stop_.load()) {
    fds.clear();
    int timeoutMs = 50;
    gate.collect(&fds, &timeoutMs);
    if (wakeFd_ >= 0) fds.push_back({wakeFd_, POLLIN, 0});
    const size_t insAt = fds.size();
    for (auto& in : ins) fds.push_back({in.sock.fd(), POLLIN, 0});
    int rc = ::poll(fds.data(), fds.size(), timeoutMs);
    if (rc < 0 && errno != EINTR) return errnoError("bootstrap service: poll", errno);
    for (auto& a : gate.step()) {
      if (a.peer.rank < 0 || a.peer.rank >= nranks_ || a.peer.rank == rank_) {
        TUTTI_WARN(
            "bootstrap service of rank {}: closed a connection from {} that proved the key "
            "but claims to be rank {} of {}",
            rank_, a.from, a.peer.rank, nranks_);
        continue;
      }
      ins.push_back({std::move(a.sock), a.peer.rank, FrameReader()});
    }
    for (size_t i = 0; rc > 0 && i < ins.size() && insAt + i < fds.size(); ++i) {
      if (!(fds[insAt + i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      In& in = ins[i];
      ssize_t n = ::recv(in.sock.fd(), buf.data(), buf.size(), MSG_DONTWAIT);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
      if (n <= 0) {  // the peer closed its side (it ended or reconnects)
        in.sock.close();
        continue;
      }
      frames.clear();
      bool ok = in.reader.feed(buf.data(), static_cast<size_t>(n), &frames);
      {
        std::lock_guard<std::mutex> lk(mu_);
        for (auto& f : frames) {
          if (mailboxBytes_ + f.payload.size() > kMaxMailboxBytes) {
            ok = false;
            in.reader = FrameReader();
            TUTTI_WARN(
                "bootstrap service of rank {}: rank {} sent more than {} MiB of control "
                "messages nobody received; its connection is closed",
                rank_, in.rank, kMaxMailboxBytes >> 20);
            break;
          }
          deliver(in.rank, f.tag, std::move(f.payload));
        }
      }
      if (!frames.empty()) cv_.notify_all();
      if (!ok) {
        if (!in.reader.error().empty())
          TUTTI_WARN(
              "bootstrap service of rank {}: rank {} broke the protocol ({}); its "
              "connection is closed",
              rank_, in.rank, in.reader.error());
        in.sock.close();
      }
    }
    ins.erase(std::remove_if(ins.begin(), ins.end(), [](const In& in) { return !in.sock.valid(); }),
              ins.end());
  }
  return Status::ok();
}

Status Bootstrap::send(int peer, uint64_t tag, const void* data, size_t bytes) {
  return sendUntil(peer, tag, data, bytes, deadline());
}

Status Bootstrap::sendUntil(int peer, uint64_t tag, const void* data, size_t bytes,
                            net::Clock::time_point dl) {
  if (peer < 0 || peer >= nranks_) return internalError("bootstrap send to invalid peer");
  if (peer == rank_) {
    std::lock_guard<std::mutex> lk(mu_);
    auto* p = static_cast<const uint8_t*>(data);
    deliver(rank_, tag, std::vector<uint8_t>(p, p + bytes));
    cv_.notify_all();
    return Status::ok();
  }
  if (bytes > kMaxControlMessageBytes)
    return internalError(fmt::format("bootstrap: a control message of {} bytes (at most {})", bytes,
                                     kMaxControlMessageBytes));
  {
    // Every exchange this message belongs to needs this rank's service to
    // receive the answer: without it, say so now rather than at the deadline.
    std::lock_guard<std::mutex> lk(mu_);
    if (!serviceError_.isOk())
      return serviceError_.withContext(
          fmt::format("rank {} cannot receive control messages (from rank {})", rank_, peer));
    // A handshake with a peer that gave up: it accepts no connection (and
    // may have closed its communicator, so connecting would be refused
    // until the deadline).
    if (isConnectTag(tag)) TUTTI_RETURN_IF_ERROR(gaveUpLocked(peer));
  }
  std::lock_guard<std::mutex> lk(sendMu_);
  net::Socket* s = nullptr;
  auto it = out_.find(peer);
  if (it != out_.end()) {
    s = &it->second;
  } else {
    std::string what = fmt::format("rank {} ({})", peer, peers_[peer].hostname);
    // Every peer listened before it told its address, so a connection still
    // refused after kPeerGoneAfter means the peer is gone (it left or died):
    // a handshake with it fails then, not at the deadline.
    const auto connectBy = std::min(dl, net::Clock::now() + kPeerGoneAfter);
    // A peer on this host is tried in slices, and its process looked at
    // between them: one that died is gone at once, not after kPeerGoneAfter
    // (a rank connecting lazily to a peer just killed).
    const bool local = peers_[peer].hostId == peers_[rank_].hostId && peers_[peer].pid > 0;
    for (;;) {
      const auto until =
          local ? std::min(connectBy, net::Clock::now() + kLocalConnectSlice) : connectBy;
      auto sock = net::connectAuthenticated(peerAddr(peer), key(), auth::Purpose::kBootstrapPeer,
                                            {rank_, 0}, {peer, 0}, until, abortFlag_, what);
      if (sock) {
        s = &out_.emplace(peer, std::move(*sock)).first->second;
        break;
      }
      // Failed before its slice ended (a wrong key, an abort), or out of time.
      if (net::Clock::now() < until || until >= connectBy) return sock.status();
      if (base::processDead(static_cast<pid_t>(peers_[peer].pid)))
        return remoteError(fmt::format("{} is gone: its process (pid {}) no longer exists", what,
                                       peers_[peer].pid));
    }
  }
  FrameHeader hdr{kFrameMagic, 0, tag, bytes};
  std::string what = "rank " + std::to_string(peer);
  Status st = s->sendAll(&hdr, sizeof(hdr), dl, abortFlag_, what);
  if (st) st = s->sendAll(data, bytes, dl, abortFlag_, what);
  if (!st) {
    out_.erase(peer);
    // Which processes of this host are gone: the peer, and maybe the one
    // whose death made it end.
    if (Status gone = localPeersAlive(-1); !gone) return st.withContext(gone.message());
  }
  return st;
}

bool Bootstrap::connectedTo(int peer) {
  std::lock_guard<std::mutex> lk(sendMu_);
  return out_.count(peer) != 0;
}

Result<std::vector<uint8_t>> Bootstrap::recv(int peer, uint64_t tag) {
  return recvUntil(peer, tag, deadline(), abortFlag_);
}

std::string gaveUpMessage(const std::string& who, std::string_view why) {
  static constexpr std::string_view kGaveUp = " gave up after an error of its own";
  static constexpr std::string_view kPassed = " (passed on by ";
  int hops = 0;
  for (;;) {
    // "rank N (...) gave up after an error of its own[ (passed on by K more ranks)]: "
    const size_t at = why.find(kGaveUp);
    if (why.rfind("rank ", 0) != 0 || at == std::string_view::npos ||
        why.substr(0, at).find(": ") != std::string_view::npos)
      break;
    size_t rest = at + kGaveUp.size();
    int more = 0;
    if (why.substr(rest).rfind(kPassed, 0) == 0) {
      const size_t close = why.find(')', rest);
      if (close == std::string_view::npos) break;
      more = std::atoi(std::string(why.substr(rest + kPassed.size(), close)).c_str());
      rest = close + 1;
    }
    if (why.substr(rest, 2) != ": ") break;
    why.remove_prefix(rest + 2);
    hops += 1 + more;
  }
  if (hops == 0) return fmt::format("{}{}: {}", who, kGaveUp, why);
  return fmt::format("{}{}{}{} more rank{}): {}", who, kGaveUp, kPassed, hops,
                     hops == 1 ? "" : "s", why);
}

Status Bootstrap::gaveUpLocked(int peer) const {
  auto it = mailbox_.find({peer, kFailureNoticeTag});
  if (it == mailbox_.end() || it->second.empty()) return Status::ok();
  const std::vector<uint8_t>& why = it->second.front();  // left for Comm::noticeFrom
  return remoteError(gaveUpMessage(fmt::format("rank {} ({})", peer, peers_[peer].hostname),
                                   std::string_view(reinterpret_cast<const char*>(why.data()),
                                                    why.size())));
}

bool Bootstrap::pending(int peer, uint64_t tag) {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = mailbox_.find({peer, tag});
  return it != mailbox_.end() && !it->second.empty();
}

Status Bootstrap::gaveUp(int peer) {
  if (peer < 0 || peer >= nranks_) return Status::ok();
  {
    std::lock_guard<std::mutex> lk(mu_);
    TUTTI_RETURN_IF_ERROR(gaveUpLocked(peer));
  }
  // A peer of this host that died sends no notice: a handshake with it
  // (its connect or accept, retried until the deadline) ends now.
  return localPeersAlive(peer);
}

Result<std::vector<uint8_t>> Bootstrap::recvUntil(int peer, uint64_t tag, net::Clock::time_point dl,
                                                  const std::atomic<bool>* abortFlag) {
  std::unique_lock<std::mutex> lk(mu_);
  auto nextLivenessCheck = net::Clock::now() + kLivenessEvery;
  for (;;) {
    auto it = mailbox_.find({peer, tag});
    if (it != mailbox_.end() && !it->second.empty()) {
      std::vector<uint8_t> v = std::move(it->second.front());
      it->second.pop_front();
      mailboxBytes_ -= v.size();
      if (it->second.empty()) mailbox_.erase(it);
      return v;
    }
    if (abortFlag && abortFlag->load()) return invalidUsage("communicator aborted");
    if (isConnectTag(tag)) TUTTI_RETURN_IF_ERROR(gaveUpLocked(peer));
    if (!serviceError_.isOk())
      return serviceError_.withContext(
          fmt::format("rank {} cannot receive control messages (from rank {})", rank_, peer));
    auto now = net::Clock::now();
    if (now >= dl)
      return remoteError(fmt::format("timed out waiting for a control message from rank {} ({})",
                                     peer, peers_[peer].hostname));
    // Now and then the processes on this host: a message from one that is
    // gone never comes, and neither does any step of an allGather or
    // barrier once any rank is gone (the rest of its ring waits behind it).
    if (now >= nextLivenessCheck) {
      nextLivenessCheck = now + kLivenessEvery;
      lk.unlock();
      Status alive = localPeersAlive((tag >> 63) == 1 ? -1 : peer);
      lk.lock();
      TUTTI_RETURN_IF_ERROR(alive);
      continue;  // the mailbox again: what came meanwhile is read first
    }
    cv_.wait_for(lk, std::min<net::Clock::duration>(dl - now, std::chrono::milliseconds(10)));
  }
}

Status Bootstrap::localPeersAlive(int peer) const {
  // Every one that is gone, not only the first: a rank that failed because
  // another died may have ended too, and the one that died first is among
  // them.
  const uint64_t here = peers_[rank_].hostId;
  std::vector<std::string> gone;
  for (int r = peer < 0 ? 0 : peer; r < (peer < 0 ? nranks_ : peer + 1); ++r) {
    const PeerInfo& p = peers_[r];
    if (r == rank_ || p.hostId != here || p.pid <= 0) continue;
    if (base::processDead(static_cast<pid_t>(p.pid)))
      gone.push_back(fmt::format("rank {} (host {}, pid {})", r, p.hostname, p.pid));
  }
  if (gone.empty()) return Status::ok();
  std::string who = gone[0];
  for (size_t i = 1; i < gone.size(); ++i) who += (i + 1 == gone.size() ? " and " : ", ") + gone[i];
  return remoteError(fmt::format("{} {} gone: {} no longer exist{} (seen by rank {} waiting for a "
                                 "control message)",
                                 who, gone.size() == 1 ? "is" : "are",
                                 gone.size() == 1 ? "its process" : "their processes",
                                 gone.size() == 1 ? "s" : "", rank_));
}

Status Bootstrap::allGather(void* data, size_t bytes) {
  auto* base = static_cast<uint8_t*>(data);
  uint64_t seq = collSeq_++;
  int next = (rank_ + 1) % nranks_, prev = (rank_ - 1 + nranks_) % nranks_;
  for (int step = 0; step < nranks_ - 1; ++step) {
    int sendBlock = (rank_ - step + nranks_) % nranks_;
    int recvBlock = (rank_ - step - 1 + nranks_) % nranks_;
    uint64_t tag = kCollectiveTagBase | (seq << 20) | static_cast<uint64_t>(step);
    TUTTI_RETURN_IF_ERROR(send(next, tag, base + sendBlock * bytes, bytes));
    TUTTI_ASSIGN_OR_RETURN(auto got, recv(prev, tag));
    if (got.size() != bytes) return internalError("bootstrap allGather: size mismatch");
    memcpy(base + recvBlock * bytes, got.data(), bytes);
  }
  return Status::ok();
}

Status Bootstrap::barrier() {
  std::vector<uint8_t> dummy(nranks_);
  return allGather(dummy.data(), 1);
}

}  // namespace tutti::core
