#include "core/bootstrap.h"

#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <sys/random.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <new>
#include <stdexcept>
#include <system_error>

#include "base/log.h"
#include "base/params.h"
#include "base/thread.h"
#include "topology/topology.h"

namespace tutti::core {
namespace {

constexpr uint32_t kHelloMagic = 0x54424f4f;  // root and peer hello
constexpr uint32_t kFrameMagic = 0x54465241;
constexpr uint32_t kPeerFlagWildcard = 1;
constexpr uint16_t kIdRootWildcard = 2;

uint64_t fnv1a(const void* data, size_t n, uint64_t h = 1469598103934665603ull) {
  auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

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

bool secretEqual(const uint8_t* a, const uint8_t* b) {
  return net::constantTimeEqual(a, b, kSecretBytes);
}

struct Hello {
  uint32_t magic;
  int32_t rank;
  uint8_t secret[kSecretBytes];
};

struct RootRequest {
  int32_t rank;
  int32_t nranks;
  PeerInfo info;
};

struct RootReply {
  int32_t status;  // 0 ok, else error text follows
  uint32_t bytes;
};

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

// The root of one unique id (bootstrap.h's contract): collects one
// registration per rank, sends every rank the table, and ends; it ends early
// when a registered rank hangs up or at its deadline, and tells the
// registered ranks why (tellRegistered). It runs on a detached thread that
// may still be running while the process exits, so after construction it
// reads no parameter and no static: its timeout is given here.
class Root {
 public:
  Root(net::Socket listener, std::string addr, const UniqueIdData& id, double timeoutSec)
      : listener_(std::move(listener)), addr_(std::move(addr)), id_(id), timeoutSec_(timeoutSec) {}

  // Ok once every rank has the table, or when nobody registered before the
  // deadline (nobody to tell); else why the communicator cannot be created.
  Status serve();
  // Sends `why` to every registered rank still connected.
  void tellRegistered(const Status& why);

 private:
  // Reads one registration from `s` (hello and request, until `deadline`)
  // and keeps it, or answers why it is refused.
  void admit(net::Socket s, net::Clock::time_point deadline);
  static void replyError(net::Socket& s, const std::string& msg);

  net::Socket listener_;
  std::string addr_;  // where it listens, for the log
  UniqueIdData id_;
  double timeoutSec_;
  int nranks_ = -1;  // set by the first registration
  int count_ = 0;
  std::vector<net::Socket> conns_;  // per rank, once registered
  std::vector<PeerInfo> infos_;
};

void Root::replyError(net::Socket& s, const std::string& msg) {
  RootReply r{1, static_cast<uint32_t>(msg.size())};
  auto dl = net::deadlineIn(5);
  if (s.sendAll(&r, sizeof(r), dl, nullptr, "rank"))
    (void)s.sendAll(msg.data(), msg.size(), dl, nullptr, "rank");
}

void Root::tellRegistered(const Status& why) {
  for (auto& c : conns_)
    if (c.valid()) replyError(c, why.message());
}

void Root::admit(net::Socket s, net::Clock::time_point deadline) {
  Hello h{};
  if (!s.recvAll(&h, sizeof(h), deadline, nullptr, "hello") || h.magic != kHelloMagic ||
      !secretEqual(h.secret, id_.secret)) {
    TUTTI_INFO(log::kBootstrap, "bootstrap root: dropped a connection without a valid hello");
    return;
  }
  RootRequest req{};
  if (!s.recvAll(&req, sizeof(req), deadline, nullptr, "registration")) return;
  if (nranks_ < 0) {
    if (req.nranks <= 0) return replyError(s, "invalid nranks " + std::to_string(req.nranks));
    nranks_ = req.nranks;
    conns_.resize(nranks_);
    infos_.resize(nranks_);
  }
  if (req.nranks != nranks_)
    return replyError(s, fmt::format("rank {} says nranks={} but rank(s) before it said {}",
                                     req.rank, req.nranks, nranks_));
  if (req.rank < 0 || req.rank >= nranks_)
    return replyError(s, fmt::format("rank {} out of range [0, {})", req.rank, nranks_));
  if (conns_[req.rank].valid())
    return replyError(
        s, fmt::format("rank {} joined twice (two processes were given the same rank)", req.rank));
  infos_[req.rank] = req.info;
  conns_[req.rank] = std::move(s);
  ++count_;
}

Status Root::serve() {
  auto deadline = net::deadlineIn(timeoutSec_);
  std::vector<pollfd> fds;
  std::vector<int> fdRank;  // fds[k] is rank fdRank[k]'s connection (k >= 1)
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
    fds.assign(1, pollfd{listener_.fd(), POLLIN, 0});
    fdRank.assign(1, -1);
    for (int r = 0; r < static_cast<int>(conns_.size()); ++r)
      if (conns_[r].valid()) {
        fds.push_back({conns_[r].fd(), POLLIN, 0});
        fdRank.push_back(r);
      }
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count() + 1;
    int rc = ::poll(fds.data(), fds.size(), static_cast<int>(std::min<int64_t>(left, 1000)));
    if (rc < 0 && errno != EINTR) return errnoError("bootstrap root: poll", errno);
    if (rc <= 0) continue;
    // A registered rank sends nothing more: a readable connection has been
    // closed (its init failed or was aborted, or its process ended), and the
    // communicator can no longer be created.
    for (size_t k = 1; k < fds.size(); ++k)
      if (fds[k].revents) {
        std::string msg = fmt::format(
            "bootstrap: rank {} left before every rank had joined ({} of {} had; its init failed "
            "or was aborted, or its process ended)",
            fdRank[k], count_, nranks_);
        TUTTI_WARN("{}", msg);
        conns_[fdRank[k]].close();
        return remoteError(msg);
      }
    if (!(fds[0].revents & POLLIN)) continue;
    auto acc = listener_.accept(net::deadlineIn(0.01), nullptr, "ranks to join");
    if (!acc) continue;
    const bool first = nranks_ < 0;
    admit(std::move(acc.value()), std::min(net::deadlineIn(5), deadline));
    if (first && nranks_ > 0) deadline = net::deadlineIn(timeoutSec_);
  }
  RootReply ok{0, static_cast<uint32_t>(nranks_ * sizeof(PeerInfo))};
  auto dl = net::deadlineIn(timeoutSec_);
  for (auto& c : conns_) {
    if (!c.sendAll(&ok, sizeof(ok), dl, nullptr, "rank")) continue;
    (void)c.sendAll(infos_.data(), infos_.size() * sizeof(PeerInfo), dl, nullptr, "rank");
  }
  return Status::ok();
}

Status startRoot(const net::SockAddr& bindAddr, UniqueIdData* id) {
  net::SockAddr bound;
  TUTTI_ASSIGN_OR_RETURN(net::Socket listener, net::Socket::listen(bindAddr, &bound));
  id->port = bound.port();
  auto root = std::make_shared<Root>(std::move(listener), bound.str(), *id, initTimeout());
  auto serve = [root] { return root->serve(); };
  auto tell = [root](Status st) {
    if (!st) root->tellRegistered(st);
  };
  TUTTI_ASSIGN_OR_RETURN(std::thread t,
                         base::startThread("root", "bootstrap root thread (" + bound.str() + ")",
                                           std::move(serve), std::move(tell)));
  t.detach();
  TUTTI_INFO(log::kBootstrap, "bootstrap root listening on {}", bound.str());
  return Status::ok();
}

}  // namespace

Status createUniqueId(uint8_t out[kUniqueIdBytes]) {
  UniqueIdData id{};
  id.magic = kIdMagic;
  id.version = 1;
  if (auto commId = params::get("NCCL_COMM_ID")) {
    TUTTI_ASSIGN_OR_RETURN(net::SockAddr addr, net::parseAddr(*commId));
    id.flags = kIdRootByRank0;
    toWire(addr, &id.family, &id.port, id.ip);
    std::string seed = "tutti:" + *commId + ":" + params::getStr("TUTTI_BOOTSTRAP_SECRET", "");
    for (size_t i = 0; i < kSecretBytes; i += 8) {
      uint64_t h = fnv1a(seed.data(), seed.size(), 1469598103934665603ull + i);
      memcpy(id.secret + i, &h, 8);
    }
    id.nonce = fnv1a(seed.data(), seed.size());
    memcpy(out, &id, sizeof(id));
    return Status::ok();
  }
  return createFreshId(out);
}

Status createFreshId(uint8_t out[kUniqueIdBytes]) {
  UniqueIdData id{};
  id.magic = kIdMagic;
  id.version = 1;
  if (getrandom(id.secret, kSecretBytes, 0) != static_cast<ssize_t>(kSecretBytes) ||
      getrandom(&id.nonce, sizeof(id.nonce), 0) != sizeof(id.nonce))
    return errnoError("getrandom", errno);
  std::string ifName;
  TUTTI_ASSIGN_OR_RETURN(net::SockAddr ext, net::selectInterface(&ifName));
  id.rootHostId = topo::localHostId();
  net::SockAddr bindAddr = ext;
  if (!net::interfacePinned()) {
    bindAddr = net::wildcardAddr(ext.family());
    id.flags |= kIdRootWildcard;
  }
  bindAddr.setPort(0);
  toWire(ext, &id.family, &id.port, id.ip);
  TUTTI_RETURN_IF_ERROR(startRoot(bindAddr, &id));
  memcpy(out, &id, sizeof(id));
  return Status::ok();
}

Result<UniqueIdData> parseUniqueId(const uint8_t in[kUniqueIdBytes]) {
  UniqueIdData id;
  memcpy(&id, in, sizeof(id));
  if (id.magic != kIdMagic || id.version != 1)
    return invalidArgument(
        "ncclUniqueId was not produced by ncclGetUniqueId of this library (bad magic); was it "
        "copied intact to every rank?");
  return id;
}

net::Clock::time_point Bootstrap::deadline() const { return net::deadlineIn(timeoutSec_); }

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

Status Bootstrap::start() {
  auto deadline = this->deadline();
  // Rank 0 hosts the root when the id came from NCCL_COMM_ID.
  net::SockAddr rootAddr = fromWire(id_.family, id_.port, id_.ip);
  if ((id_.flags & kIdRootByRank0) && rank_ == 0) {
    UniqueIdData copy = id_;
    TUTTI_RETURN_IF_ERROR(
        startRoot(rootAddr, &copy)
            .withContext("NCCL_COMM_ID=" + rootAddr.str() + ": rank 0 cannot listen there"));
  }
  if ((id_.flags & kIdRootWildcard) && id_.rootHostId == topo::localHostId()) {
    rootAddr = net::loopbackAddr(rootAddr.family());
    rootAddr.setPort(id_.port);
  }

  // Own listener for point-to-point control messages.
  TUTTI_ASSIGN_OR_RETURN(localAddr_, net::selectInterface(&ifName_));
  bool pinned = net::interfacePinned();
  net::SockAddr bindAddr = pinned ? localAddr_ : net::wildcardAddr(localAddr_.family());
  bindAddr.setPort(0);
  net::SockAddr bound;
  TUTTI_ASSIGN_OR_RETURN(listener_, net::Socket::listen(bindAddr, &bound));
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
  req.info.reserved = pinned ? 0 : kPeerFlagWildcard;

  std::string what = "bootstrap root " + rootAddr.str();
  const bool rootByRank0 = id_.flags & kIdRootByRank0;
  auto connected = net::Socket::connect(
      rootAddr, rootByRank0 ? deadline : std::min(deadline, net::deadlineIn(kRootRefusedSec)),
      abortFlag_, what);
  if (!connected) {
    Status st = connected.status();
    if (abortFlag_ && abortFlag_->load()) return st;
    return Status(
        st.code(),
        fmt::format(
            "{}: {}", st.message(),
            rootByRank0
                ? "with NCCL_COMM_ID rank 0 runs the root during its init, until every rank has "
                  "joined or TUTTI_INIT_TIMEOUT passes: is rank 0 running, and did this rank "
                  "start in time?"
                : "the root of this unique id has ended: it serves one communicator and ends "
                  "once every rank has joined (or one gave up), or TUTTI_INIT_TIMEOUT seconds "
                  "after ncclGetUniqueId if nobody joins; this id has expired or was already used "
                  "(each communicator needs a fresh ncclGetUniqueId, and its ranks must start "
                  "their init in time)"));
  }
  net::Socket root = std::move(connected.value());
  Hello h{kHelloMagic, rank_, {}};
  memcpy(h.secret, id_.secret, kSecretBytes);
  TUTTI_RETURN_IF_ERROR(root.sendAll(&h, sizeof(h), deadline, abortFlag_, what));
  TUTTI_RETURN_IF_ERROR(root.sendAll(&req, sizeof(req), deadline, abortFlag_, what));
  RootReply reply{};
  // The root gives up at its own deadline and tells us who is missing; wait a
  // little longer than it does.
  auto replyDeadline = deadline + std::chrono::seconds(10);
  Status st = root.recvAll(&reply, sizeof(reply), replyDeadline, abortFlag_,
                           "the other ranks to join (via " + what + ")");
  if (!st) return st.withContext(fmt::format("rank {} of {}", rank_, nranks_));
  if (reply.status != 0) {
    std::string msg(std::min<uint32_t>(reply.bytes, 4096), '\0');
    (void)root.recvAll(msg.data(), msg.size(), replyDeadline, abortFlag_, what);
    return remoteError(msg);
  }
  if (reply.bytes != nranks_ * sizeof(PeerInfo)) return internalError("bootstrap: bad table size");
  peers_.resize(nranks_);
  TUTTI_RETURN_IF_ERROR(root.recvAll(peers_.data(), reply.bytes, replyDeadline, abortFlag_, what));
  // The service thread's early end (an exception, say) is kept for recv.
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
  if (service_.joinable()) service_.join();
}

net::SockAddr Bootstrap::peerAddr(int peer) const {
  const PeerInfo& p = peers_[peer];
  net::SockAddr a = fromWire(p.family, p.port, p.ip);
  if ((p.reserved & kPeerFlagWildcard) && p.hostId == peers_[rank_].hostId) {
    a = net::loopbackAddr(a.family());
    a.setPort(p.port);
  }
  return a;
}

Status Bootstrap::serviceLoop() {
  struct In {
    net::Socket sock;
    int rank = -1;  // -1 until the hello was read
  };
  std::vector<In> ins;
  while (!stop_.load()) {
    std::vector<pollfd> fds;
    fds.push_back({listener_.fd(), POLLIN, 0});
    for (auto& in : ins) fds.push_back({in.sock.fd(), POLLIN, 0});
    int rc = ::poll(fds.data(), fds.size(), 50);
    if (rc <= 0) continue;
    if (fds[0].revents & POLLIN) {
      auto acc = listener_.accept(net::deadlineIn(0.01), nullptr, "peer");
      if (acc) ins.push_back({std::move(acc.value()), -1});
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      In& in = ins[i - 1];
      auto dl = net::deadlineIn(10);
      if (in.rank < 0) {
        Hello h{};
        if (!in.sock.recvAll(&h, sizeof(h), dl, &stop_, "hello") || h.magic != kHelloMagic ||
            !secretEqual(h.secret, id_.secret) || h.rank < 0 || h.rank >= nranks_) {
          in.sock.close();
          continue;
        }
        in.rank = h.rank;
        continue;
      }
      struct {
        uint32_t magic;
        uint32_t pad;
        uint64_t tag;
        uint64_t bytes;
      } hdr{};
      std::string what = "rank " + std::to_string(in.rank);
      if (!in.sock.recvAll(&hdr, sizeof(hdr), dl, &stop_, what) || hdr.magic != kFrameMagic ||
          hdr.bytes > (1ull << 30)) {
        in.sock.close();
        continue;
      }
      std::vector<uint8_t> payload(hdr.bytes);
      if (!in.sock.recvAll(payload.data(), payload.size(), dl, &stop_, what)) {
        in.sock.close();
        continue;
      }
      {
        std::lock_guard<std::mutex> lk(mu_);
        mailbox_[{in.rank, hdr.tag}].push_back(std::move(payload));
      }
      cv_.notify_all();
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
    mailbox_[{rank_, tag}].emplace_back(p, p + bytes);
    cv_.notify_all();
    return Status::ok();
  }
  std::lock_guard<std::mutex> lk(sendMu_);
  net::Socket* s = nullptr;
  auto it = out_.find(peer);
  if (it != out_.end()) {
    s = &it->second;
  } else {
    std::string what = fmt::format("rank {} ({})", peer, peers_[peer].hostname);
    TUTTI_ASSIGN_OR_RETURN(net::Socket sock,
                           net::Socket::connect(peerAddr(peer), dl, abortFlag_, what));
    Hello h{kHelloMagic, rank_, {}};
    memcpy(h.secret, id_.secret, kSecretBytes);
    TUTTI_RETURN_IF_ERROR(sock.sendAll(&h, sizeof(h), dl, abortFlag_, what));
    s = &out_.emplace(peer, std::move(sock)).first->second;
  }
  struct {
    uint32_t magic;
    uint32_t pad;
    uint64_t tag;
    uint64_t bytes;
  } hdr{kFrameMagic, 0, tag, bytes};
  std::string what = "rank " + std::to_string(peer);
  Status st = s->sendAll(&hdr, sizeof(hdr), dl, abortFlag_, what);
  if (st) st = s->sendAll(data, bytes, dl, abortFlag_, what);
  if (!st) out_.erase(peer);
  return st;
}

Result<std::vector<uint8_t>> Bootstrap::recv(int peer, uint64_t tag) {
  return recvUntil(peer, tag, deadline(), abortFlag_);
}

Result<std::vector<uint8_t>> Bootstrap::recvUntil(int peer, uint64_t tag, net::Clock::time_point dl,
                                                  const std::atomic<bool>* abortFlag) {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    auto it = mailbox_.find({peer, tag});
    if (it != mailbox_.end() && !it->second.empty()) {
      std::vector<uint8_t> v = std::move(it->second.front());
      it->second.pop_front();
      if (it->second.empty()) mailbox_.erase(it);
      return v;
    }
    if (abortFlag && abortFlag->load()) return invalidUsage("communicator aborted");
    if (!serviceError_.isOk())
      return serviceError_.withContext(
          fmt::format("rank {} cannot receive control messages (from rank {})", rank_, peer));
    auto now = net::Clock::now();
    if (now >= dl)
      return remoteError(fmt::format("timed out waiting for a control message from rank {} ({})",
                                     peer, peers_[peer].hostname));
    cv_.wait_for(lk, std::min<net::Clock::duration>(dl - now, std::chrono::milliseconds(10)));
  }
}

Status Bootstrap::allGather(void* data, size_t bytes) {
  auto* base = static_cast<uint8_t*>(data);
  uint64_t seq = collSeq_++;
  int next = (rank_ + 1) % nranks_, prev = (rank_ - 1 + nranks_) % nranks_;
  for (int step = 0; step < nranks_ - 1; ++step) {
    int sendBlock = (rank_ - step + nranks_) % nranks_;
    int recvBlock = (rank_ - step - 1 + nranks_) % nranks_;
    uint64_t tag = (1ull << 63) | (seq << 20) | static_cast<uint64_t>(step);
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
