// tutti's libfabric network transport, as an NCCL net plugin (tables
// ncclNetPlugin_v9 and _v8, name "ofi") that tutti's loader
// (transports/ncclnet/nccl_net.cc) drives like any other plugin: TUTTI_NET=ofi,
// or NCCL_NET_PLUGIN=/path/to/libtutti-net-ofi.so.
//
// libfabric's reliable datagram endpoints (FI_EP_RDM) with tagged messages
// carry the messages; the provider is libfabric's choice unless FI_PROVIDER
// names one (tcp and shm here; verbs, efa, cxi on clusters). Design:
// - One endpoint per process, with one completion queue and one address
//   vector, as RDM endpoints are meant to be used: a connection is a pair of
//   ids in the message tags, not an endpoint of its own (an endpoint per
//   connection would give a provider such as shm a region per connection).
//   Every entry point takes one process-wide lock; the domain is opened with
//   FI_THREAD_DOMAIN accordingly.
// - Tags: bits 56-59 say what a message is, bits 32-55 carry a connection id,
//   bits 0-31 the caller's tag. A receive comm's id (given at listen, unique
//   in its process) is in every data message sent to it; a send comm's id
//   (unique in its process) in the control messages addressed to it. Every
//   receive is posted with an exact tag. Messages of one connection are
//   matched in sending order (FI_ORDER_SAS, requested from the provider).
// - listen() posts the receive of a "hello" (tag HELLO|id) and puts the
//   endpoint's address, the id and the liveness socket's address into the
//   handle. connect() inserts that address into the address vector (once
//   per address: every connection between two processes shares the
//   provider's connection) and sends the hello, which carries the send
//   comm's id and the sender's addresses; it hands out the send comm once the
//   provider completed the hello. accept() hands out the receive comm once
//   the hello arrived. Neither blocks.
// - Flow control: a message is sent only into a receive its peer posted.
//   A receive comm sends its sender credits (how many receives it posted,
//   and the smallest), and isend hands out no request while there is none;
//   a message larger than the smallest receive is refused. Providers buffer
//   early messages in finite pools, and a message that does not fit its
//   receive breaks the tcp provider's connection.
// - isend/irecv post fi_tsend/fi_trecv with the request as context; test()
//   reads the completion queue (whoever calls it progresses every
//   connection) and reports requests done in posting order; at most
//   kMaxRequests in flight per comm, NULL requests beyond (or when the
//   provider says -FI_EAGAIN).
// - Memory: every buffer is registered with fi_mr_reg (bound to the endpoint
//   when the provider asks FI_MR_ENDPOINT) and passed with its descriptor.
//   Registrations are cached per process: a range inside one registered
//   before takes a reference on it and costs no call into libfabric. Host
//   memory only.
// - Peer failure: an error completion of a connection's operation fails the
//   connection. A process that died is noticed through its liveness socket
//   (see Peer below); test() and isend of its connections then return
//   ncclRemoteError.
// - Close. A send comm whose messages all completed sends a "bye" carrying
//   how many data messages it sent; the receiving process answers with an
//   ack once its receive comm has taken that many, or at once when the
//   receive comm is closed. Until the ack (or the peer's failure), the
//   closing comm stays in the process and later progress finishes it; at
//   exit the plugin's destructor progresses for at most kCloseTimeoutSec, so
//   that a process that closes and exits at once does not take its last
//   messages with it. A comm closed with requests in flight (an abort)
//   cancels its receives and waits up to kCloseTimeoutSec for its operations
//   to end, so that nothing writes into the caller's buffers after the
//   close.
// - Interfaces: tutti's "ifname" option (tuttiNetSetOption; loopback when
//   every rank is on one host), else NCCL_SOCKET_IFNAME, picks the interface
//   of the liveness socket and of socket-based providers (tcp, sockets, udp):
//   the fabric's domain must be that interface, and FI_TCP_IFACE is set to
//   it unless it is set already. Providers of other kinds (verbs, efa, shm)
//   are not filtered. Without FI_PROVIDER, shm is passed over: it reaches
//   one host only.
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_tagged.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "transports/ncclnet/net_abi.h"
#include "transports/netplugin/plugin_support.h"

namespace {

using namespace tutti::transport::ncclnet;
using namespace tutti::transport::netplugin;

#define OFI_WARN(...) TUTTI_NETPLUGIN_LOG(kNetLogWarn, __VA_ARGS__)
#define OFI_INFO(...) TUTTI_NETPLUGIN_LOG(kNetLogInfo, __VA_ARGS__)

// ---- constants ---------------------------------------------------------------------

constexpr uint32_t kHandleMagic = 0x4f464948u;  // "OFIH"
constexpr uint32_t kCommMagic = 0x4f464943u;    // "OFIC"
constexpr uint32_t kListenMagic = 0x4f46494cu;  // "OFIL"
constexpr uint32_t kMrMagic = 0x4f46494du;      // "OFIM"

constexpr int kMaxRequests = 32;
constexpr double kCloseTimeoutSec = 2.0;
constexpr double kLivenessCheckSec = 0.1;  // how often the liveness sockets are polled
constexpr double kGoneGraceSec = 0.5;       // a gone peer's last messages may still arrive
constexpr size_t kMaxAddrBytes = 96;  // what fits the handle beside its header

// ---- tags ----------------------------------------------------------------------------

// What a message is (bits 56-59). Every receive is posted with an exact tag:
// libfabric 1.17's shm provider matches a message that arrived before its
// receive against the receive's tag without the receive's ignore bits, so a
// wildcard receive would never take a control message that came early.
enum Kind : uint64_t {
  kData = 0,
  kHello = 1,
  kBye = 2,     // closing send comm -> receive comm
  kAck = 3,     // -> send comm: the bye was answered
  kCredit = 4,  // -> send comm: receives posted (a count)
};
constexpr int kKindShift = 56;
constexpr uint32_t kMaxId = 0xffffff;

uint64_t makeTag(uint64_t kind, uint32_t id, uint32_t low = 0) {
  return (kind << kKindShift) | (static_cast<uint64_t>(id & kMaxId) << 32) | low;
}

// ---- wire formats --------------------------------------------------------------------

// A process: a random id of this run of it (an endpoint name or a port may be
// reused by a later process), its liveness socket, its endpoint name.
struct WireProc {
  uint64_t incarnation;
  uint32_t liveIp;    // network order
  uint16_t livePort;  // network order
  uint16_t addrLen;
  uint8_t addr[kMaxAddrBytes];
};

struct WireHandle {
  uint32_t magic;
  uint32_t id;    // the receive comm's id
  WireProc proc;  // the listening process
};
static_assert(sizeof(WireHandle) <= kHandleBytes, "handle fits NCCL_NET_HANDLE_MAXSIZE");

// The payload of a hello (connect -> accept) and of a bye (closing send comm
// -> the receiving process): the sender's comm id and process.
struct WireFrom {
  uint32_t id;
  uint32_t pad;
  uint64_t sent;  // bye: data messages the send comm sent
  WireProc proc;
};
constexpr size_t kControlBytes = sizeof(WireFrom);

// Whether a received WireFrom of `len` bytes is whole.
bool wholeFrom(const WireFrom& f, size_t len) {
  return len >= offsetof(WireFrom, proc.addr) && f.proc.addrLen > 0 &&
         f.proc.addrLen <= kMaxAddrBytes && len >= offsetof(WireFrom, proc.addr) + f.proc.addrLen;
}

// ---- the process's fabric --------------------------------------------------------------

pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;  // guards everything below

struct Lock {
  Lock() { pthread_mutex_lock(&g_mu); }
  ~Lock() { pthread_mutex_unlock(&g_mu); }
  Lock(const Lock&) = delete;
  Lock& operator=(const Lock&) = delete;
};

fi_info* g_info = nullptr;  // the chosen entry (owns the list it came from)
fi_info* g_infoList = nullptr;
fid_fabric* g_fabric = nullptr;
fid_domain* g_domain = nullptr;
fid_av* g_av = nullptr;
fid_cq* g_cq = nullptr;
fid_ep* g_ep = nullptr;
bool g_ready = false;
bool g_initFailed = false;
char g_provName[64] = "";
int g_speedMbps = 10000;
uint32_t g_nextId = 0;

char g_devName[] = "ofi";

// The peer processes: one fi_addr per endpoint name, and a liveness socket.
//
// A receive posted on an RDM endpoint waits for any sender, and libfabric's
// tcp provider (through rxm) answers a send to a process that is gone with
// -FI_EAGAIN for ever (it tries to connect again), which a busy peer's full
// socket also gives: neither says that a peer died. So every process listens
// on a TCP socket of its own (its address travels in the handle and the
// hello) and connects once to each peer process's: the operating system
// closes a process's sockets when it dies, and the closed connection is the
// news (within kLivenessCheckSec, on every host the process could reach).
// The sockets carry no data.
struct Peer {
  Peer* next;
  fi_addr_t fiAddr;
  WireProc proc;
  int liveFd;
  bool connecting;
  bool gone;
  double goneSince;
};
Peer* g_peers = nullptr;

int g_liveListen = -1;
WireProc g_self{};  // this process, as peers see it (complete after init)
double g_lastLivenessCheck = 0;

// Connections accepted on the liveness socket: held open, read until closed.
struct Held {
  Held* next;
  int fd;
};
Held* g_held = nullptr;

NetResult openLiveness(const Interface& itf) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  sockaddr_in sa = itf.addr;
  sa.sin_port = 0;
  socklen_t len = sizeof(sa);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 ||
      listen(fd, 128) != 0 || getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    OFI_WARN("ofi: the liveness socket on %s (%s): %s", itf.addrStr, itf.name,
             std::strerror(errno));
    if (fd >= 0) close(fd);
    return kNetSystemError;
  }
  g_liveListen = fd;
  g_self.liveIp = sa.sin_addr.s_addr;
  g_self.livePort = sa.sin_port;
  return kNetSuccess;
}

void markGone(Peer* p) {
  if (p->gone) return;
  p->gone = true;
  p->goneSince = nowSec();
  if (p->liveFd >= 0) close(p->liveFd);
  p->liveFd = -1;
}

void startLiveness(Peer* p) {
  if (p->liveFd >= 0 || p->gone || p->proc.livePort == 0) return;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return;  // no check for this peer; its transport's errors remain
  sockaddr_in sa;
  std::memset(&sa, 0, sizeof(sa));
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = p->proc.liveIp;
  sa.sin_port = p->proc.livePort;
  if (connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) == 0) {
    p->liveFd = fd;
  } else if (errno == EINPROGRESS) {
    p->liveFd = fd;
    p->connecting = true;
  } else {
    close(fd);
    markGone(p);  // refused: nothing listens there any more
  }
}

// Accepts and drains what comes in on the liveness socket; notices peers
// whose connection closed. At most every kLivenessCheckSec.
void checkLiveness() {
  const double now = nowSec();
  if (g_liveListen < 0 || now - g_lastLivenessCheck < kLivenessCheckSec) return;
  g_lastLivenessCheck = now;
  for (;;) {
    int fd = accept4(g_liveListen, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) break;
    Held* h = new Held();
    h->fd = fd;
    h->next = g_held;
    g_held = h;
  }
  char scratch[64];
  for (Held** hp = &g_held; *hp != nullptr;) {
    Held* h = *hp;
    ssize_t n = recv(h->fd, scratch, sizeof(scratch), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      close(h->fd);
      *hp = h->next;
      delete h;
      continue;
    }
    hp = &h->next;
  }
  for (Peer* p = g_peers; p != nullptr; p = p->next) {
    if (p->liveFd < 0) continue;
    pollfd pfd{p->liveFd, static_cast<short>(POLLIN | POLLRDHUP | (p->connecting ? POLLOUT : 0)), 0};
    if (poll(&pfd, 1, 0) <= 0) continue;
    if (p->connecting && (pfd.revents & (POLLOUT | POLLERR | POLLHUP)) != 0) {
      int err = 0;
      socklen_t len = sizeof(err);
      getsockopt(p->liveFd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) {
        markGone(p);
        continue;
      }
      p->connecting = false;
    }
    if ((pfd.revents & (POLLERR | POLLHUP | POLLRDHUP)) != 0) {
      markGone(p);
      continue;
    }
    if ((pfd.revents & POLLIN) != 0) {
      ssize_t n = recv(p->liveFd, scratch, sizeof(scratch), MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
        markGone(p);
    }
  }
}

uint32_t newId() {
  g_nextId = (g_nextId + 1) & kMaxId;
  if (g_nextId == 0) g_nextId = 1;
  return g_nextId;
}

const char* fiErr(int err) { return fi_strerror(err < 0 ? -err : err); }

bool sameName(const WireProc& a, const WireProc& b) {
  return a.addrLen == b.addrLen && std::memcmp(a.addr, b.addr, a.addrLen) == 0;
}

// The peer process `w` describes: found, or made (its endpoint name inserted
// into the address vector once, whichever process had it before).
NetResult peerOf(const WireProc& w, Peer** out) {
  fi_addr_t fa = FI_ADDR_NOTAVAIL;
  for (Peer* p = g_peers; p != nullptr; p = p->next) {
    if (!sameName(p->proc, w)) continue;
    if (p->proc.incarnation == w.incarnation) {
      *out = p;
      return kNetSuccess;
    }
    fa = p->fiAddr;
  }
  if (fa == FI_ADDR_NOTAVAIL) {
    int n = fi_av_insert(g_av, w.addr, 1, &fa, 0, nullptr);
    if (n != 1) {
      OFI_WARN("ofi: inserting a peer's address (%u bytes) into the address vector failed: %s",
               static_cast<unsigned>(w.addrLen), n < 0 ? fiErr(n) : "not inserted");
      return kNetRemoteError;
    }
  }
  Peer* p = new Peer();
  std::memset(static_cast<void*>(p), 0, sizeof(*p));
  p->fiAddr = fa;
  p->proc = w;
  p->liveFd = -1;
  p->next = g_peers;
  g_peers = p;
  startLiveness(p);
  *out = p;
  return kNetSuccess;
}

// ---- operations -----------------------------------------------------------------------

struct Comm;
struct ListenComm;

// Everything posted to libfabric; its context is `ctx` (first member: the
// completion's op_context is the Op).
struct Op {
  fi_context2 ctx;
  enum Role : uint8_t { kDataOp, kHelloRecv, kHelloSend, kControlRecv, kControlSend } role;
  uint8_t kind;  // control messages: what it is (Kind)
  bool complete;
  bool failed;
  bool orphan;                 // its owner closed; freed when it ends
  int err;                     // the provider's error (positive errno), when failed
  Comm* comm;                  // its connection (data, hello, credit, bye, ack)
  ListenComm* listen;          // hello receive
  uint64_t seq;                // posting order on its comm
  size_t size;                 // send: bytes; recv: capacity
  size_t length;               // recv: bytes received
  uint8_t buf[kControlBytes];  // control payloads
};

struct Comm {
  uint32_t magic;
  bool isSend;
  bool failed;
  bool warned;
  bool closing;  // a send comm waiting for the ack of its bye
  bool gone;     // failed because the peer's process is gone
  int err;
  uint32_t localId;   // send: its own id; receive: the id in its data tags
  uint32_t remoteId;  // send: the receive comm's; receive: the send comm's
  fi_addr_t peer;
  Peer* proc;  // the peer's process
  int live;
  uint64_t nextSeq;
  uint64_t messages;  // send: data messages posted; receive: data messages received
  uint64_t byeWants;  // receive: a bye arrived, acknowledge after this many messages
  // Flow control: a send comm sends only into receives its peer has posted
  // (`granted`, the peer's count of receives posted, against `messages`); a
  // receive comm tells its sender each time it posted more (`posted`, of
  // which `advertised` were told), one credit message in flight at a time.
  // The credit also carries the smallest receive posted (`smallest`), and a
  // send comm refuses a message larger than that (`peerSmallest`): a
  // message that does not fit its receive breaks the provider's connection
  // (the tcp provider), which every comm between the two processes shares.
  uint64_t granted;
  uint64_t posted;
  uint64_t advertised;
  uint64_t smallest;
  uint64_t peerSmallest;
  Op* credit;  // receive comm: the credit in flight
  bool byePending;
  Op* reqs[kMaxRequests];
  Op* hello;  // send comm: the hello in flight until connect hands it out
  Op* bye;    // closing send comm: its bye
  double closeDeadline;
  // The control messages a comm receives, each posted with its exact tag and
  // reposted when taken: a send comm's credits and (closing) ack; a
  // receive comm's bye.
  Op* creditRecv;
  Op* ackRecv;
  Op* byeRecv;
  Comm* next;  // g_comms
};

Comm* g_comms = nullptr;  // every comm, closing send comms included

struct ListenComm {
  uint32_t magic;
  uint32_t id;
  Op* hello;  // the posted receive of the hello
  bool accepted;
  NetResult error;
};

struct Region {
  Region* next;
  uintptr_t base;
  size_t size;
  fid_mr* mr;
  int refs;
};
Region* g_regions = nullptr;

struct MemHandle {
  uint32_t magic;
  Comm* comm;
  Region* region;
};

Op* newOp(Op::Role role) {
  Op* op = new Op();
  std::memset(static_cast<void*>(op), 0, sizeof(*op));
  op->role = role;
  return op;
}

// A hello or a bye of send comm c: its id, `sent` and this process.
Op* newFromOp(Op::Role role, Comm* c, uint64_t sent) {
  Op* op = newOp(role);
  op->comm = c;
  WireFrom from;
  std::memset(&from, 0, sizeof(from));
  from.id = c->localId;
  from.sent = sent;
  from.proc = g_self;
  std::memcpy(op->buf, &from, sizeof(from));
  return op;
}

void unlinkComm(Comm* c) {
  for (Comm** pp = &g_comms; *pp != nullptr; pp = &(*pp)->next) {
    if (*pp == c) {
      *pp = c->next;
      return;
    }
  }
}

// Posts a send of `len` bytes of op->buf (or of `data`) with `tag`.
ssize_t postSend(Op* op, const void* data, size_t len, void* desc, fi_addr_t to, uint64_t tag) {
  return fi_tsend(g_ep, data, len, desc, to, tag, &op->ctx);
}

ssize_t postRecv(Op* op, void* data, size_t len, void* desc, uint64_t tag) {
  return fi_trecv(g_ep, data, len, desc, FI_ADDR_UNSPEC, tag, 0, &op->ctx);
}

// Posts (or reposts) c's receive of control messages of `kind`.
NetResult postControlRecv(Comm* c, Op** slot, Kind kind) {
  Op* op = *slot;
  if (op == nullptr) {
    op = newOp(Op::kControlRecv);
    op->comm = c;
    op->kind = static_cast<uint8_t>(kind);
  }
  op->complete = false;
  ssize_t rc = postRecv(op, op->buf, sizeof(op->buf), nullptr, makeTag(kind, c->localId));
  if (rc != 0) {
    OFI_WARN("ofi: posting the receive of a control message failed: %s",
             fiErr(static_cast<int>(rc)));
    delete op;
    *slot = nullptr;
    return kNetInternalError;
  }
  *slot = op;
  return kNetSuccess;
}

// Frees a comm. Its control sends still in flight are freed when they end;
// its control receives are cancelled, except a receive comm's bye: a sender
// that closes after this comm still gets its answer.
void freeComm(Comm* c) {
  Op** sends[] = {&c->bye, &c->hello, &c->credit};
  for (Op** op : sends) {
    if (*op != nullptr) (*op)->orphan = true;
    *op = nullptr;
  }
  Op** recvs[] = {&c->creditRecv, &c->ackRecv, &c->byeRecv};
  for (Op** op : recvs) {
    if (*op == nullptr) continue;
    (*op)->orphan = true;
    (*op)->comm = nullptr;
    if (op != &c->byeRecv) fi_cancel(&g_ep->fid, &(*op)->ctx);
    *op = nullptr;
  }
  unlinkComm(c);
  c->magic = 0;
  delete c;
}

void sendAck(fi_addr_t to, uint32_t sendId) {
  Op* op = newOp(Op::kControlSend);
  op->orphan = true;  // nobody waits for it
  ssize_t rc = postSend(op, nullptr, 0, nullptr, to, makeTag(kAck, sendId));
  if (rc != 0) {
    OFI_INFO("ofi: acknowledging a peer's close failed: %s", fiErr(static_cast<int>(rc)));
    delete op;
  }
}

// A receive comm tells its sender how many receives it has posted (in
// total), when that grew since it last said so and no word is in flight.
// Credits go in batches: only once the sender may have used half of what it
// was told (of the receives posted and not yet taken), so that a stream of
// messages costs one credit per half window rather than one each.
void maybeCredit(Comm* c) {
  if (c->isSend || c->failed || c->credit != nullptr || c->posted == c->advertised) return;
  const uint64_t window = c->posted - c->messages;    // receives posted, not yet taken
  const uint64_t left = c->advertised - c->messages;  // of them, what the sender knows of
  if (2 * left > window) return;
  Op* op = newOp(Op::kControlSend);
  op->comm = c;
  const uint64_t credit[2] = {c->posted, c->smallest};
  std::memcpy(op->buf, credit, sizeof(credit));
  if (postSend(op, op->buf, sizeof(credit), nullptr, c->peer, makeTag(kCredit, c->remoteId)) != 0) {
    delete op;  // told with the next receive posted or test()
    return;
  }
  c->advertised = c->posted;
  c->credit = op;
}

// A receive comm acknowledges its sender's bye once it has taken every
// message the bye counts.
void maybeAck(Comm* c) {
  if (!c->byePending || c->messages < c->byeWants) return;
  c->byePending = false;
  sendAck(c->peer, c->remoteId);
}

void failComm(Comm* c, int err) {
  if (c->failed) return;
  c->failed = true;
  c->err = err;
}

// A bye arrived for a receive comm that was closed: answer at once (it
// wants nothing more); the bye says where to.
void answerOrphanBye(const Op* op) {
  WireFrom from;
  std::memset(&from, 0, sizeof(from));
  std::memcpy(&from, op->buf, op->length < sizeof(from) ? op->length : sizeof(from));
  if (!wholeFrom(from, op->length)) {
    OFI_WARN("ofi: a malformed bye (%zu bytes)", op->length);
    return;
  }
  Peer* to = nullptr;
  if (peerOf(from.proc, &to) == kNetSuccess) sendAck(to->fiAddr, from.id);
}

// A control message of comm c arrived: a credit (more receives posted), a
// bye (answer once every message it counts was taken), an ack (a closing
// send comm is done).
void onControl(Comm* c, Op* op) {
  switch (op->kind) {
    case kCredit: {
      uint64_t credit[2] = {0, 0};
      if (op->length == sizeof(credit)) std::memcpy(credit, op->buf, sizeof(credit));
      if (credit[0] > c->granted) {
        c->granted = credit[0];
        c->peerSmallest = credit[1];
      }
      postControlRecv(c, &c->creditRecv, kCredit);
      break;
    }
    case kBye: {
      WireFrom from;
      std::memset(&from, 0, sizeof(from));
      std::memcpy(&from, op->buf, op->length < sizeof(from) ? op->length : sizeof(from));
      c->byeRecv = nullptr;
      delete op;
      c->byeWants = from.sent;
      c->byePending = true;
      maybeAck(c);
      break;
    }
    case kAck:
      c->ackRecv = nullptr;
      delete op;
      if (c->closing) freeComm(c);
      break;
  }
}

// An operation ended (err == 0: with success).
void onComplete(Op* op, size_t len, int err) {
  op->complete = true;
  op->length = len;
  if (err != 0) {
    op->failed = true;
    op->err = err;
  }
  if (op->orphan) {
    if (op->role == Op::kControlRecv && op->kind == kBye && err == 0) answerOrphanBye(op);
    delete op;
    return;
  }
  switch (op->role) {
    case Op::kDataOp:
      if (err == 0) {
        if (!op->comm->isSend) {
          ++op->comm->messages;
          maybeAck(op->comm);
        }
      } else if (err != FI_ECANCELED && err != FI_ETRUNC) {
        failComm(op->comm, err);
      }
      break;
    case Op::kHelloRecv:
    case Op::kHelloSend:
      break;  // accept() and connect() look
    case Op::kControlRecv:
      if (err == 0) {
        onControl(op->comm, op);
      } else if (err != FI_ECANCELED) {
        failComm(op->comm, err);
      }
      break;
    case Op::kControlSend: {
      Comm* c = op->comm;
      if (c->credit == op) {
        c->credit = nullptr;
        if (err != 0) {
          failComm(c, err);
        } else {
          maybeCredit(c);
        }
      } else if (c->bye == op) {
        c->bye = nullptr;
        if (err != 0) freeComm(c);  // the peer is gone: nothing to wait for
      }
      delete op;
      break;
    }
  }
}

// Closing send comms whose peer did not answer within kCloseTimeoutSec.
// At most every kLivenessCheckSec (progress runs often).
void expireCloses() {
  static double last = 0;
  const double now = nowSec();
  if (now - last < kLivenessCheckSec) return;
  last = now;
  for (Comm* c = g_comms; c != nullptr;) {
    Comm* next = c->next;
    if (c->closing && now > c->closeDeadline) {
      OFI_INFO("ofi: the peer did not answer the close of a connection within %.0f s",
               kCloseTimeoutSec);
      freeComm(c);
    }
    c = next;
  }
}

// Reads the completion queue dry (bounded): every connection progresses.
void progress() {
  if (!g_ready) return;
  expireCloses();
  fi_cq_tagged_entry entries[16];
  for (int round = 0; round < 8; ++round) {
    ssize_t n = fi_cq_read(g_cq, entries, 16);
    if (n > 0) {
      for (ssize_t i = 0; i < n; ++i) {
        Op* op = static_cast<Op*>(entries[i].op_context);
        if (op != nullptr) onComplete(op, entries[i].len, 0);
      }
      if (n < 16) return;
      continue;
    }
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry e;
      std::memset(&e, 0, sizeof(e));
      if (fi_cq_readerr(g_cq, &e, 0) <= 0) return;
      Op* op = static_cast<Op*>(e.op_context);
      if (op == nullptr) {
        OFI_WARN("ofi: an error without an operation: %s", fiErr(e.err));
        continue;
      }
      if (e.err != FI_ECANCELED && e.err != FI_ETRUNC && !op->orphan)
        OFI_INFO("ofi: an operation failed: %s (%s)", fiErr(e.err),
                 fi_cq_strerror(g_cq, e.prov_errno, e.err_data, nullptr, 0));
      onComplete(op, e.len, e.err == 0 ? FI_EIO : e.err);
      continue;
    }
    return;  // -FI_EAGAIN or an error of the queue itself
  }
}

// Progresses until `done` or the deadline.
template <typename Done>
void progressUntil(Done done, double seconds) {
  const double deadline = nowSec() + seconds;
  while (!done() && nowSec() < deadline) {
    progress();
    if (done()) return;
    pthread_mutex_unlock(&g_mu);
    sleepMicros(50);
    pthread_mutex_lock(&g_mu);
  }
}

// ---- init ---------------------------------------------------------------------------

bool socketProvider(const fi_info* fi) {
  const char* p = fi->fabric_attr->prov_name;
  return std::strstr(p, "tcp") != nullptr || std::strstr(p, "sockets") != nullptr ||
         std::strstr(p, "udp") != nullptr;
}

// The entry to use: the first that FI_PROVIDER (libfabric applied it) and the
// interface allow; shm only when FI_PROVIDER asks for it.
fi_info* chooseInfo(fi_info* list, const char* ifname) {
  const char* forced = std::getenv("FI_PROVIDER");
  for (int pass = 0; pass < 2; ++pass) {
    for (fi_info* fi = list; fi != nullptr; fi = fi->next) {
      const char* prov = fi->fabric_attr->prov_name;
      if ((forced == nullptr || *forced == '\0') && std::strcmp(prov, "shm") == 0) continue;
      if (ifname != nullptr && socketProvider(fi) &&
          std::strcmp(fi->domain_attr->name, ifname) != 0)
        continue;
      // IPv4 first (tutti's TCP and the bootstrap speak IPv4).
      if (pass == 0 && socketProvider(fi) && fi->addr_format != FI_SOCKADDR_IN) continue;
      return fi;
    }
  }
  return nullptr;
}

NetResult openFabric(fi_info* fi) {
  int rc = fi_fabric(fi->fabric_attr, &g_fabric, nullptr);
  if (rc == 0) rc = fi_domain(g_fabric, fi, &g_domain, nullptr);
  if (rc != 0) {
    OFI_WARN("ofi: opening the fabric or domain of %s failed: %s", fi->fabric_attr->prov_name,
             fiErr(rc));
    return kNetInternalError;
  }
  fi_cq_attr cqAttr;
  std::memset(&cqAttr, 0, sizeof(cqAttr));
  cqAttr.format = FI_CQ_FORMAT_TAGGED;
  cqAttr.wait_obj = FI_WAIT_NONE;
  rc = fi_cq_open(g_domain, &cqAttr, &g_cq, nullptr);
  fi_av_attr avAttr;
  std::memset(&avAttr, 0, sizeof(avAttr));
  avAttr.type = fi->domain_attr->av_type != FI_AV_UNSPEC ? fi->domain_attr->av_type : FI_AV_TABLE;
  if (rc == 0) rc = fi_av_open(g_domain, &avAttr, &g_av, nullptr);
  if (rc == 0) rc = fi_endpoint(g_domain, fi, &g_ep, nullptr);
  if (rc == 0) rc = fi_ep_bind(g_ep, &g_av->fid, 0);
  if (rc == 0) rc = fi_ep_bind(g_ep, &g_cq->fid, FI_TRANSMIT | FI_RECV);
  if (rc == 0) rc = fi_enable(g_ep);
  if (rc != 0) {
    OFI_WARN("ofi: opening an endpoint of %s failed: %s", fi->fabric_attr->prov_name, fiErr(rc));
    return kNetInternalError;
  }
  size_t len = sizeof(g_self.addr);
  rc = fi_getname(&g_ep->fid, g_self.addr, &len);
  if (rc != 0 || len > kMaxAddrBytes) {
    OFI_WARN("ofi: the endpoint's name (%zu bytes) %s", len,
             rc != 0 ? fiErr(rc) : "does not fit the connection handle");
    return kNetInternalError;
  }
  g_self.addrLen = static_cast<uint16_t>(len);
  g_self.incarnation = randomId();
  return kNetSuccess;
}

NetResult ofiInit(NetLogger logger) {
  setLogger(logger);
  Lock lock;
  if (g_ready) return kNetSuccess;
  if (g_initFailed) return kNetInternalError;
  g_initFailed = true;  // until it succeeded

  const char* ifSource = "";
  const char* spec = ifSpec(&ifSource);
  Interface itf{};
  const char* ifname = nullptr;
  // shm posts at most FI_SHM_RX_SIZE receives per endpoint (1024 unless
  // set): a process of many ranks posts more (one endpoint carries them all).
  setenv("FI_SHM_RX_SIZE", "8192", /*overwrite=*/0);
  // rxm over tcp sends messages beyond its eager limit (16 KiB) by
  // rendezvous: a round trip per message, which on a loaded link waits
  // behind the data going the other way (a 64 MiB all-reduce between two
  // nodes at 1 Gbit/s ran at 0.58x tutti's TCP). The receives are always
  // posted before a message is sent (the credits), so eager costs nothing
  // extra: up to 8 MiB, tutti's messages for NCCL_BUFFSIZE up to 64 MiB.
  // (rxm takes this only over tcp.)
  setenv("FI_OFI_RXM_EAGER_LIMIT", "8388608", /*overwrite=*/0);
  // The interface: the liveness socket's, and the socket providers' when
  // one is asked for.
  NetResult r = chooseInterface("ofi", spec, &itf);
  if (r != kNetSuccess) return r;
  if (spec != nullptr) {
    ifname = itf.name;
    // libfabric's tcp provider reads this when it is first used, just below.
    setenv("FI_TCP_IFACE", ifname, /*overwrite=*/0);
  }
  r = openLiveness(itf);
  if (r != kNetSuccess) return r;

  fi_info* hints = fi_allocinfo();
  if (hints == nullptr) return kNetSystemError;
  hints->caps = FI_TAGGED;
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->ep_attr->type = FI_EP_RDM;
  hints->tx_attr->msg_order = FI_ORDER_SAS;
  hints->rx_attr->msg_order = FI_ORDER_SAS;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  hints->domain_attr->mr_mode =
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  int rc = fi_getinfo(FI_VERSION(1, 9), nullptr, nullptr, 0, hints, &g_infoList);
  fi_freeinfo(hints);
  if (rc != 0 || g_infoList == nullptr) {
    const char* forced = std::getenv("FI_PROVIDER");
    OFI_WARN("ofi: libfabric %u.%u has no provider for reliable tagged messages%s%s: %s",
             FI_MAJOR(fi_version()), FI_MINOR(fi_version()), forced ? " with FI_PROVIDER=" : "",
             forced ? forced : "", fiErr(rc != 0 ? rc : FI_ENODATA));
    return kNetInternalError;
  }
  g_info = chooseInfo(g_infoList, ifname);
  if (g_info == nullptr) {
    OFI_WARN("ofi: no libfabric provider of reliable tagged messages on interface %s (%s%s)%s",
             ifname != nullptr ? ifname : "(any)", ifSource, spec != nullptr ? spec : "",
             " (set FI_PROVIDER to use shm, which reaches one host only)");
    return kNetInternalError;
  }
  r = openFabric(g_info);
  if (r != kNetSuccess) return r;
  std::snprintf(g_provName, sizeof(g_provName), "%s", g_info->fabric_attr->prov_name);
  if (g_info->nic != nullptr && g_info->nic->link_attr != nullptr &&
      g_info->nic->link_attr->speed > 0)
    g_speedMbps = static_cast<int>(g_info->nic->link_attr->speed / 1000000);
  g_ready = true;
  g_initFailed = false;
  if (spec != nullptr) {
    OFI_INFO(
        "ofi: init, libfabric %u.%u; provider %s, fabric %s, domain %s (interface %s from %s%s)",
        FI_MAJOR(fi_version()), FI_MINOR(fi_version()), g_provName, g_info->fabric_attr->name,
        g_info->domain_attr->name, ifname, ifSource, spec);
  } else {
    OFI_INFO("ofi: init, libfabric %u.%u; provider %s, fabric %s, domain %s",
             FI_MAJOR(fi_version()), FI_MINOR(fi_version()), g_provName, g_info->fabric_attr->name,
             g_info->domain_attr->name);
  }
  return kNetSuccess;
}

NetResult ofiDevices(int* ndev) {
  if (ndev == nullptr) return kNetInvalidArgument;
  *ndev = 1;
  return kNetSuccess;
}

template <typename Props>
NetResult fillProperties(int dev, Props* props) {
  if (props == nullptr || dev != 0) return kNetInvalidArgument;
  std::memset(props, 0, sizeof(*props));
  props->name = g_devName;
  props->ptrSupport = kPtrHost;
  props->speed = g_speedMbps;
  props->port = 1;
  props->maxComms = 65536;
  props->maxRecvs = 1;
  return kNetSuccess;
}

NetResult ofiGetPropertiesV8(int dev, NetPropertiesV8* props) { return fillProperties(dev, props); }

NetResult ofiGetPropertiesV9(int dev, NetPropertiesV9* props) {
  NetResult r = fillProperties(dev, props);
  if (r != kNetSuccess) return r;
  props->vProps.ndevs = 1;
  props->vProps.devs[0] = 0;
  props->maxP2pBytes = static_cast<size_t>(INT32_MAX);
  props->maxCollBytes = static_cast<size_t>(INT32_MAX);
  return kNetSuccess;
}

bool ready(const char* what) {
  if (g_ready) return true;
  OFI_WARN("ofi: %s before init", what);
  return false;
}

Comm* newComm(bool isSend) {
  Comm* c = new Comm();
  std::memset(static_cast<void*>(c), 0, sizeof(*c));
  c->magic = kCommMagic;
  c->isSend = isSend;
  c->smallest = UINT64_MAX;
  c->next = g_comms;
  g_comms = c;
  return c;
}

// ---- listen / connect / accept -------------------------------------------------------

NetResult ofiListen(int dev, void* handle, void** listenComm) {
  if (handle == nullptr || listenComm == nullptr) return kNetInvalidArgument;
  *listenComm = nullptr;
  if (dev != 0) {
    OFI_WARN("ofi: listen on device %d of 1", dev);
    return kNetInvalidArgument;
  }
  Lock lock;
  if (!ready("listen")) return kNetInternalError;
  ListenComm* l = new ListenComm();
  std::memset(static_cast<void*>(l), 0, sizeof(*l));
  l->magic = kListenMagic;
  l->id = newId();
  l->hello = newOp(Op::kHelloRecv);
  l->hello->listen = l;
  ssize_t rc =
      postRecv(l->hello, l->hello->buf, sizeof(l->hello->buf), nullptr, makeTag(kHello, l->id));
  if (rc != 0) {
    OFI_WARN("ofi: listen: posting the hello receive failed: %s", fiErr(static_cast<int>(rc)));
    delete l->hello;
    delete l;
    return kNetInternalError;
  }
  WireHandle h;
  std::memset(&h, 0, sizeof(h));
  h.magic = kHandleMagic;
  h.id = l->id;
  h.proc = g_self;
  std::memset(handle, 0, kHandleBytes);
  std::memcpy(handle, &h, sizeof(h));
  *listenComm = l;
  return kNetSuccess;
}

NetResult ofiConnect(int dev, void* handle, void** sendComm) {
  if (handle == nullptr || sendComm == nullptr) return kNetInvalidArgument;
  *sendComm = nullptr;
  if (dev != 0) return kNetInvalidArgument;
  WireHandle h;
  std::memcpy(&h, handle, sizeof(h));
  if (h.magic != kHandleMagic || h.proc.addrLen == 0 || h.proc.addrLen > kMaxAddrBytes) {
    OFI_WARN("ofi: connect: not a handle of this plugin");
    return kNetInvalidArgument;
  }
  Lock lock;
  if (!ready("connect")) return kNetInternalError;
  // connect() is called again with the same handle until it hands out a
  // comm: the send comm in the making is found by the handle's id and peer.
  Peer* proc = nullptr;
  NetResult r = peerOf(h.proc, &proc);
  if (r != kNetSuccess) return r;
  const fi_addr_t peer = proc->fiAddr;
  Comm* c = nullptr;
  for (Comm* x = g_comms; x != nullptr; x = x->next)
    if (x->isSend && x->hello != nullptr && x->remoteId == h.id && x->peer == peer) c = x;
  if (c == nullptr) {
    c = newComm(true);
    c->localId = newId();
    c->remoteId = h.id;
    c->peer = peer;
    c->proc = proc;
    if (postControlRecv(c, &c->creditRecv, kCredit) != kNetSuccess) {
      freeComm(c);
      return kNetInternalError;
    }
    Op* op = newFromOp(Op::kHelloSend, c, 0);
    ssize_t rc = postSend(op, op->buf, sizeof(WireFrom), nullptr, peer, makeTag(kHello, h.id));
    if (rc == -FI_EAGAIN) {
      delete op;
      freeComm(c);
      progress();
      return kNetSuccess;  // call again
    }
    if (rc != 0) {
      OFI_WARN("ofi: connect: sending the hello failed: %s", fiErr(static_cast<int>(rc)));
      delete op;
      freeComm(c);
      return kNetRemoteError;
    }
    c->hello = op;
  }
  progress();
  Op* op = c->hello;
  if (!op->complete) return kNetSuccess;
  c->hello = nullptr;
  const int err = op->failed ? op->err : 0;
  delete op;
  if (err != 0) {
    OFI_WARN("ofi: connect: the listening peer could not be reached: %s (provider %s)", fiErr(err),
             g_provName);
    freeComm(c);
    return kNetRemoteError;
  }
  *sendComm = c;
  return kNetSuccess;
}

NetResult ofiAccept(void* listenComm, void** recvComm) {
  if (listenComm == nullptr || recvComm == nullptr) return kNetInvalidArgument;
  *recvComm = nullptr;
  ListenComm* l = static_cast<ListenComm*>(listenComm);
  Lock lock;
  if (l->magic != kListenMagic) {
    OFI_WARN("ofi: accept: %p is not a listen comm", listenComm);
    return kNetInvalidArgument;
  }
  if (l->accepted) {
    OFI_WARN("ofi: accept: this listen comm's connection was accepted already");
    return kNetInvalidUsage;
  }
  if (l->error != kNetSuccess) return l->error;
  progress();
  Op* op = l->hello;
  if (!op->complete) return kNetSuccess;  // nobody yet
  WireFrom from;
  std::memcpy(&from, op->buf, sizeof(from));
  if (op->failed || !wholeFrom(from, op->length)) {
    OFI_WARN("ofi: accept: bad hello from the connecting peer (%s, %zu bytes)",
             op->failed ? fiErr(op->err) : "received", op->length);
    l->error = kNetInternalError;
    return l->error;
  }
  Peer* proc = nullptr;
  NetResult r = peerOf(from.proc, &proc);
  if (r != kNetSuccess) {
    l->error = r;
    return r;
  }
  Comm* c = newComm(false);
  c->localId = l->id;
  c->remoteId = from.id;
  c->peer = proc->fiAddr;
  c->proc = proc;
  if (postControlRecv(c, &c->byeRecv, kBye) != kNetSuccess) {
    freeComm(c);
    l->error = kNetInternalError;
    return l->error;
  }
  l->accepted = true;
  *recvComm = c;
  return kNetSuccess;
}

// ---- memory registration ---------------------------------------------------------------

Comm* asComm(void* p) {
  Comm* c = static_cast<Comm*>(p);
  return (c != nullptr && c->magic == kCommMagic && !c->closing) ? c : nullptr;
}

// p as a send comm (isSend) or a receive comm, for entry point `what`; a
// WARN and nullptr when it is not one.
Comm* asComm(void* p, bool isSend, const char* what) {
  Comm* c = asComm(p);
  if (c != nullptr && c->isSend == isSend) return c;
  OFI_WARN("ofi: %s: %p is not a %s comm", what, p, isSend ? "send" : "receive");
  return nullptr;
}

NetResult ofiRegMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  if (mhandle == nullptr) return kNetInvalidArgument;
  *mhandle = nullptr;
  Lock lock;
  Comm* c = asComm(comm);
  if (c == nullptr) {
    OFI_WARN("ofi: regMr: %p is not a send or receive comm", comm);
    return kNetInvalidArgument;
  }
  if (type != kPtrHost) {
    OFI_WARN("ofi: regMr: pointer type %d not supported (host memory only)", type);
    return kNetInvalidArgument;
  }
  const uintptr_t base = reinterpret_cast<uintptr_t>(data);
  Region* reg = nullptr;
  for (Region* x = g_regions; x != nullptr && reg == nullptr; x = x->next)
    if (base >= x->base && base - x->base <= x->size && size <= x->size - (base - x->base)) reg = x;
  if (reg == nullptr) {
    // Keys matter only to providers that do not choose them (FI_MR_PROV_KEY
    // unset): each registration gets one of its own.
    static uint64_t nextKey = 0;
    fid_mr* mr = nullptr;
    int rc = fi_mr_reg(g_domain, data, size, FI_SEND | FI_RECV, 0, ++nextKey, 0, &mr, nullptr);
    if (rc == 0 && (g_info->domain_attr->mr_mode & FI_MR_ENDPOINT) != 0) {
      rc = fi_mr_bind(mr, &g_ep->fid, 0);
      if (rc == 0) rc = fi_mr_enable(mr);
    }
    if (rc != 0) {
      OFI_WARN("ofi: regMr of %p (%zu bytes) failed: %s", data, size, fiErr(rc));
      if (mr != nullptr) fi_close(&mr->fid);
      return kNetSystemError;
    }
    reg = new Region();
    reg->base = base;
    reg->size = size;
    reg->mr = mr;
    reg->next = g_regions;
    g_regions = reg;
  }
  ++reg->refs;
  MemHandle* mh = new MemHandle();
  mh->magic = kMrMagic;
  mh->comm = c;
  mh->region = reg;
  *mhandle = mh;
  return kNetSuccess;
}

NetResult ofiRegMrDmaBuf(void*, void*, size_t, int, uint64_t, int, void** mhandle) {
  if (mhandle != nullptr) *mhandle = nullptr;
  OFI_WARN("ofi: regMrDmaBuf is not supported (host memory only)");
  return kNetInternalError;
}

NetResult ofiDeregMr(void*, void* mhandle) {
  MemHandle* mh = static_cast<MemHandle*>(mhandle);
  if (mh == nullptr) return kNetSuccess;
  Lock lock;
  if (mh->magic != kMrMagic) {
    OFI_WARN("ofi: deregMr: %p is not a memory handle", mhandle);
    return kNetInvalidArgument;
  }
  Region* reg = mh->region;
  mh->magic = 0;
  delete mh;
  if (--reg->refs > 0) return kNetSuccess;
  for (Region** pp = &g_regions; *pp != nullptr; pp = &(*pp)->next) {
    if (*pp == reg) {
      *pp = reg->next;
      break;
    }
  }
  fi_close(&reg->mr->fid);
  delete reg;
  return kNetSuccess;
}

// The descriptor of [data, data+size) if it lies in mhandle's region on c.
NetResult checkRegistered(const char* what, Comm* c, void* data, size_t size, void* mhandle,
                          void** desc) {
  MemHandle* mh = static_cast<MemHandle*>(mhandle);
  if (mh == nullptr || mh->magic != kMrMagic || mh->comm != c) {
    OFI_WARN("ofi: %s: buffer %p (%zu bytes) was not registered on this comm (mhandle %p)", what,
             data, size, mhandle);
    return kNetInvalidUsage;
  }
  const Region* reg = mh->region;
  const uintptr_t p = reinterpret_cast<uintptr_t>(data);
  if (size > 0 &&
      (p < reg->base || p - reg->base > reg->size || size > reg->size - (p - reg->base))) {
    OFI_WARN("ofi: %s: buffer %p (%zu bytes) was not registered (mhandle covers %p, %zu bytes)",
             what, data, size, reinterpret_cast<void*>(reg->base), reg->size);
    return kNetInvalidUsage;
  }
  *desc = fi_mr_desc(reg->mr);
  return kNetSuccess;
}

// ---- isend / irecv / test ---------------------------------------------------------------

// Whether c's peer process is gone (its liveness connection closed) for
// longer than kGoneGraceSec, in which its last messages could still arrive:
// then c fails.
bool peerGone(Comm* c) {
  checkLiveness();
  if (c->proc == nullptr || !c->proc->gone || nowSec() - c->proc->goneSince < kGoneGraceSec)
    return false;
  if (!c->failed) {
    failComm(c, FI_ECONNRESET);
    c->gone = true;
  }
  return true;
}

NetResult failedComm(Comm* c, const char* what) {
  if (!c->warned) {
    c->warned = true;
    if (c->gone) {
      OFI_WARN("ofi: %s: the peer's process is gone (its liveness connection closed)", what);
    } else {
      OFI_WARN("ofi: %s: connection to peer failed: %s (provider %s)", what, fiErr(c->err),
               g_provName);
    }
  }
  return kNetRemoteError;
}

// A free request slot, or nullptr when kMaxRequests are in flight.
Op** takeSlot(Comm* c) {
  if (c->live >= kMaxRequests) return nullptr;
  for (Op*& slot : c->reqs)
    if (slot == nullptr) return &slot;
  return nullptr;
}

Op* startRequest(Comm* c, Op** slot, size_t size) {
  Op* op = newOp(Op::kDataOp);
  op->comm = c;
  op->seq = c->nextSeq++;
  op->size = size;
  *slot = op;
  ++c->live;
  return op;
}

void dropRequest(Comm* c, Op* op) {
  for (Op*& slot : c->reqs)
    if (slot == op) slot = nullptr;
  --c->live;
}

NetResult ofiIsend(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                   void** request) {
  if (request == nullptr) return kNetInvalidArgument;
  *request = nullptr;
  Lock lock;
  Comm* c = asComm(sendComm, true, "isend");
  if (c == nullptr) return kNetInvalidArgument;
  if (size > 0 && data == nullptr) {
    OFI_WARN("ofi: isend: bad buffer %p of %zu bytes", data, size);
    return kNetInvalidArgument;
  }
  void* desc = nullptr;
  NetResult r = checkRegistered("isend", c, data, size, mhandle, &desc);
  if (r != kNetSuccess) return r;
  if (c->failed || peerGone(c)) return failedComm(c, "isend");
  if (c->messages >= c->granted) {
    progress();                                         // a credit may be waiting
    if (c->messages >= c->granted) return kNetSuccess;  // no request: retry
  }
  if (size > c->peerSmallest) {
    OFI_WARN("ofi: isend of %zu bytes: the peer's receives take at most %llu bytes", size,
             static_cast<unsigned long long>(c->peerSmallest));
    return kNetInvalidUsage;
  }
  Op** slot = takeSlot(c);
  if (slot == nullptr) return kNetSuccess;
  Op* op = startRequest(c, slot, size);
  ssize_t rc = postSend(op, data, size, desc, c->peer,
                        makeTag(kData, c->remoteId, static_cast<uint32_t>(tag)));
  if (rc != 0) {
    dropRequest(c, op);
    --c->nextSeq;
    delete op;
    if (rc == -FI_EAGAIN) {
      progress();
      return kNetSuccess;  // no request: retry
    }
    OFI_WARN("ofi: isend of %zu bytes failed: %s", size, fiErr(static_cast<int>(rc)));
    return kNetRemoteError;
  }
  ++c->messages;
  *request = op;
  return kNetSuccess;
}

NetResult ofiIrecv(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                   void** request) {
  if (request == nullptr) return kNetInvalidArgument;
  *request = nullptr;
  Lock lock;
  Comm* c = asComm(recvComm, false, "irecv");
  if (c == nullptr) return kNetInvalidArgument;
  if (n != 1) {
    OFI_WARN("ofi: irecv: %d buffers, but maxRecvs is 1", n);
    return kNetInvalidArgument;
  }
  if (data == nullptr || sizes == nullptr || tags == nullptr || mhandles == nullptr) {
    OFI_WARN("ofi: irecv: NULL array argument");
    return kNetInvalidArgument;
  }
  const size_t size = sizes[0];
  if (size > 0 && data[0] == nullptr) {
    OFI_WARN("ofi: irecv: bad buffer %p of %zu bytes", data[0], size);
    return kNetInvalidArgument;
  }
  void* desc = nullptr;
  NetResult r = checkRegistered("irecv", c, data[0], size, mhandles[0], &desc);
  if (r != kNetSuccess) return r;
  if (c->failed) return failedComm(c, "irecv");
  Op** slot = takeSlot(c);
  if (slot == nullptr) return kNetSuccess;
  Op* op = startRequest(c, slot, size);
  ssize_t rc =
      postRecv(op, data[0], size, desc, makeTag(kData, c->localId, static_cast<uint32_t>(tags[0])));
  if (rc != 0) {
    dropRequest(c, op);
    --c->nextSeq;
    delete op;
    if (rc == -FI_EAGAIN) {
      progress();
      return kNetSuccess;
    }
    OFI_WARN("ofi: irecv of %zu bytes failed: %s", size, fiErr(static_cast<int>(rc)));
    return kNetRemoteError;
  }
  ++c->posted;
  if (size < c->smallest) c->smallest = size;
  maybeCredit(c);
  *request = op;
  return kNetSuccess;
}

NetResult ofiIflush(void*, int, void**, int*, void**, void** request) {
  if (request != nullptr) *request = nullptr;
  return kNetSuccess;
}

NetResult ofiTest(void* request, int* done, int* sizes) {
  if (request == nullptr || done == nullptr) return kNetInvalidArgument;
  *done = 0;
  Lock lock;
  Op* q = static_cast<Op*>(request);
  Comm* c = q->role == Op::kDataOp ? q->comm : nullptr;
  bool live = false;
  if (c != nullptr && c->magic == kCommMagic)
    for (Op* slot : c->reqs) live = live || slot == q;
  if (!live) {
    OFI_WARN("ofi: test: %p is not a live request", request);
    return kNetInvalidArgument;
  }
  progress();
  // Done in posting order: q only once every earlier request has completed.
  bool earlierPending = false;
  for (Op* r : c->reqs)
    if (r != nullptr && r->seq < q->seq && !r->complete) earlierPending = true;
  if (q->complete && !earlierPending) {
    if (!q->failed) {
      *done = 1;
      if (sizes != nullptr) *sizes = static_cast<int>(c->isSend ? q->size : q->length);
      dropRequest(c, q);
      delete q;
      return kNetSuccess;
    }
    if (q->err == FI_ETRUNC) {
      OFI_WARN("ofi: irecv: the message is larger than the posted buffer of %zu bytes", q->size);
      return kNetInternalError;
    }
    failComm(c, q->err);
    return failedComm(c, c->isSend ? "isend" : "irecv");
  }
  if (c->failed) return failedComm(c, c->isSend ? "isend" : "irecv");
  maybeCredit(c);
  if (peerGone(c)) return failedComm(c, c->isSend ? "isend" : "irecv");
  return kNetSuccess;
}

// ---- close ---------------------------------------------------------------------------------

// Ends the comm's operations still in flight: receives are cancelled, and
// every operation is waited for (at most kCloseTimeoutSec: beyond that, left
// to finish on its own, freed when it does).
void quiesce(Comm* c) {
  checkLiveness();
  // A gone peer's sends never end (nothing writes into their buffers).
  const bool gone = c->proc != nullptr && c->proc->gone;
  bool any = false;
  for (Op* op : c->reqs) {
    if (op == nullptr || op->complete) continue;
    any = true;
    if (!c->isSend) fi_cancel(&g_ep->fid, &op->ctx);
  }
  if (any && !(gone && c->isSend)) {
    progressUntil(
        [c] {
          for (Op* op : c->reqs)
            if (op != nullptr && !op->complete) return false;
          return true;
        },
        kCloseTimeoutSec);
  }
  for (Op*& op : c->reqs) {
    if (op == nullptr) continue;
    if (op->complete) {
      delete op;
    } else {
      if (!gone)
        OFI_WARN("ofi: closing a connection whose %s has not ended within %.0f s",
                 c->isSend ? "send" : "receive", kCloseTimeoutSec);
      op->orphan = true;
    }
    op = nullptr;
  }
  c->live = 0;
}

NetResult ofiCloseSend(void* sendComm) {
  if (sendComm == nullptr) return kNetSuccess;
  Lock lock;
  Comm* c = asComm(sendComm, true, "closeSend");
  if (c == nullptr) return kNetInvalidArgument;
  progress();
  bool pending = false;
  for (Op* op : c->reqs) pending = pending || (op != nullptr && !op->complete);
  quiesce(c);
  if (pending || c->failed || (c->proc != nullptr && c->proc->gone)) {
    freeComm(c);
    return kNetSuccess;
  }
  // The bye follows every message; the receiving process acks once its
  // receive comm took them all (or is gone).
  if (postControlRecv(c, &c->ackRecv, kAck) != kNetSuccess) {
    freeComm(c);
    return kNetSuccess;
  }
  Op* op = newFromOp(Op::kControlSend, c, c->messages);
  if (postSend(op, op->buf, sizeof(WireFrom), nullptr, c->peer, makeTag(kBye, c->remoteId)) != 0) {
    delete op;
    freeComm(c);
    return kNetSuccess;
  }
  c->bye = op;
  c->closing = true;
  c->closeDeadline = nowSec() + kCloseTimeoutSec;
  progress();
  return kNetSuccess;
}

NetResult ofiCloseRecv(void* recvComm) {
  if (recvComm == nullptr) return kNetSuccess;
  Lock lock;
  Comm* c = asComm(recvComm, false, "closeRecv");
  if (c == nullptr) return kNetInvalidArgument;
  quiesce(c);
  if (c->byePending) sendAck(c->peer, c->remoteId);  // it wants nothing more
  freeComm(c);
  return kNetSuccess;
}

NetResult ofiCloseListen(void* listenComm) {
  if (listenComm == nullptr) return kNetSuccess;
  Lock lock;
  ListenComm* l = static_cast<ListenComm*>(listenComm);
  if (l->magic != kListenMagic) {
    OFI_WARN("ofi: closeListen: %p is not a listen comm", listenComm);
    return kNetInvalidArgument;
  }
  Op* op = l->hello;
  if (op->complete) {
    delete op;
  } else {
    fi_cancel(&g_ep->fid, &op->ctx);
    op->orphan = true;  // freed by its cancellation
  }
  l->magic = 0;
  delete l;
  return kNetSuccess;
}

// At exit: closing send comms get their acks (bounded), so that a process
// that closes and exits at once still lets its peers take its last messages.
__attribute__((destructor)) void finishCloses() {
  Lock lock;
  if (!g_ready) return;
  progressUntil(
      [] {
        for (Comm* c = g_comms; c != nullptr; c = c->next)
          if (c->closing) return false;
        return true;
      },
      kCloseTimeoutSec);
}

// ---- the ABI's entry points ----------------------------------------------------------------

NetResult v8Connect(int dev, void* handle, void** sendComm, NetDeviceHandle**) {
  return ofiConnect(dev, handle, sendComm);
}
NetResult v8Accept(void* listenComm, void** recvComm, NetDeviceHandle**) {
  return ofiAccept(listenComm, recvComm);
}
NetResult v8Isend(void* sendComm, void* data, int size, int tag, void* mhandle, void** request) {
  if (size < 0) {
    OFI_WARN("ofi: isend of %d bytes", size);
    return kNetInvalidArgument;
  }
  return ofiIsend(sendComm, data, static_cast<size_t>(size), tag, mhandle, request);
}
NetResult v8Irecv(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles,
                  void** request) {
  if (n != 1 || sizes == nullptr || sizes[0] < 0) {
    OFI_WARN("ofi: irecv: %d buffers (maxRecvs is 1) of %d bytes", n, sizes ? sizes[0] : -1);
    return kNetInvalidArgument;
  }
  size_t size = static_cast<size_t>(sizes[0]);
  return ofiIrecv(recvComm, n, data, &size, tags, mhandles, request);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) NetResult tuttiNetSetOption(const char* key,
                                                                              const char* value) {
  return setOption(key, value);
}

// v9 (sizes as size_t) and v8 for loaders that know no newer table.
extern "C" __attribute__((visibility("default")))
const tutti::transport::ncclnet::NetV9 ncclNetPlugin_v9 = {
    "ofi",     ofiInit,  ofiDevices,     ofiGetPropertiesV9, ofiListen,      v8Connect,
    v8Accept,  ofiRegMr, ofiRegMrDmaBuf, ofiDeregMr,         ofiIsend,       ofiIrecv,
    ofiIflush, ofiTest,  ofiCloseSend,   ofiCloseRecv,       ofiCloseListen,
    nullptr,  // getDeviceMr
    nullptr,  // irecvConsumed
    nullptr,  // makeVDevice
};

extern "C" __attribute__((visibility("default")))
const tutti::transport::ncclnet::NetV8 ncclNetPlugin_v8 = {
    "ofi",     ofiInit,  ofiDevices,     ofiGetPropertiesV8, ofiListen,      v8Connect,
    v8Accept,  ofiRegMr, ofiRegMrDmaBuf, ofiDeregMr,         v8Isend,        v8Irecv,
    ofiIflush, ofiTest,  ofiCloseSend,   ofiCloseRecv,       ofiCloseListen,
    nullptr,  // getDeviceMr
    nullptr,  // irecvConsumed
};
