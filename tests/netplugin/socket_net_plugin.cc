// A small NCCL network plugin for tests: TCP over IPv4 loopback (or TSOCK_ADDR),
// built twice from this file, as ncclNetPlugin_v8 (TSOCK_ABI=8, "TestSock")
// and as ncclNetPlugin_v10 (TSOCK_ABI=10, "TestSock10"). It keeps the contract
// of transports/ncclnet/net_abi.h strictly, so that a caller breaking it fails:
// - connect()/accept() never block and hand out NULL comms until ready
//   (TSOCK_NULL_COMMS=N: N more NULL comms each before the ready one);
// - isend()/irecv() may return NULL requests (TSOCK_NULL_REQUESTS=1: every
//   other call; always beyond 8 requests in flight per comm);
// - every buffer must lie in a region regMr()'d on the same comm (host only);
// - progress happens only in test(), FIFO per comm; a received message larger
//   than the posted buffer or with another tag fails the comm.
// Other knobs: TSOCK_ADDR (default 127.0.0.1), TSOCK_NDEV (default 1),
// TSOCK_INIT_FAIL=1 (init fails). Wire format per message:
// [uint32 size][int32 tag][payload]; a connection starts with the 8-byte id
// of the listen handle.
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "transports/ncclnet/net_abi.h"
#include "transports/netplugin/plugin_support.h"

#if !defined(TSOCK_ABI) || (TSOCK_ABI != 8 && TSOCK_ABI != 10)
#error "build with -DTSOCK_ABI=8 or -DTSOCK_ABI=10"
#endif

namespace {

using namespace tutti::transport::ncclnet;
using tutti::transport::netplugin::randomId;

// No std containers, std::mutex or std::atomic here: their template
// instantiations over std types have default visibility and would be exported
// next to the table (at -O0, or without -fvisibility-inlines-hidden).

// ---- logging -----------------------------------------------------------------

NetLogger g_logger = nullptr;  // accessed with __atomic builtins

#define TSOCK_LOG(level, ...)                                            \
  do {                                                                   \
    NetLogger tsock_l = __atomic_load_n(&g_logger, __ATOMIC_ACQUIRE);    \
    if (tsock_l != nullptr) {                                            \
      tsock_l(level, kNetLogSubsysNet, __FILE__, __LINE__, __VA_ARGS__); \
    } else {                                                             \
      std::fprintf(stderr, "TestSock (no logger): " __VA_ARGS__);        \
      std::fputc('\n', stderr);                                          \
    }                                                                    \
  } while (0)
#define TSOCK_WARN(...) TSOCK_LOG(kNetLogWarn, __VA_ARGS__)

// ---- environment -------------------------------------------------------------

long envLong(const char* name, long dflt) {
  const char* s = std::getenv(name);
  if (s == nullptr || *s == '\0') return dflt;
  char* end = nullptr;
  long v = std::strtol(s, &end, 10);
  if (end == s) return dflt;
  return v;
}

int numDevices() {
  long n = envLong("TSOCK_NDEV", 1);
  if (n < 1) n = 1;
  if (n > 64) n = 64;
  return static_cast<int>(n);
}

int nullCommsKnob() {
  long n = envLong("TSOCK_NULL_COMMS", 0);
  if (n < 0) n = 0;
  if (n > 1000000) n = 1000000;
  return static_cast<int>(n);
}

bool nullRequestsKnob() { return envLong("TSOCK_NULL_REQUESTS", 0) != 0; }

// ---- handle --------------------------------------------------------------------

constexpr uint32_t kHandleMagic = 0x54534f4bu;  // "TSOK"
constexpr uint32_t kCommMagic = 0x54534f43u;    // "TSOC"
constexpr uint32_t kMrMagic = 0x54534f4du;      // "TSOM"

struct WireHandle {
  uint32_t magic;
  uint32_t addr;  // in_addr.s_addr, network order
  uint16_t port;  // network order
  uint16_t pad;
  uint32_t pad2;
  uint64_t id;
};
static_assert(sizeof(WireHandle) <= kHandleBytes, "handle fits NCCL_NET_HANDLE_MAXSIZE");

void setNoDelay(int fd) {
  int one = 1;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// ---- comms, requests, memory handles -------------------------------------------

constexpr int kMaxRequests = 8;
constexpr size_t kHeaderBytes = 8;

struct Comm;

struct Request {
  Comm* comm;
  bool used;
  bool done;
  uint64_t seq;  // posting order on its comm
  char* data;
  size_t size;  // send: payload bytes; recv: posted capacity
  int tag;
  unsigned char hdr[kHeaderBytes];
  size_t off;      // bytes of header + payload moved so far
  size_t msgSize;  // recv: size announced by the header
};

struct Comm {
  uint32_t magic;
  bool isSend;
  int fd;
  int dev;
  bool nullRequests;
  unsigned postCalls;
  int live;  // requests handed out and not yet reported done
  uint64_t nextPost;
  uint64_t nextProgress;
  NetResult error;  // sticky: once a comm fails, it stays failed
  Request reqs[kMaxRequests];
};

struct MemHandle {
  uint32_t magic;
  Comm* comm;
  uintptr_t base;
  size_t size;
};

Comm* newComm(bool isSend, int fd, int dev) {
  Comm* c = new Comm();
  c->magic = kCommMagic;
  c->isSend = isSend;
  c->fd = fd;
  c->dev = dev;
  c->nullRequests = nullRequestsKnob();
  c->postCalls = 0;
  c->live = 0;
  c->nextPost = 0;
  c->nextProgress = 0;
  c->error = kNetSuccess;
  for (Request& r : c->reqs) {
    r = Request();
    r.comm = c;
  }
  return c;
}

void freeComm(Comm* c) {
  if (c == nullptr) return;
  if (c->fd >= 0) close(c->fd);
  c->magic = 0;
  delete c;
}

struct ListenComm {
  uint32_t magic;
  int fd;
  int dev;
  uint64_t id;
  // The connection being accepted.
  int acceptFd;
  unsigned char hello[8];
  size_t helloGot;
  int nullLeft;
  Comm* ready;  // accepted, held back by TSOCK_NULL_COMMS
};

// Connections being made, by handle id (connect() is called again with the same
// handle until it hands out a comm).
struct PendingConnect {
  PendingConnect* next;
  uint64_t id;
  int fd;
  bool connected;
  size_t helloSent;
  unsigned char hello[8];
  int nullLeft;
};

pthread_mutex_t g_pendingMu = PTHREAD_MUTEX_INITIALIZER;
PendingConnect* g_pending = nullptr;  // guarded by g_pendingMu

PendingConnect** findPending(uint64_t id) {
  PendingConnect** pp = &g_pending;
  while (*pp != nullptr && (*pp)->id != id) pp = &(*pp)->next;
  return pp;
}

struct PendingLock {
  PendingLock() { pthread_mutex_lock(&g_pendingMu); }
  ~PendingLock() { pthread_mutex_unlock(&g_pendingMu); }
  PendingLock(const PendingLock&) = delete;
  PendingLock& operator=(const PendingLock&) = delete;
};

// ---- init / devices / properties -------------------------------------------------

char g_devName[] = "tsock";

NetResult tsockInit(NetLogger logger) {
  __atomic_store_n(&g_logger, logger, __ATOMIC_RELEASE);
  if (envLong("TSOCK_INIT_FAIL", 0) != 0) {
    TSOCK_WARN("TestSock: init failing on purpose (TSOCK_INIT_FAIL=1)");
    return kNetInternalError;
  }
  if (logger != nullptr) {
    logger(kNetLogInfo, kNetLogSubsysNet, __FILE__, __LINE__, "TestSock: init, %d device(s)",
           numDevices());
  }
  return kNetSuccess;
}

NetResult tsockDevices(int* ndev) {
  if (ndev == nullptr) return kNetInvalidArgument;
  *ndev = numDevices();
  return kNetSuccess;
}

bool validDev(int dev) { return dev >= 0 && dev < numDevices(); }

template <typename Props>
void fillCommonProps(int dev, Props* p) {
  p->name = g_devName;
  p->pciPath = nullptr;
  p->guid = static_cast<uint64_t>(dev);
  p->ptrSupport = kPtrHost;
  p->regIsGlobal = 0;
  p->speed = 10000;
  p->port = 1;
  p->latency = 0.0f;
  p->maxComms = 65536;
  p->maxRecvs = 1;
  p->netDeviceType = 0;
  p->netDeviceVersion = 0;
}

#if TSOCK_ABI == 8
NetResult tsockGetPropertiesV8(int dev, NetPropertiesV8* props) {
  if (props == nullptr || !validDev(dev)) return kNetInvalidArgument;
  std::memset(props, 0, sizeof(*props));
  fillCommonProps(dev, props);
  return kNetSuccess;
}
#else
NetResult tsockGetPropertiesV9(int dev, NetPropertiesV9* props) {
  if (props == nullptr || !validDev(dev)) return kNetInvalidArgument;
  std::memset(props, 0, sizeof(*props));
  fillCommonProps(dev, props);
  props->forceFlush = 0;
  props->vProps.ndevs = 1;
  props->vProps.devs[0] = dev;
  props->maxP2pBytes = size_t{1} << 30;
  props->maxCollBytes = size_t{1} << 30;
  return kNetSuccess;
}
#endif

// ---- listen / connect / accept ---------------------------------------------------

NetResult tsockListen(int dev, void* handle, void** listenComm) {
  if (handle == nullptr || listenComm == nullptr) return kNetInvalidArgument;
  *listenComm = nullptr;
  if (!validDev(dev)) {
    TSOCK_WARN("TestSock: listen on device %d of %d", dev, numDevices());
    return kNetInvalidArgument;
  }
  const char* addrStr = std::getenv("TSOCK_ADDR");
  if (addrStr == nullptr || *addrStr == '\0') addrStr = "127.0.0.1";
  in_addr addr{};
  if (inet_pton(AF_INET, addrStr, &addr) != 1) {
    TSOCK_WARN("TestSock: TSOCK_ADDR '%s' is not an IPv4 address", addrStr);
    return kNetInvalidArgument;
  }
  if (addr.s_addr == htonl(INADDR_ANY)) {
    TSOCK_WARN("TestSock: TSOCK_ADDR '%s' is the wildcard address; refusing to bind it", addrStr);
    return kNetInvalidArgument;
  }
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    TSOCK_WARN("TestSock: socket: %s", std::strerror(errno));
    return kNetSystemError;
  }
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr = addr;
  sa.sin_port = 0;
  socklen_t len = sizeof(sa);
  if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa)) != 0 || listen(fd, 128) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    TSOCK_WARN("TestSock: bind/listen on %s: %s", addrStr, std::strerror(errno));
    close(fd);
    return kNetSystemError;
  }
  ListenComm* l = new ListenComm();
  l->magic = kCommMagic ^ 1u;
  l->fd = fd;
  l->dev = dev;
  l->id = randomId();
  l->acceptFd = -1;
  l->helloGot = 0;
  l->nullLeft = 0;
  l->ready = nullptr;

  WireHandle h{};
  h.magic = kHandleMagic;
  h.addr = sa.sin_addr.s_addr;
  h.port = sa.sin_port;
  h.id = l->id;
  std::memset(handle, 0, kHandleBytes);
  std::memcpy(handle, &h, sizeof(h));
  *listenComm = l;
  return kNetSuccess;
}

NetResult tsockConnect(int dev, void* handle, void** sendComm) {
  if (handle == nullptr || sendComm == nullptr) return kNetInvalidArgument;
  *sendComm = nullptr;
  if (!validDev(dev)) {
    TSOCK_WARN("TestSock: connect on device %d of %d", dev, numDevices());
    return kNetInvalidArgument;
  }
  WireHandle h;
  std::memcpy(&h, handle, sizeof(h));
  if (h.magic != kHandleMagic) {
    TSOCK_WARN("TestSock: connect: handle has magic 0x%08x, not a TestSock handle", h.magic);
    return kNetInvalidArgument;
  }

  PendingLock lock;
  PendingConnect** it = findPending(h.id);
  if (*it == nullptr) {
    // First call: start the connection, hand out nothing yet.
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      TSOCK_WARN("TestSock: socket: %s", std::strerror(errno));
      return kNetSystemError;
    }
    setNoDelay(fd);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = h.addr;
    sa.sin_port = h.port;
    bool connected = false;
    int rc;
    do {
      rc = ::connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof(sa));
    } while (rc != 0 && errno == EINTR);
    if (rc == 0) {
      connected = true;
    } else if (errno != EINPROGRESS) {
      int err = errno;
      char buf[INET_ADDRSTRLEN] = "?";
      inet_ntop(AF_INET, &sa.sin_addr, buf, sizeof(buf));
      TSOCK_WARN("TestSock: connect to %s:%u: %s", buf, unsigned(ntohs(h.port)),
                 std::strerror(err));
      close(fd);
      return kNetRemoteError;
    }
    PendingConnect* p = new PendingConnect();
    p->next = nullptr;
    p->id = h.id;
    p->fd = fd;
    p->connected = connected;
    p->helloSent = 0;
    std::memcpy(p->hello, &h.id, sizeof(h.id));
    p->nullLeft = nullCommsKnob();
    *it = p;  // appended: it points at the list's last next pointer
    return kNetSuccess;
  }

  PendingConnect* p = *it;
  auto fail = [&](NetResult r) {
    *it = p->next;
    close(p->fd);
    delete p;
    return r;
  };
  if (!p->connected) {
    pollfd pfd{p->fd, POLLOUT, 0};
    int n = poll(&pfd, 1, 0);
    if (n < 0 && errno != EINTR) {
      TSOCK_WARN("TestSock: poll: %s", std::strerror(errno));
      return fail(kNetSystemError);
    }
    if (n <= 0) return kNetSuccess;  // still connecting
    int err = 0;
    socklen_t len = sizeof(err);
    if (getsockopt(p->fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err != 0) {
      TSOCK_WARN("TestSock: connect to port %u: %s", unsigned(ntohs(h.port)), std::strerror(err));
      return fail(kNetRemoteError);
    }
    p->connected = true;
  }
  while (p->helloSent < sizeof(p->hello)) {
    ssize_t k = send(p->fd, p->hello + p->helloSent, sizeof(p->hello) - p->helloSent,
                     MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return kNetSuccess;
      TSOCK_WARN("TestSock: connect: sending hello: %s", std::strerror(errno));
      return fail(kNetRemoteError);
    }
    p->helloSent += static_cast<size_t>(k);
  }
  if (p->nullLeft > 0) {  // TSOCK_NULL_COMMS: the caller must keep calling
    --p->nullLeft;
    return kNetSuccess;
  }
  Comm* c = newComm(true, p->fd, dev);
  *it = p->next;
  delete p;
  *sendComm = c;
  return kNetSuccess;
}

NetResult tsockAccept(void* listenComm, void** recvComm) {
  if (listenComm == nullptr || recvComm == nullptr) return kNetInvalidArgument;
  *recvComm = nullptr;
  ListenComm* l = static_cast<ListenComm*>(listenComm);
  if (l->magic != (kCommMagic ^ 1u)) {
    TSOCK_WARN("TestSock: accept: %p is not a listen comm", listenComm);
    return kNetInvalidArgument;
  }
  if (l->ready == nullptr) {
    if (l->acceptFd < 0) {
      int fd;
      do {
        fd = accept4(l->fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      } while (fd < 0 && errno == EINTR);
      if (fd < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED) return kNetSuccess;
        TSOCK_WARN("TestSock: accept: %s", std::strerror(errno));
        return kNetSystemError;
      }
      setNoDelay(fd);
      l->acceptFd = fd;
      l->helloGot = 0;
      l->nullLeft = nullCommsKnob();
    }
    while (l->helloGot < sizeof(l->hello)) {
      ssize_t k =
          recv(l->acceptFd, l->hello + l->helloGot, sizeof(l->hello) - l->helloGot, MSG_DONTWAIT);
      if (k < 0 && errno == EINTR) continue;
      if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return kNetSuccess;
      if (k <= 0) {
        TSOCK_WARN("TestSock: accept: connection %s before its hello",
                   k == 0 ? "closed" : std::strerror(errno));
        close(l->acceptFd);
        l->acceptFd = -1;
        return kNetRemoteError;
      }
      l->helloGot += static_cast<size_t>(k);
    }
    uint64_t id;
    std::memcpy(&id, l->hello, sizeof(id));
    l->helloGot = 0;
    int fd = l->acceptFd;
    l->acceptFd = -1;
    if (id != l->id) {
      TSOCK_WARN("TestSock: accept: hello id 0x%016llx does not match the listen id 0x%016llx",
                 static_cast<unsigned long long>(id), static_cast<unsigned long long>(l->id));
      close(fd);
      return kNetInternalError;
    }
    l->ready = newComm(false, fd, l->dev);
  }
  if (l->nullLeft > 0) {  // TSOCK_NULL_COMMS: the caller must keep calling
    --l->nullLeft;
    return kNetSuccess;
  }
  *recvComm = l->ready;
  l->ready = nullptr;
  return kNetSuccess;
}

// ---- memory registration -----------------------------------------------------------

Comm* asComm(void* p) {
  Comm* c = static_cast<Comm*>(p);
  return (c != nullptr && c->magic == kCommMagic) ? c : nullptr;
}

NetResult tsockRegMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  if (mhandle == nullptr) return kNetInvalidArgument;
  *mhandle = nullptr;
  Comm* c = asComm(comm);
  if (c == nullptr) {
    TSOCK_WARN("TestSock: regMr: %p is not a send or receive comm", comm);
    return kNetInvalidArgument;
  }
  if (type != kPtrHost) {
    TSOCK_WARN("TestSock: regMr: pointer type %d not supported (host memory only)", type);
    return kNetInvalidArgument;
  }
  MemHandle* mh = new MemHandle();
  mh->magic = kMrMagic;
  mh->comm = c;
  mh->base = reinterpret_cast<uintptr_t>(data);
  mh->size = size;
  *mhandle = mh;
  return kNetSuccess;
}

NetResult tsockRegMrDmaBuf(void*, void*, size_t, int, uint64_t, int, void** mhandle) {
  if (mhandle != nullptr) *mhandle = nullptr;
  TSOCK_WARN("TestSock: regMrDmaBuf is not supported");
  return kNetInternalError;
}

NetResult tsockDeregMr(void*, void* mhandle) {
  MemHandle* mh = static_cast<MemHandle*>(mhandle);
  if (mh == nullptr) return kNetSuccess;
  if (mh->magic != kMrMagic) {
    TSOCK_WARN("TestSock: deregMr: %p is not a memory handle", mhandle);
    return kNetInvalidArgument;
  }
  mh->magic = 0;
  delete mh;
  return kNetSuccess;
}

// Whether [data, data+size) lies in a region registered on comm c.
NetResult checkRegistered(const char* what, Comm* c, void* data, size_t size, void* mhandle) {
  MemHandle* mh = static_cast<MemHandle*>(mhandle);
  if (mh == nullptr) {
    TSOCK_WARN("TestSock: %s: buffer %p (%zu bytes) was not registered (NULL mhandle)", what, data,
               size);
    return kNetInvalidUsage;
  }
  if (mh->magic != kMrMagic) {
    TSOCK_WARN(
        "TestSock: %s: buffer %p (%zu bytes) was not registered (mhandle %p is not a "
        "memory handle)",
        what, data, size, mhandle);
    return kNetInvalidUsage;
  }
  if (mh->comm != c) {
    TSOCK_WARN(
        "TestSock: %s: buffer %p (%zu bytes) was not registered on this comm (mhandle "
        "belongs to comm %p, not %p)",
        what, data, size, static_cast<void*>(mh->comm), static_cast<void*>(c));
    return kNetInvalidUsage;
  }
  if (size == 0) return kNetSuccess;
  uintptr_t p = reinterpret_cast<uintptr_t>(data);
  if (p < mh->base || p - mh->base > mh->size || size > mh->size - (p - mh->base)) {
    TSOCK_WARN(
        "TestSock: %s: buffer %p (%zu bytes) was not registered (mhandle covers %p, %zu "
        "bytes)",
        what, data, size, reinterpret_cast<void*>(mh->base), mh->size);
    return kNetInvalidUsage;
  }
  return kNetSuccess;
}

// ---- isend / irecv ---------------------------------------------------------------------

// A free request slot, or nullptr when kMaxRequests are in flight or the
// TSOCK_NULL_REQUESTS knob says to skip this call.
Request* takeRequest(Comm* c) {
  if (c->live >= kMaxRequests) return nullptr;
  if (c->nullRequests && (c->postCalls++ % 2) == 0) return nullptr;
  for (Request& r : c->reqs) {
    if (!r.used) {
      r.used = true;
      r.done = false;
      r.seq = c->nextPost++;
      r.off = 0;
      r.msgSize = 0;
      ++c->live;
      return &r;
    }
  }
  return nullptr;
}

NetResult tsockIsend(void* sendComm, void* data, size_t size, int tag, void* mhandle,
                     void** request) {
  if (request == nullptr) return kNetInvalidArgument;
  *request = nullptr;
  Comm* c = asComm(sendComm);
  if (c == nullptr || !c->isSend) {
    TSOCK_WARN("TestSock: isend: %p is not a send comm", sendComm);
    return kNetInvalidArgument;
  }
  if (size > static_cast<size_t>(INT_MAX) || (size > 0 && data == nullptr)) {
    TSOCK_WARN("TestSock: isend: bad buffer %p of %zu bytes", data, size);
    return kNetInvalidArgument;
  }
  NetResult r = checkRegistered("isend", c, data, size, mhandle);
  if (r != kNetSuccess) return r;
  if (c->error != kNetSuccess) return c->error;
  Request* q = takeRequest(c);
  if (q == nullptr) return kNetSuccess;
  q->data = static_cast<char*>(data);
  q->size = size;
  q->tag = tag;
  uint32_t sz = static_cast<uint32_t>(size);
  int32_t tg = tag;
  std::memcpy(q->hdr, &sz, 4);
  std::memcpy(q->hdr + 4, &tg, 4);
  *request = q;
  return kNetSuccess;
}

NetResult tsockIrecv(void* recvComm, int n, void** data, const size_t* sizes, const int* tags,
                     void** mhandles, void** request) {
  if (request == nullptr) return kNetInvalidArgument;
  *request = nullptr;
  Comm* c = asComm(recvComm);
  if (c == nullptr || c->isSend) {
    TSOCK_WARN("TestSock: irecv: %p is not a receive comm", recvComm);
    return kNetInvalidArgument;
  }
  if (n != 1) {
    TSOCK_WARN("TestSock: irecv: %d buffers, but maxRecvs is 1", n);
    return kNetInvalidArgument;
  }
  if (data == nullptr || sizes == nullptr || tags == nullptr || mhandles == nullptr) {
    TSOCK_WARN("TestSock: irecv: NULL array argument");
    return kNetInvalidArgument;
  }
  size_t size = sizes[0];
  if (size > static_cast<size_t>(INT_MAX) || (size > 0 && data[0] == nullptr)) {
    TSOCK_WARN("TestSock: irecv: bad buffer %p of %zu bytes", data[0], size);
    return kNetInvalidArgument;
  }
  NetResult r = checkRegistered("irecv", c, data[0], size, mhandles[0]);
  if (r != kNetSuccess) return r;
  if (c->error != kNetSuccess) return c->error;
  Request* q = takeRequest(c);
  if (q == nullptr) return kNetSuccess;
  q->data = static_cast<char*>(data[0]);
  q->size = size;
  q->tag = tags[0];
  *request = q;
  return kNetSuccess;
}

NetResult tsockIflush(void*, int, void**, int*, void**, void** request) {
  if (request != nullptr) *request = nullptr;
  return kNetSuccess;
}

// ---- progress ----------------------------------------------------------------------------

NetResult socketFailure(Comm* c, const char* what, ssize_t k, int err) {
  if (k == 0) {
    TSOCK_WARN("TestSock: %s: peer closed the connection", what);
  } else {
    TSOCK_WARN("TestSock: %s: %s", what, std::strerror(err));
  }
  c->error = kNetRemoteError;
  return kNetRemoteError;
}

// Moves request q as far as the socket allows; *complete when all of it moved.
NetResult advanceSend(Comm* c, Request* q, bool* complete) {
  const size_t total = kHeaderBytes + q->size;
  while (q->off < total) {
    iovec iov[2];
    int niov = 0;
    if (q->off < kHeaderBytes) {
      iov[niov++] = {q->hdr + q->off, kHeaderBytes - q->off};
      if (q->size > 0) iov[niov++] = {q->data, q->size};
    } else {
      size_t done = q->off - kHeaderBytes;
      iov[niov++] = {q->data + done, q->size - done};
    }
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = static_cast<size_t>(niov);
    ssize_t k = sendmsg(c->fd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      return socketFailure(c, "send", k, errno);
    }
    q->off += static_cast<size_t>(k);
  }
  *complete = q->off >= total;
  return kNetSuccess;
}

NetResult advanceRecv(Comm* c, Request* q, bool* complete) {
  *complete = false;
  while (q->off < kHeaderBytes) {
    ssize_t k = recv(c->fd, q->hdr + q->off, kHeaderBytes - q->off, MSG_DONTWAIT);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return kNetSuccess;
    if (k <= 0) return socketFailure(c, "recv", k, errno);
    q->off += static_cast<size_t>(k);
    if (q->off == kHeaderBytes) {
      uint32_t sz;
      int32_t tg;
      std::memcpy(&sz, q->hdr, 4);
      std::memcpy(&tg, q->hdr + 4, 4);
      q->msgSize = sz;
      if (q->msgSize > q->size) {
        TSOCK_WARN(
            "TestSock: irecv: received a message of %zu bytes, larger than the posted "
            "%zu bytes",
            q->msgSize, q->size);
        c->error = kNetInternalError;
        return kNetInternalError;
      }
      if (tg != q->tag) {
        TSOCK_WARN("TestSock: irecv: received a message with tag %d, but the posted tag is %d",
                   static_cast<int>(tg), q->tag);
        c->error = kNetInternalError;
        return kNetInternalError;
      }
    }
  }
  const size_t total = kHeaderBytes + q->msgSize;
  while (q->off < total) {
    size_t done = q->off - kHeaderBytes;
    ssize_t k = recv(c->fd, q->data + done, q->msgSize - done, MSG_DONTWAIT);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return kNetSuccess;
    if (k <= 0) return socketFailure(c, "recv", k, errno);
    q->off += static_cast<size_t>(k);
  }
  *complete = true;
  return kNetSuccess;
}

// Advances c's requests in posting order until one cannot finish now.
NetResult progress(Comm* c) {
  while (c->nextProgress < c->nextPost) {
    Request* q = nullptr;
    for (Request& r : c->reqs) {
      if (r.used && !r.done && r.seq == c->nextProgress) {
        q = &r;
        break;
      }
    }
    if (q == nullptr) {  // cannot happen: every posted request is progressed before freed
      TSOCK_WARN("TestSock: lost request %llu", static_cast<unsigned long long>(c->nextProgress));
      c->error = kNetInternalError;
      return kNetInternalError;
    }
    bool complete = false;
    NetResult r = c->isSend ? advanceSend(c, q, &complete) : advanceRecv(c, q, &complete);
    if (r != kNetSuccess) return r;
    if (!complete) break;
    q->done = true;
    ++c->nextProgress;
  }
  return kNetSuccess;
}

NetResult tsockTest(void* request, int* done, int* sizes) {
  if (request == nullptr || done == nullptr) return kNetInvalidArgument;
  *done = 0;
  Request* q = static_cast<Request*>(request);
  Comm* c = q->comm;
  if (c == nullptr || c->magic != kCommMagic || !q->used) {
    TSOCK_WARN("TestSock: test: %p is not a live request", request);
    return kNetInvalidArgument;
  }
  if (!q->done) {
    if (c->error != kNetSuccess) return c->error;
    // An error belongs to the request it happened on: one that completed
    // before a later one failed (the peer sent its last message and closed)
    // still reports its data.
    NetResult r = progress(c);
    if (r != kNetSuccess && !q->done) return r;
  }
  if (!q->done) return kNetSuccess;
  *done = 1;
  if (sizes != nullptr) *sizes = static_cast<int>(c->isSend ? q->size : q->msgSize);
  q->used = false;
  q->done = false;
  --c->live;
  return kNetSuccess;
}

// ---- close -------------------------------------------------------------------------------

NetResult tsockCloseComm(void* comm, bool isSend) {
  if (comm == nullptr) return kNetSuccess;
  Comm* c = asComm(comm);
  if (c == nullptr || c->isSend != isSend) {
    TSOCK_WARN("TestSock: %s: %p is not a %s comm", isSend ? "closeSend" : "closeRecv", comm,
               isSend ? "send" : "receive");
    return kNetInvalidArgument;
  }
  freeComm(c);  // requests live inside the comm
  return kNetSuccess;
}

NetResult tsockCloseSend(void* sendComm) { return tsockCloseComm(sendComm, true); }
NetResult tsockCloseRecv(void* recvComm) { return tsockCloseComm(recvComm, false); }

NetResult tsockCloseListen(void* listenComm) {
  ListenComm* l = static_cast<ListenComm*>(listenComm);
  if (l == nullptr) return kNetSuccess;
  if (l->magic != (kCommMagic ^ 1u)) {
    TSOCK_WARN("TestSock: closeListen: %p is not a listen comm", listenComm);
    return kNetInvalidArgument;
  }
  if (l->fd >= 0) close(l->fd);
  if (l->acceptFd >= 0) close(l->acceptFd);
  freeComm(l->ready);
  l->magic = 0;
  delete l;
  return kNetSuccess;
}

// ---- the ABI's entry points ------------------------------------------------------------

#if TSOCK_ABI == 8

NetResult v8Connect(int dev, void* handle, void** sendComm, NetDeviceHandle**) {
  return tsockConnect(dev, handle, sendComm);
}
NetResult v8Accept(void* listenComm, void** recvComm, NetDeviceHandle**) {
  return tsockAccept(listenComm, recvComm);
}
NetResult v8Isend(void* sendComm, void* data, int size, int tag, void* mhandle, void** request) {
  if (size < 0) {
    if (request != nullptr) *request = nullptr;
    TSOCK_WARN("TestSock: isend: negative size %d", size);
    return kNetInvalidArgument;
  }
  return tsockIsend(sendComm, data, static_cast<size_t>(size), tag, mhandle, request);
}
NetResult v8Irecv(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles,
                  void** request) {
  if (request != nullptr) *request = nullptr;
  if (n != 1) {
    TSOCK_WARN("TestSock: irecv: %d buffers, but maxRecvs is 1", n);
    return kNetInvalidArgument;
  }
  if (sizes == nullptr) return kNetInvalidArgument;
  if (sizes[0] < 0) {
    TSOCK_WARN("TestSock: irecv: negative size %d", sizes[0]);
    return kNetInvalidArgument;
  }
  size_t size = static_cast<size_t>(sizes[0]);
  return tsockIrecv(recvComm, n, data, &size, tags, mhandles, request);
}

#else  // TSOCK_ABI == 10

NetResult v10Init(NetLogger logger, NetProfilerCallback) { return tsockInit(logger); }
NetResult v10Connect(int dev, NetCommConfigV10*, void* handle, void** sendComm, NetDeviceHandle**) {
  return tsockConnect(dev, handle, sendComm);
}
NetResult v10Accept(void* listenComm, void** recvComm, NetDeviceHandle**) {
  return tsockAccept(listenComm, recvComm);
}
NetResult v10Isend(void* sendComm, void* data, size_t size, int tag, void* mhandle, void*,
                   void** request) {
  return tsockIsend(sendComm, data, size, tag, mhandle, request);
}
NetResult v10Irecv(void* recvComm, int n, void** data, size_t* sizes, int* tags, void** mhandles,
                   void**, void** request) {
  return tsockIrecv(recvComm, n, data, sizes, tags, mhandles, request);
}

#endif

}  // namespace

#if TSOCK_ABI == 8

extern "C" __attribute__((visibility("default")))
const tutti::transport::ncclnet::NetV8 ncclNetPlugin_v8 = {
    "TestSock",  tsockInit,  tsockDevices,     tsockGetPropertiesV8, tsockListen,      v8Connect,
    v8Accept,    tsockRegMr, tsockRegMrDmaBuf, tsockDeregMr,         v8Isend,          v8Irecv,
    tsockIflush, tsockTest,  tsockCloseSend,   tsockCloseRecv,       tsockCloseListen,
    nullptr,  // getDeviceMr
    nullptr,  // irecvConsumed
};

#else

extern "C" __attribute__((visibility("default")))
const tutti::transport::ncclnet::NetV10 ncclNetPlugin_v10 = {
    "TestSock10", v10Init,    tsockDevices,     tsockGetPropertiesV9, tsockListen,      v10Connect,
    v10Accept,    tsockRegMr, tsockRegMrDmaBuf, tsockDeregMr,         v10Isend,         v10Irecv,
    tsockIflush,  tsockTest,  tsockCloseSend,   tsockCloseRecv,       tsockCloseListen,
    nullptr,  // getDeviceMr
    nullptr,  // irecvConsumed
    nullptr,  // makeVDevice
};

#endif
