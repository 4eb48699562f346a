// The attacker of the security harness (issue 29): a local user who connects
// to a running tutti job's listeners (loopback only) and misbehaves.
//
//   attacker MODE [options]
//   MODE: garbage | wrongkey | idle | partial | truncated | hugelen | flood
//     --pidfile FILE    the victim's pid file (tests/security/victim.c -p):
//                       attack its root port at once, and every listener the
//                       victim's processes open while it runs (found with
//                       sock_diag and /proc/<pid>/fd, scanned every few ms:
//                       the ranks' bootstrap listeners, TCP data listeners,
//                       the roots and listeners of ncclCommSplit's children)
//     --target H:P      (repeatable, or comma-separated) fixed targets
//     --duration S      how long to attack (10; with --pidfile it also ends
//                       when the victim's parent has exited)
//     --conns N         connections per listener (mode's default: idle 6,
//                       partial 3, garbage 4, wrongkey 3, truncated 4,
//                       hugelen 2, flood 1100)
//     --interval-ms MS  a slot whose connection ended opens a new one after
//                       MS (100); --no-reopen: never
//     --proto new|old   the handshake spoken: new = base/auth.h's challenge-
//                       response (48-byte HelloMsg); old = the 40/48-byte
//                       hello with the secret in clear (tutti before issue 29)
//     --comm-id H:P     hugelen against an NCCL_COMM_ID job: the id's string
//     --secret S        hugelen: the job's TUTTI_BOOTSTRAP_SECRET, if any
//                       (new: auth::deriveKey(S), no secret: the zero key;
//                       old: FNV of "tutti:<comm-id>:<S>" as bootstrap.cc did)
//     --ranks N         hugelen: ranks of the job, for the rank claimed (pidfile)
//     --listeners FILE  write every listener of the victim seen (one a line)
//     --after-ms MS     with --pidfile: start attacking MS after the pid file
//                       appeared (e.g. once the job's init is done); the root
//                       of the pid file is then not attacked unless seen
//
// What each mode does to every listener, each of its --conns slots:
//   garbage    connect, send 1..4096 random bytes; even slots close at once,
//              odd slots keep the connection open (until the victim closes it)
//   wrongkey   a whole handshake with a random key: Hello (purpose 1, 2, 3 by
//              slot), read the Answer, send a Proof made with the wrong key,
//              see whether a Welcome comes (old: a hello with a random secret)
//   idle       connect and send nothing; hold
//   partial    connect, send 1 byte of a Hello (odd slots, new protocol: a
//              whole Hello, then no proof); hold
//   truncated  by slot: half a Hello then close; a Hello, the Answer, half a
//              Proof then close; a Hello then close; 47 bytes then close
//   hugelen    handshake with the key an unauthenticated NCCL_COMM_ID job uses
//              (purpose kBootstrapPeer, claiming a rank), then a FrameHeader
//              announcing 1 GiB and 64 bytes of it; hold
//   flood      connect --conns times and hold every connection
// A slot whose connection ends opens another after --interval-ms, as long as
// the listener exists and the attack lasts.
//
// Output (stdout): a line per listener seen, then one summary line:
//   attacker mode=.. listeners=.. wildcard=.. nonloopback=.. connects=..
//     connected=.. refused=.. peer_closed=.. close_ms_max=.. close_ms_p50=..
//     open_at_end=.. old_open_at_end=.. halfopen_at_end=.. answered=.. rejected_hello=..
//     rejected_proof=.. accepted=.. hs_done=.. hs_failed=.. victim_fds_max=..
//     victim_rss_max_kb=..
// close_ms_*: how long the victim kept a connection we held open (from its
// connect to the victim's close; a close that arrived but was not read yet
// when the attack ended counts here, at the time of the end);
// old_open_at_end: connections open at the end that had connected more than
// 2.5 s before and whose other end still exists in the kernel, held by the
// victim (none once every listener closes unauthenticated connections within
// 2 s; flood's connections waiting in a listen backlog count here too);
// halfopen_at_end: such connections whose other end does not exist at all
// (sock_diag knows no socket, not even a request, with their 4-tuple), so
// that nothing of the victim holds them: the kernel completed our side of
// the handshake, but the listener was closed (its owner was done with it)
// before the connection reached its accept queue, and the request was
// dropped without a reset (Linux sends none when it drops a half-made
// connection of a closed listener; our side would only learn of it by
// sending). They cost the victim nothing and are not counted as held.
//
// Only loopback: a target or listener address other than 127.0.0.0/8 or ::1
// (or a wildcard, which is attacked on loopback) is never connected to.
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <sodium.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "base/auth.h"

#ifdef TUTTI_ATTACKER_STANDALONE
// Built by hand with only src/base/auth.cc and status.cc (tests/security/
// README.md): the one function of base/log.cc that auth.cc needs.
namespace tutti {
Status errnoError(const std::string& what, int err) {
  return Status(Code::kSystemError, what + ": " + strerror(err));
}
}  // namespace tutti
#endif

namespace {

using tutti::auth::Handshake;

double nowMs() {
  return std::chrono::duration<double, std::milli>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

enum class Mode { kGarbage, kWrongKey, kIdle, kPartial, kTruncated, kHugeLen, kFlood };

struct Options {
  Mode mode = Mode::kIdle;
  std::string modeName;
  std::string pidfile;
  std::vector<std::string> targets;
  double duration = 10;
  int conns = -1;
  double intervalMs = 100;
  bool reopen = true;
  bool oldProto = false;
  std::string commId;
  std::string secret;
  bool haveSecret = false;
  int ranks = 0;
  std::string listenersFile;
  double afterMs = 0;
};

// ---- old protocol (git HEAD before issue 29: src/core/bootstrap.cc,
// transports/tcp/tcp_transport.cc) ----
constexpr uint32_t kOldBootstrapHelloMagic = 0x54424f4f;
constexpr uint64_t kOldTcpHelloMagic = 0x74757474695443ull;
struct OldBootstrapHello {
  uint32_t magic;
  int32_t rank;
  uint8_t secret[32];
};
struct OldTcpHello {
  uint64_t magic;
  uint8_t secret[32];
  int32_t rank;
  int32_t channel;
};
static_assert(sizeof(OldBootstrapHello) == 40 && sizeof(OldTcpHello) == 48);

uint64_t fnv1a(const void* data, size_t n, uint64_t h) {
  auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}
// The secret bootstrap.cc derived from NCCL_COMM_ID before issue 29.
void oldDerivedSecret(const std::string& commId, const std::string& secret, uint8_t out[32]) {
  std::string seed = "tutti:" + commId + ":" + secret;
  for (size_t i = 0; i < 32; i += 8) {
    uint64_t h = fnv1a(seed.data(), seed.size(), 1469598103934665603ull + i);
    memcpy(out + i, &h, 8);
  }
}

// A bootstrap frame (src/core/bootstrap_wire.h; the same before issue 29).
struct FrameHeader {
  uint32_t magic;
  uint32_t pad;
  uint64_t tag;
  uint64_t bytes;
};
constexpr uint32_t kFrameMagic = 0x54465241;

// ---- targets ----
struct Target {
  std::string name;  // where it listens, as seen
  sockaddr_storage addr{};
  socklen_t len = 0;
  int pid = 0;
  int rank = -1;  // index of the owning process in the pid file (-1: parent/unknown)
  bool alive = true;
  int refusedInARow = 0;
  double firstSeenMs = 0;
  bool fromScan = false;
  uint64_t inode = 0;
};

struct Conn {
  int fd = -1;
  int target = -1;
  int slot = -1;
  int stage = 0;
  double startMs = 0, connectedMs = -1, sentMs = -1;
  std::vector<uint8_t> out;
  size_t outOff = 0;
  uint8_t in[128];
  size_t inLen = 0, inWant = 0;
  std::unique_ptr<Handshake> hs;
  // Wrong-key state (new protocol).
  tutti::auth::HelloMsg hello{};
};

enum Stage {
  kConnecting = 1,
  kSending,      // out[] to the peer, then next
  kWaitAnswer,   // wrongkey/truncated: the responder's 80-byte Answer
  kWaitWelcome,  // wrongkey: Welcome or close
  kHandshake,    // hugelen: the real handshake (zero key or the secret's)
  kHold,         // hold; read and drop whatever comes; note the victim's close
  kWaitClose,    // old-protocol wrong key: see whether the victim closes
};

struct Counters {
  long connects = 0, connected = 0, refused = 0, connectErrors = 0, peerClosed = 0;
  long answered = 0, rejectedHello = 0, rejectedProof = 0, accepted = 0;
  long hsDone = 0, hsFailed = 0, bytesFromVictim = 0;
  std::vector<double> closeMs;  // lifetimes of held connections the victim closed
};

bool isLoopback(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET) {
    auto* s = reinterpret_cast<const sockaddr_in*>(&a);
    return (ntohl(s->sin_addr.s_addr) >> 24) == 127;
  }
  if (a.ss_family == AF_INET6) {
    auto* s = reinterpret_cast<const sockaddr_in6*>(&a);
    return IN6_IS_ADDR_LOOPBACK(&s->sin6_addr);
  }
  return false;
}

std::string addrStr(const sockaddr_storage& a) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (a.ss_family == AF_INET) {
    auto* s = reinterpret_cast<const sockaddr_in*>(&a);
    inet_ntop(AF_INET, &s->sin_addr, host, sizeof(host));
    port = ntohs(s->sin_port);
    return std::string(host) + ":" + std::to_string(port);
  }
  auto* s = reinterpret_cast<const sockaddr_in6*>(&a);
  inet_ntop(AF_INET6, &s->sin6_addr, host, sizeof(host));
  port = ntohs(s->sin6_port);
  return "[" + std::string(host) + "]:" + std::to_string(port);
}

bool parseTarget(const std::string& s, sockaddr_storage* out, socklen_t* len) {
  std::string host, port;
  if (!s.empty() && s[0] == '[') {
    size_t e = s.find(']');
    if (e == std::string::npos || e + 1 >= s.size() || s[e + 1] != ':') return false;
    host = s.substr(1, e - 1);
    port = s.substr(e + 2);
  } else {
    size_t c = s.rfind(':');
    if (c == std::string::npos) return false;
    host = s.substr(0, c);
    port = s.substr(c + 1);
  }
  memset(out, 0, sizeof(*out));
  auto* s4 = reinterpret_cast<sockaddr_in*>(out);
  auto* s6 = reinterpret_cast<sockaddr_in6*>(out);
  if (host == "localhost") host = "127.0.0.1";
  if (inet_pton(AF_INET, host.c_str(), &s4->sin_addr) == 1) {
    s4->sin_family = AF_INET;
    s4->sin_port = htons(static_cast<uint16_t>(atoi(port.c_str())));
    *len = sizeof(sockaddr_in);
  } else if (inet_pton(AF_INET6, host.c_str(), &s6->sin6_addr) == 1) {
    s6->sin6_family = AF_INET6;
    s6->sin6_port = htons(static_cast<uint16_t>(atoi(port.c_str())));
    *len = sizeof(sockaddr_in6);
  } else {
    return false;
  }
  return true;
}

// ---- the victim's processes and listeners ----
struct Victim {
  int parent = 0;
  std::vector<int> pids;  // rank r's pid is pids[r]
  unsigned rootPort = 0;
};

bool readPidfile(const std::string& path, Victim* v) {
  std::ifstream f(path);
  if (!f) return false;
  std::string line;
  bool gotPids = false;
  while (std::getline(f, line)) {
    if (line.rfind("port=", 0) == 0) v->rootPort = static_cast<unsigned>(atoi(line.c_str() + 5));
    if (line.rfind("parent=", 0) == 0) v->parent = atoi(line.c_str() + 7);
    if (line.rfind("pids=", 0) == 0) {
      std::istringstream ss(line.substr(5));
      int p;
      while (ss >> p) v->pids.push_back(p);
      gotPids = true;
    }
  }
  return gotPids && v->parent > 0;
}

// Socket inodes of a process's descriptors.
void socketInodes(int pid, std::map<uint64_t, int>* out) {
  std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = opendir(dir.c_str());
  if (!d) return;
  char link[128];
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    std::string p = dir + "/" + e->d_name;
    ssize_t n = readlink(p.c_str(), link, sizeof(link) - 1);
    if (n <= 0) continue;
    link[n] = 0;
    unsigned long long ino;
    if (sscanf(link, "socket:[%llu]", &ino) == 1) (*out)[ino] = pid;
  }
  closedir(d);
}

long countFds(int pid) {
  std::string dir = "/proc/" + std::to_string(pid) + "/fd";
  DIR* d = opendir(dir.c_str());
  if (!d) return -1;
  long n = 0;
  while (dirent* e = readdir(d))
    if (e->d_name[0] != '.') ++n;
  closedir(d);
  return n;
}

long rssKb(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("VmRSS:", 0) == 0) return atol(line.c_str() + 6);
  return -1;
}

struct Listener {
  sockaddr_storage addr{};
  socklen_t len = 0;
  uint64_t inode = 0;
};

// An IPv4 or IPv6 address and port as sock_diag gives them (network order).
sockaddr_storage inetAddr(int family, uint16_t port, const uint32_t* addr) {
  sockaddr_storage a{};
  if (family == AF_INET) {
    auto* s = reinterpret_cast<sockaddr_in*>(&a);
    s->sin_family = AF_INET;
    s->sin_port = port;
    memcpy(&s->sin_addr, addr, 4);
  } else {
    auto* s = reinterpret_cast<sockaddr_in6*>(&a);
    s->sin6_family = AF_INET6;
    s->sin6_port = port;
    memcpy(&s->sin6_addr, addr, 16);
  }
  return a;
}

// Every TCP socket of this network namespace in one of `states` (a mask of
// 1 << TCP state) (sock_diag): its local address (and, with `peers`, its
// remote address, same index).
bool listSockets(int nl, uint32_t states, std::vector<Listener>* out,
                 std::vector<sockaddr_storage>* peers = nullptr) {
  out->clear();
  if (peers) peers->clear();
  for (int family : {AF_INET, AF_INET6}) {
    struct {
      nlmsghdr nlh;
      inet_diag_req_v2 req;
    } msg{};
    msg.nlh.nlmsg_len = sizeof(msg);
    msg.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    msg.nlh.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
    msg.req.sdiag_family = static_cast<uint8_t>(family);
    msg.req.sdiag_protocol = IPPROTO_TCP;
    msg.req.idiag_states = states;
    sockaddr_nl sa{};
    sa.nl_family = AF_NETLINK;
    if (sendto(nl, &msg, sizeof(msg), 0, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) < 0)
      return false;
    bool done = false;
    alignas(nlmsghdr) char buf[32768];
    while (!done) {
      ssize_t n = recv(nl, buf, sizeof(buf), 0);
      if (n < 0) {
        if (errno == EINTR) continue;
        return false;
      }
      for (auto* h = reinterpret_cast<nlmsghdr*>(buf); NLMSG_OK(h, static_cast<unsigned>(n));
           h = NLMSG_NEXT(h, n)) {
        if (h->nlmsg_type == NLMSG_DONE || h->nlmsg_type == NLMSG_ERROR) {
          done = true;
          break;
        }
        auto* m = static_cast<inet_diag_msg*>(NLMSG_DATA(h));
        Listener l;
        l.inode = m->idiag_inode;
        const int family = m->idiag_family == AF_INET ? AF_INET : AF_INET6;
        l.addr = inetAddr(family, m->id.idiag_sport, m->id.idiag_src);
        l.len = family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
        if (peers) peers->push_back(inetAddr(family, m->id.idiag_dport, m->id.idiag_dst));
        out->push_back(l);
      }
    }
  }
  return true;
}

constexpr uint32_t kTcpListenState = 1u << 10;  // TCP_LISTEN

bool listListeners(int nl, std::vector<Listener>* out) {
  return listSockets(nl, kTcpListenState, out);
}

bool isWildcard(const sockaddr_storage& a) {
  if (a.ss_family == AF_INET)
    return reinterpret_cast<const sockaddr_in*>(&a)->sin_addr.s_addr == htonl(INADDR_ANY);
  if (a.ss_family == AF_INET6)
    return IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(&a)->sin6_addr);
  return false;
}

// ---- the attack ----
class Attack {
 public:
  explicit Attack(const Options& o) : o_(o) {
    if (o_.haveSecret) key_ = tutti::auth::deriveKey(o_.secret);  // else the zero key
    if (o_.oldProto) oldDerivedSecret(o_.commId, o_.haveSecret ? o_.secret : "", oldSecret_);
  }

  int run();

 private:
  int addTarget(const sockaddr_storage& a, socklen_t len, const std::string& seenAs, int pid,
                int rank, bool fromScan, uint64_t inode);
  void openSlot(int target, int slot);
  void openSlots(int target);
  void startMode(Conn& c);
  void onWritable(Conn& c);
  void onReadable(Conn& c);
  void endConn(Conn& c, bool byPeer);
  void scan();
  void sampleVictim();
  bool victimGone();
  void report();

  const Options& o_;
  tutti::auth::Key key_{};
  uint8_t oldSecret_[32]{};
  Victim victim_;
  bool haveVictim_ = false;
  std::vector<Target> targets_;
  std::map<std::string, int> targetByAddr_;
  std::vector<std::unique_ptr<Conn>> conns_;
  std::multimap<double, std::pair<int, int>> reopenAt_;  // time -> (target, slot)
  std::set<uint64_t> knownInodes_;
  std::vector<std::string> listenerLines_;
  int nl_ = -1;
  int wildcard_ = 0, nonLoopback_ = 0;
  long victimFdsMax_ = 0, victimRssMaxKb_ = 0;
  Counters n_;
  std::map<int, long> errs_;  // connect errors other than refused, by errno
  double endMs_ = 0;
};

int Attack::addTarget(const sockaddr_storage& a, socklen_t len, const std::string& seenAs, int pid,
                      int rank, bool fromScan, uint64_t inode) {
  std::string key = addrStr(a);
  auto it = targetByAddr_.find(key);
  if (it != targetByAddr_.end()) {
    Target& t = targets_[it->second];
    if (fromScan) {
      t.pid = pid;
      t.rank = rank;
      t.inode = inode;
      t.fromScan = true;
      t.name = seenAs;
      if (!t.alive) {  // the same port again: a new listener
        t.alive = true;
        t.refusedInARow = 0;
        openSlots(it->second);
      }
    }
    return it->second;
  }
  if (!isLoopback(a)) {
    fprintf(stderr, "attacker: refusing non-loopback target %s\n", key.c_str());
    return -1;
  }
  Target t;
  t.name = seenAs;
  t.addr = a;
  t.len = len;
  t.pid = pid;
  t.rank = rank;
  t.firstSeenMs = nowMs();
  t.fromScan = fromScan;
  t.inode = inode;
  targets_.push_back(t);
  int idx = static_cast<int>(targets_.size()) - 1;
  targetByAddr_[key] = idx;
  openSlots(idx);
  return idx;
}

// Every slot of a target (--conns of them).
void Attack::openSlots(int target) {
  for (int s = 0; s < o_.conns; ++s) openSlot(target, s);
}

void Attack::openSlot(int target, int slot) {
  Target& t = targets_[target];
  if (!t.alive || nowMs() >= endMs_) return;
  int fd = socket(t.addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    ++n_.connectErrors;
    reopenAt_.emplace(nowMs() + std::max(o_.intervalMs, 50.0), std::make_pair(target, slot));
    return;
  }
  auto c = std::make_unique<Conn>();
  c->fd = fd;
  c->target = target;
  c->slot = slot;
  c->startMs = nowMs();
  c->stage = kConnecting;
  ++n_.connects;
  if (connect(fd, reinterpret_cast<const sockaddr*>(&t.addr), t.len) != 0 && errno != EINPROGRESS) {
    int err = errno;
    close(fd);
    if (err == ECONNREFUSED) {
      ++n_.refused;
      if (++t.refusedInARow >= 3) t.alive = false;
    } else {
      ++n_.connectErrors;
      ++errs_[err];
    }
    if (t.alive && o_.reopen)
      reopenAt_.emplace(nowMs() + std::max(o_.intervalMs, 20.0), std::make_pair(target, slot));
    return;
  }
  conns_.push_back(std::move(c));
}

void fillRandom(std::vector<uint8_t>* v, size_t n) {
  v->resize(n);
  randombytes_buf(v->data(), n);
}

// What a connected slot does first.
void Attack::startMode(Conn& c) {
  const Target& t = targets_[c.target];
  c.out.clear();
  c.outOff = 0;
  auto newHello = [&](uint16_t purpose) {
    tutti::auth::HelloMsg h{};
    h.magic = tutti::auth::kMagic;
    h.version = tutti::auth::kVersion;
    h.purpose = purpose;
    h.rank = purpose == 1 ? std::max(t.rank, 0) : (t.rank <= 0 ? 1 : 0);
    h.channel = 0;
    randombytes_buf(h.nonce, sizeof(h.nonce));
    c.hello = h;
    std::vector<uint8_t> v(sizeof(h));
    memcpy(v.data(), &h, sizeof(h));
    return v;
  };
  auto oldHello = [&](bool tcp, bool rightSecret) {
    std::vector<uint8_t> v;
    int claimed = t.rank <= 0 ? 1 : 0;
    if (tcp) {
      OldTcpHello h{kOldTcpHelloMagic, {}, claimed, 0};
      randombytes_buf(h.secret, sizeof(h.secret));
      v.resize(sizeof(h));
      memcpy(v.data(), &h, sizeof(h));
    } else {
      OldBootstrapHello h{kOldBootstrapHelloMagic, claimed, {}};
      if (rightSecret)
        memcpy(h.secret, oldSecret_, sizeof(h.secret));
      else
        randombytes_buf(h.secret, sizeof(h.secret));
      v.resize(sizeof(h));
      memcpy(v.data(), &h, sizeof(h));
    }
    return v;
  };
  switch (o_.mode) {
    case Mode::kIdle:
    case Mode::kFlood:
      c.stage = kHold;
      return;
    case Mode::kPartial:
      // Even slots: 1 byte of a Hello. Odd slots (new protocol): a whole
      // Hello, then nothing: the listener has answered and waits for a proof.
      c.out = o_.oldProto ? oldHello(false, false) : newHello(2);
      if (o_.oldProto || c.slot % 2 == 0) c.out.resize(1);
      c.stage = kSending;
      return;
    case Mode::kGarbage:
      fillRandom(&c.out, 1 + randombytes_uniform(4096));
      c.stage = kSending;
      return;
    case Mode::kWrongKey:
      if (o_.oldProto)
        c.out = oldHello(c.slot % 3 == 2, false);
      else
        c.out = newHello(static_cast<uint16_t>(1 + c.slot % 3));
      c.stage = kSending;
      return;
    case Mode::kTruncated: {
      int v = c.slot % 4;
      c.out =
          o_.oldProto ? oldHello(v == 3, false) : newHello(static_cast<uint16_t>(1 + c.slot % 3));
      if (v == 0) c.out.resize(c.out.size() / 2);
      if (v == 3) c.out.resize(c.out.size() - 1);
      if (o_.oldProto && v == 1) c.out.resize(c.out.size() - 8);
      c.stage = kSending;
      return;
    }
    case Mode::kHugeLen:
      if (o_.oldProto) {
        c.out = oldHello(false, true);
        FrameHeader h{kFrameMagic, 0, 0x41545441434bull, uint64_t{1} << 30};
        size_t at = c.out.size();
        c.out.resize(at + sizeof(h) + 64, 0x5a);
        memcpy(c.out.data() + at, &h, sizeof(h));
        c.stage = kSending;
      } else {
        int claimed = t.rank <= 0 ? 1 : 0;
        c.hs = std::make_unique<Handshake>(Handshake::Role::kInitiator, key_,
                                           tutti::auth::Purpose::kBootstrapPeer,
                                           tutti::auth::Identity{claimed, 0});
        c.stage = kHandshake;  // driven by onWritable
      }
      return;
  }
}

void Attack::endConn(Conn& c, bool byPeer) {
  if (c.fd < 0) return;
  double now = nowMs();
  if (byPeer) {
    ++n_.peerClosed;
    if (c.stage == kHold && c.connectedMs >= 0) n_.closeMs.push_back(now - c.connectedMs);
  }
  close(c.fd);
  c.fd = -1;
  if (o_.reopen && now < endMs_)
    reopenAt_.emplace(now + o_.intervalMs, std::make_pair(c.target, c.slot));
}

void Attack::onWritable(Conn& c) {
  if (c.stage == kConnecting) {
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      Target& t = targets_[c.target];
      if (err == ECONNREFUSED) {
        ++n_.refused;
        if (++t.refusedInARow >= 3) t.alive = false;
      } else {
        ++n_.connectErrors;
        ++errs_[err];
      }
      close(c.fd);
      c.fd = -1;
      if (t.alive && o_.reopen && nowMs() < endMs_)
        reopenAt_.emplace(nowMs() + std::max(o_.intervalMs, 20.0),
                          std::make_pair(c.target, c.slot));
      return;
    }
    targets_[c.target].refusedInARow = 0;
    ++n_.connected;
    c.connectedMs = nowMs();
    startMode(c);
    if (c.stage != kSending && c.stage != kHandshake) return;
  }
  if (c.stage == kHandshake) {
    auto st = c.hs->advance(c.fd);
    if (st == Handshake::State::kDone) {
      ++n_.hsDone;
      FrameHeader h{kFrameMagic, 0, 0x41545441434bull, uint64_t{1} << 30};
      c.out.assign(sizeof(h) + 64, 0x5a);
      memcpy(c.out.data(), &h, sizeof(h));
      c.outOff = 0;
      c.stage = kSending;
    } else if (st == Handshake::State::kFailed) {
      ++n_.hsFailed;
      endConn(c, false);
      return;
    } else {
      return;
    }
  }
  if (c.stage != kSending) return;
  while (c.outOff < c.out.size()) {
    ssize_t n =
        send(c.fd, c.out.data() + c.outOff, c.out.size() - c.outOff, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.outOff += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    endConn(c, true);  // reset by the victim
    return;
  }
  c.sentMs = nowMs();
  // Sent: what next.
  switch (o_.mode) {
    case Mode::kGarbage:
      if (c.slot % 2 == 0)
        endConn(c, false);
      else
        c.stage = kHold;
      return;
    case Mode::kWrongKey:
      if (o_.oldProto) {
        c.stage = kWaitClose;
      } else if (c.stage == kSending && c.inWant == 0) {
        c.stage = kWaitAnswer;
        c.inLen = 0;
        c.inWant = sizeof(tutti::auth::AnswerMsg);
      } else {
        c.stage = kWaitWelcome;
        c.inLen = 0;
        c.inWant = sizeof(tutti::auth::WelcomeMsg);
      }
      return;
    case Mode::kTruncated: {
      int v = c.slot % 4;
      if (!o_.oldProto && v == 1 && c.inWant == 0) {  // a whole Hello: wait for the Answer
        c.stage = kWaitAnswer;
        c.inLen = 0;
        c.inWant = sizeof(tutti::auth::AnswerMsg);
        return;
      }
      endConn(c, false);
      return;
    }
    default:
      c.stage = kHold;
      return;
  }
}

void Attack::onReadable(Conn& c) {
  uint8_t buf[4096];
  size_t want = sizeof(buf);
  if (c.stage == kWaitAnswer || c.stage == kWaitWelcome) want = c.inWant - c.inLen;
  if (c.stage == kHandshake) {
    onWritable(c);
    return;
  }
  ssize_t n = recv(c.fd, buf, want, MSG_DONTWAIT);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (n <= 0) {
    if (c.stage == kWaitAnswer) ++n_.rejectedHello;
    if (c.stage == kWaitWelcome) ++n_.rejectedProof;
    if (c.stage == kWaitClose) ++n_.rejectedHello;
    endConn(c, true);
    return;
  }
  n_.bytesFromVictim += n;
  if (c.stage == kWaitAnswer || c.stage == kWaitWelcome) {
    memcpy(c.in + c.inLen, buf, static_cast<size_t>(n));
    c.inLen += static_cast<size_t>(n);
    if (c.inLen < c.inWant) return;
    if (c.stage == kWaitAnswer) {
      ++n_.answered;
      // A proof made with a key that is not the job's.
      tutti::auth::AnswerMsg answer;
      memcpy(&answer, c.in, sizeof(answer));
      uint8_t wrongKey[32];
      randombytes_buf(wrongKey, sizeof(wrongKey));
      uint8_t all[sizeof(tutti::auth::HelloMsg) + sizeof(answer)];
      memcpy(all, &c.hello, sizeof(c.hello));
      memcpy(all + sizeof(c.hello), &answer, sizeof(answer));
      crypto_auth_hmacsha256_state st;
      crypto_auth_hmacsha256_init(&st, wrongKey, sizeof(wrongKey));
      const char label[] = "tutti-auth-1 proof";
      crypto_auth_hmacsha256_update(&st, reinterpret_cast<const uint8_t*>(label), strlen(label));
      crypto_auth_hmacsha256_update(&st, all, sizeof(all));
      c.out.resize(32);
      crypto_auth_hmacsha256_final(&st, c.out.data());
      if (o_.mode == Mode::kTruncated) c.out.resize(16);  // half a proof, then close
      c.outOff = 0;
      c.stage = kSending;
      onWritable(c);
      return;
    }
    tutti::auth::WelcomeMsg w;
    memcpy(&w, c.in, sizeof(w));
    if (w.magic == tutti::auth::kMagic && w.accepted == 1) ++n_.accepted;
    endConn(c, false);
    return;
  }
  if (c.stage == kWaitClose) ++n_.accepted;  // the old victim answered a wrong secret
}

void Attack::scan() {
  if (!haveVictim_ || nl_ < 0) return;
  std::vector<Listener> ls;
  if (!listListeners(nl_, &ls)) return;
  std::set<uint64_t> present;
  std::vector<Listener> fresh;
  for (auto& l : ls) {
    present.insert(l.inode);
    if (!knownInodes_.count(l.inode)) fresh.push_back(l);
  }
  // Listeners gone: their targets stop.
  for (auto& t : targets_)
    if (t.fromScan && t.alive && !present.count(t.inode)) t.alive = false;
  if (fresh.empty()) return;
  std::map<uint64_t, int> owner;
  socketInodes(victim_.parent, &owner);
  for (int p : victim_.pids) socketInodes(p, &owner);
  for (auto& l : fresh) {
    knownInodes_.insert(l.inode);
    auto it = owner.find(l.inode);
    if (it == owner.end()) continue;  // not the victim's
    int pid = it->second;
    int rank = -1;
    for (size_t r = 0; r < victim_.pids.size(); ++r)
      if (victim_.pids[r] == pid) rank = static_cast<int>(r);
    std::string seen = addrStr(l.addr);
    bool wild = isWildcard(l.addr);
    bool loop = isLoopback(l.addr);
    wildcard_ += wild;
    nonLoopback_ += !wild && !loop;
    char line[256];
    snprintf(line, sizeof(line),
             "listener addr=%s pid=%d rank=%d wildcard=%d loopback=%d t_ms=%.0f", seen.c_str(), pid,
             rank, wild ? 1 : 0, loop ? 1 : 0, nowMs() - (endMs_ - o_.duration * 1e3));
    listenerLines_.push_back(line);
    if (!wild && !loop) continue;  // never connect anywhere but loopback
    sockaddr_storage a = l.addr;
    if (wild) {
      if (a.ss_family == AF_INET)
        reinterpret_cast<sockaddr_in*>(&a)->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      else
        reinterpret_cast<sockaddr_in6*>(&a)->sin6_addr = in6addr_loopback;
    }
    addTarget(a, l.len, seen, pid, rank, true, l.inode);
  }
}

void Attack::sampleVictim() {
  if (!haveVictim_) return;
  std::vector<int> all = victim_.pids;
  all.push_back(victim_.parent);
  for (int p : all) {
    long f = countFds(p), r = rssKb(p);
    victimFdsMax_ = std::max(victimFdsMax_, f);
    victimRssMaxKb_ = std::max(victimRssMaxKb_, r);
  }
}

bool Attack::victimGone() {
  if (!haveVictim_) return false;
  return kill(victim_.parent, 0) != 0 && errno == ESRCH;
}

int Attack::run() {
  double start = nowMs();
  endMs_ = start + o_.duration * 1e3;
  if (!o_.pidfile.empty()) {
    while (!readPidfile(o_.pidfile, &victim_)) {
      if (nowMs() >= endMs_) {
        fprintf(stderr, "attacker: no pid file %s\n", o_.pidfile.c_str());
        return 2;
      }
      usleep(2000);
      victim_ = Victim();
    }
    haveVictim_ = true;
    nl_ = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (o_.afterMs > 0) {
      double until = nowMs() + o_.afterMs;
      while (nowMs() < until && !victimGone()) {
        sampleVictim();
        usleep(20000);
      }
      // Listeners that existed before are attacked too (found by the scan).
    }
    if (victim_.rootPort && o_.afterMs <= 0) {
      sockaddr_storage a{};
      socklen_t len = 0;
      parseTarget("127.0.0.1:" + std::to_string(victim_.rootPort), &a, &len);
      addTarget(a, len, "root (pid file)", victim_.parent, -1, false, 0);
    }
  }
  for (auto& s : o_.targets) {
    sockaddr_storage a{};
    socklen_t len = 0;
    if (!parseTarget(s, &a, &len)) {
      fprintf(stderr, "attacker: bad target %s\n", s.c_str());
      return 2;
    }
    if (addTarget(a, len, s, 0, -1, false, 0) < 0) return 2;
  }
  double nextScan = 0, nextSample = 0;
  std::vector<pollfd> pfds;
  std::vector<Conn*> byIdx;
  while (nowMs() < endMs_) {
    double now = nowMs();
    if (now >= nextScan) {
      scan();
      nextScan = nowMs() + 3;
    }
    if (now >= nextSample) {
      sampleVictim();
      if (victimGone()) break;
      nextSample = now + 200;
    }
    while (!reopenAt_.empty() && reopenAt_.begin()->first <= now) {
      auto ts = reopenAt_.begin()->second;
      reopenAt_.erase(reopenAt_.begin());
      openSlot(ts.first, ts.second);
    }
    conns_.erase(std::remove_if(conns_.begin(), conns_.end(),
                                [](const std::unique_ptr<Conn>& c) { return c->fd < 0; }),
                 conns_.end());
    pfds.clear();
    byIdx.clear();
    for (auto& c : conns_) {
      short ev = POLLIN;
      if (c->stage == kConnecting || (c->stage == kSending && c->outOff < c->out.size()))
        ev = POLLOUT;
      if (c->stage == kHandshake) ev = c->hs->pollEvents();
      pfds.push_back({c->fd, ev, 0});
      byIdx.push_back(c.get());
    }
    double wait = std::min(nextScan, nextSample) - nowMs();
    if (!reopenAt_.empty()) wait = std::min(wait, reopenAt_.begin()->first - nowMs());
    int rc = poll(pfds.data(), pfds.size(), static_cast<int>(std::max(0.0, std::min(wait, 20.0))));
    if (rc <= 0) continue;
    for (size_t i = 0; i < pfds.size(); ++i) {
      Conn& c = *byIdx[i];
      short re = pfds[i].revents;
      if (!re || c.fd < 0) continue;
      if (c.stage == kConnecting || (re & POLLOUT)) {
        onWritable(c);
      } else if (re & (POLLIN | POLLHUP | POLLERR)) {
        onReadable(c);
      }
    }
  }
  report();
  return 0;
}

void Attack::report() {
  // Closes that arrived while the attack ended (the victim's processes exit
  // just before its parent, which ends the attack) are the victim's closes.
  {
    std::vector<pollfd> pfds;
    std::vector<Conn*> held;
    for (auto& c : conns_)
      if (c->fd >= 0 && c->stage == kHold) {
        pfds.push_back({c->fd, POLLIN, 0});
        held.push_back(c.get());
      }
    if (!pfds.empty() && poll(pfds.data(), pfds.size(), 0) > 0)
      for (size_t i = 0; i < pfds.size(); ++i)
        if (pfds[i].revents & (POLLIN | POLLHUP | POLLERR)) onReadable(*held[i]);
  }
  // The other ends that exist (any state but LISTEN: established, in an
  // accept queue, a request, closing), as "victim side -> our side".
  std::set<std::string> otherEnds;
  bool haveEnds = false;
  {
    int nl = nl_ >= 0 ? nl_ : socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    std::vector<Listener> local;
    std::vector<sockaddr_storage> remote;
    if (nl >= 0 && listSockets(nl, ~kTcpListenState, &local, &remote)) {
      haveEnds = true;
      for (size_t i = 0; i < local.size(); ++i)
        otherEnds.insert(addrStr(local[i].addr) + ">" + addrStr(remote[i]));
    }
    if (nl >= 0 && nl != nl_) close(nl);
  }
  double end = nowMs();
  long open = 0, oldOpen = 0, halfOpen = 0;
  for (auto& c : conns_) {
    if (c->fd < 0) continue;
    ++open;
    if (c->connectedMs >= 0 && end - c->connectedMs > 2500 && c->stage == kHold) {
      sockaddr_storage me{}, peer{};
      socklen_t ml = sizeof(me), pl = sizeof(peer);
      bool known = haveEnds && getsockname(c->fd, reinterpret_cast<sockaddr*>(&me), &ml) == 0 &&
                   getpeername(c->fd, reinterpret_cast<sockaddr*>(&peer), &pl) == 0;
      if (known && !otherEnds.count(addrStr(peer) + ">" + addrStr(me)))
        ++halfOpen;  // nothing holds the other end (the header)
      else
        ++oldOpen;
    }
    linger l{1, 0};  // reset, leave no TIME_WAIT behind
    setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
    close(c->fd);
    c->fd = -1;
  }
  for (auto& e : errs_)
    fprintf(stderr, "attacker: %ld connects failed: %s\n", e.second, strerror(e.first));
  std::sort(n_.closeMs.begin(), n_.closeMs.end());
  double maxMs = n_.closeMs.empty() ? 0 : n_.closeMs.back();
  double p50 = n_.closeMs.empty() ? 0 : n_.closeMs[n_.closeMs.size() / 2];
  for (auto& l : listenerLines_) printf("%s\n", l.c_str());
  if (!o_.listenersFile.empty()) {
    FILE* f = fopen(o_.listenersFile.c_str(), "w");
    if (f) {
      for (auto& l : listenerLines_) fprintf(f, "%s\n", l.c_str());
      fclose(f);
    }
  }
  printf(
      "attacker mode=%s proto=%s targets=%zu listeners=%zu wildcard=%d nonloopback=%d "
      "connects=%ld connected=%ld refused=%ld connect_errors=%ld peer_closed=%ld "
      "close_ms_max=%.0f close_ms_p50=%.0f open_at_end=%ld old_open_at_end=%ld "
      "halfopen_at_end=%ld answered=%ld "
      "rejected_hello=%ld rejected_proof=%ld accepted=%ld hs_done=%ld hs_failed=%ld "
      "bytes_from_victim=%ld victim_fds_max=%ld victim_rss_max_kb=%ld\n",
      o_.modeName.c_str(), o_.oldProto ? "old" : "new", targets_.size(), listenerLines_.size(),
      wildcard_, nonLoopback_, n_.connects, n_.connected, n_.refused, n_.connectErrors,
      n_.peerClosed, maxMs, p50, open, oldOpen, halfOpen, n_.answered, n_.rejectedHello, n_.rejectedProof,
      n_.accepted, n_.hsDone, n_.hsFailed, n_.bytesFromVictim, victimFdsMax_, victimRssMaxKb_);
  fflush(stdout);
}

[[noreturn]] void usage() {
  fprintf(stderr,
          "usage: attacker garbage|wrongkey|idle|partial|truncated|hugelen|flood "
          "[--pidfile F] [--target H:P[,H:P...]] [--duration S] [--conns N] [--interval-ms MS] "
          "[--no-reopen] [--proto new|old] [--comm-id H:P] [--secret S] [--listeners F]\n");
  exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) usage();
  Options o;
  o.modeName = argv[1];
  static const std::map<std::string, std::pair<Mode, int>> modes = {
      {"garbage", {Mode::kGarbage, 4}},     {"wrongkey", {Mode::kWrongKey, 3}},
      {"idle", {Mode::kIdle, 6}},           {"partial", {Mode::kPartial, 3}},
      {"truncated", {Mode::kTruncated, 4}}, {"hugelen", {Mode::kHugeLen, 2}},
      {"flood", {Mode::kFlood, 1100}}};
  auto m = modes.find(o.modeName);
  if (m == modes.end()) usage();
  o.mode = m->second.first;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) usage();
      return argv[++i];
    };
    if (a == "--pidfile")
      o.pidfile = val();
    else if (a == "--target") {
      std::stringstream ss(val());
      std::string t;
      while (std::getline(ss, t, ','))
        if (!t.empty()) o.targets.push_back(t);
    } else if (a == "--duration")
      o.duration = atof(val().c_str());
    else if (a == "--conns")
      o.conns = atoi(val().c_str());
    else if (a == "--interval-ms")
      o.intervalMs = atof(val().c_str());
    else if (a == "--no-reopen")
      o.reopen = false;
    else if (a == "--proto") {
      std::string p = val();
      if (p != "old" && p != "new") usage();
      o.oldProto = p == "old";
    } else if (a == "--comm-id")
      o.commId = val();
    else if (a == "--secret") {
      o.secret = val();
      o.haveSecret = true;
    } else if (a == "--ranks")
      o.ranks = atoi(val().c_str());
    else if (a == "--listeners")
      o.listenersFile = val();
    else if (a == "--after-ms")
      o.afterMs = atof(val().c_str());
    else
      usage();
  }
  if (o.conns < 0) o.conns = m->second.second;
  if (o.pidfile.empty() && o.targets.empty()) usage();
  if (sodium_init() < 0) {
    fprintf(stderr, "attacker: libsodium failed to initialise\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  Attack attack(o);
  return attack.run();
}
