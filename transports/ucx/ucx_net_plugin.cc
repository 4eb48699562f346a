// tutti's UCX network transport, as an NCCL net plugin (ncclNetPlugin_v8,
// table name "ucx") that tutti's loader (transports/ncclnet/nccl_net.cc) drives
// like any other plugin: NCCL_NET_PLUGIN=/path/to/libtutti-net-ucx.so.
//
// UCX's tag API (ucp) carries the messages; UCX picks the transports itself
// (UCX_TLS, UCX_NET_DEVICES, ...). Design:
// - One ucp context per process (init). Every comm has a worker of its own
//   (UCS_THREAD_MODE_SERIALIZED: a comm is used by one thread at a time, not
//   always the same one), with exactly one endpoint to its one peer, so tag
//   matching on a worker cannot mix connections, and UCX matches the messages
//   of one endpoint in sending order.
// - Connections use UCX's client/server flow (a ucp_listener on an IP address;
//   a worker address does not fit the 128-byte handle). listen() creates a
//   worker and a listener on port 0; the handle carries the bound address and
//   a random id. connect() creates a worker and a client endpoint and sends a
//   "hello" (the id) with a reserved tag; accept() creates the endpoint from
//   the connection request (the listener is destroyed then: one peer per
//   listen), hands the listen's worker to the receive comm, and returns the
//   comm once the hello with the right id arrived. Both return NULL comms
//   until then and never block.
// - isend/irecv post ucp_tag_send_nbx/ucp_tag_recv_nbx (no callbacks: test()
//   polls the UCX requests, so nothing in UCX points at our memory after a
//   close); at most kMaxRequests in flight per comm, NULL requests beyond.
//   test() progresses the comm's worker and reports requests done in posting
//   order.
// - Host memory only: UCX registers host memory itself (its rcache), so
//   regMr() only records the range that isend/irecv check buffers against.
// - Peer failure: the endpoint's error handler (UCP_ERR_HANDLING_MODE_PEER)
//   marks the comm failed; test() of a request that has not completed then
//   returns ncclRemoteError. A request that completed before still reports
//   its data. (With UCX 1.13, PEER mode keeps posix/sysv shared memory out of
//   the lanes unless UCX_POSIX_ERROR_HANDLING=y / UCX_SYSV_ERROR_HANDLING=y,
//   and a client/server endpoint needs a network transport such as tcp on the
//   listen address's interface: UCX_TLS=sm,self alone cannot connect.)
// - Close. UCX discards the data a failed endpoint has not yet taken from its
//   transports, and a peer's disconnect makes the endpoint fail; so a send
//   comm that closes right after its last message completed (locally) could
//   lose that message at the receiver. closeSend() therefore sends a "bye"
//   after the data and waits for the receiver's "bye-ack" (a receive comm
//   answers as soon as its worker matched the bye, i.e. after it took every
//   earlier message), or for the peer's failure, at most kCloseTimeoutSec,
//   before it force-closes the endpoint. That wait needs the peer to progress
//   its receive comm, which it may do only after closing its own send comm
//   (tutti closes send, then receive, on both sides), so it happens on a
//   background thread ("reaper") and closeSend() returns at once; at exit the
//   plugin's destructor gives those closes their remaining time. (A FLUSH
//   ucp_ep_close_nbx has the same dependency: on a client/server endpoint it
//   waits for the peer's disconnect, which the peer's worker only answers when
//   progressed.) A send comm closed with sends in flight (an abort) or failed,
//   and every receive comm, is force-closed at once (posted receives
//   cancelled): nothing in UCX touches the caller's buffers after a close.
// - Listen address: tutti's "ifname" option (tuttiNetSetOption, before init;
//   tutti passes loopback when every rank is on one host), else
//   NCCL_SOCKET_IFNAME (NCCL's rules: prefixes, '^' excludes,
//   '=' exact, comma lists) picks the interface; without it the first UP
//   non-loopback IPv4 interface, else 127.0.0.1. When UCX_NET_DEVICES is not
//   set, NCCL_SOCKET_IFNAME also sets UCX's NET_DEVICES to the interfaces it
//   matches.
//
// No std containers, std::mutex or std::atomic here: their template
// instantiations over std types have default visibility and would be exported
// next to the table.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "transports/ncclnet/net_abi.h"
#include "transports/netplugin/plugin_support.h"

namespace {

using namespace tutti::transport::ncclnet;
using namespace tutti::transport::netplugin;

// ---- logging -------------------------------------------------------------------

#define UCXN_WARN(...) TUTTI_NETPLUGIN_LOG(kNetLogWarn, __VA_ARGS__)
#define UCXN_INFO(...) TUTTI_NETPLUGIN_LOG(kNetLogInfo, __VA_ARGS__)

// ---- constants -------------------------------------------------------------------

constexpr uint32_t kHandleMagic = 0x55435848u;  // "UCXH"
constexpr uint32_t kCommMagic = 0x55435843u;    // "UCXC"
constexpr uint32_t kListenMagic = 0x5543584cu;  // "UCXL"
constexpr uint32_t kMrMagic = 0x5543584du;      // "UCXM"

// UCX tags. Data messages carry the caller's tag in the low 32 bits; the
// control messages use tags a data message cannot have.
constexpr ucp_tag_t kFullMask = ~ucp_tag_t{0};
constexpr ucp_tag_t kHelloTag = 0xfffffffffffffff0ull;
constexpr ucp_tag_t kByeTag = 0xfffffffffffffff1ull;
constexpr ucp_tag_t kByeAckTag = 0xfffffffffffffff2ull;
constexpr ucp_tag_t kDataTagBase = 0x5543580000000000ull;  // "UCX" in the high bytes

ucp_tag_t dataTag(int tag) { return kDataTagBase | static_cast<uint32_t>(tag); }

constexpr int kMaxRequests = 32;
constexpr double kCloseTimeoutSec = 2.0;

// ---- the handle ----------------------------------------------------------------------

struct WireHandle {
  uint32_t magic;
  uint16_t family;  // AF_INET or AF_INET6
  uint16_t port;    // network order
  uint8_t addr[16];
  uint64_t id;
};
static_assert(sizeof(WireHandle) <= kHandleBytes, "handle fits NCCL_NET_HANDLE_MAXSIZE");

// ---- comms, requests, memory handles -----------------------------------------------

struct Comm;

struct Request {
  Comm* comm;
  bool used;
  bool complete;  // UCX finished it (with `status`)
  uint64_t seq;   // posting order on its comm
  void* ucx;      // the UCX request while in flight; nullptr once freed
  ucs_status_t status;
  size_t size;    // send: bytes sent; recv: posted capacity
  size_t length;  // recv: bytes received
  ucp_tag_recv_info_t info;
};

struct Comm {
  uint32_t magic;
  bool isSend;
  int dev;
  ucp_worker_h worker;  // owned
  ucp_ep_h ep;
  ucs_status_t epStatus;  // UCS_OK while healthy; set by the error handler (__atomic)
  bool warned;            // the failure was logged
  uint64_t id;            // the listen handle's id
  int live;               // requests handed out and not yet reported done
  uint64_t nextSeq;
  Request reqs[kMaxRequests];
  // Connect: the hello in flight. Receive comm: the bye it waits for, the
  // ack it sent. Send comm closing: the bye sent, the ack it waits for.
  void* helloReq;
  void* byeReq;
  void* ackReq;
  bool byeSeen;
  uint64_t helloBuf;
  uint64_t byeBuf;
  uint64_t ackBuf;
  unsigned char scratch[64];  // drainUnexpected()
  // Closing in the background.
  double closeDeadline;
  Comm* nextZombie;
};

struct MemHandle {
  uint32_t magic;
  Comm* comm;
  uintptr_t base;
  size_t size;
};

struct ListenComm {
  uint32_t magic;
  int dev;
  uint64_t id;
  ucp_worker_h worker;  // owned until a receive comm takes it over
  ucp_listener_h listener;
  ucp_conn_request_h connReq;  // arrived, not yet turned into an endpoint
  Comm* accepting;             // the receive comm being accepted (shares `worker`)
  void* helloReq;              // the posted receive of the connector's hello
  uint64_t helloBuf;
  ucp_tag_recv_info_t helloInfo;
  bool accepted;              // the receive comm was handed out
  NetResult error;            // sticky: an accept that failed stays failed
  unsigned char scratch[64];  // drainUnexpected()
};

// ---- the UCX context -----------------------------------------------------------------

pthread_mutex_t g_initMu = PTHREAD_MUTEX_INITIALIZER;
ucp_context_h g_ctx = nullptr;  // written once under g_initMu, then read (__atomic)

ucp_context_h context() { return __atomic_load_n(&g_ctx, __ATOMIC_ACQUIRE); }

void progressWorker(ucp_worker_h w) {
  for (int i = 0; i < 8 && ucp_worker_progress(w) != 0; ++i) {
  }
}

ucs_status_t createWorker(ucp_worker_h* w) {
  ucp_worker_params_t wp;
  std::memset(&wp, 0, sizeof(wp));
  wp.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  wp.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  return ucp_worker_create(context(), &wp, w);
}

void epErrorHandler(void* arg, ucp_ep_h, ucs_status_t status) {
  Comm* c = static_cast<Comm*>(arg);
  if (status == UCS_OK) status = UCS_ERR_CONNECTION_RESET;
  __atomic_store_n(&c->epStatus, status, __ATOMIC_RELEASE);
}

ucs_status_t epStatus(const Comm* c) { return __atomic_load_n(&c->epStatus, __ATOMIC_ACQUIRE); }

Comm* newComm(bool isSend, int dev) {
  Comm* c = new Comm();
  std::memset(static_cast<void*>(c), 0, sizeof(*c));
  c->magic = kCommMagic;
  c->isSend = isSend;
  c->dev = dev;
  c->epStatus = UCS_OK;
  for (Request& r : c->reqs) r.comm = c;
  return c;
}

// Posts a tagged receive of exactly `tag`. Always a request (or an error):
// UCX 1.13 completing a receive in place (a message already waiting) does not
// fill param->recv_info, so the length would be lost; with
// UCP_OP_ATTR_FLAG_NO_IMM_CMPL ucp_tag_recv_request_test() reports it.
void* postRecv(ucp_worker_h w, void* buf, size_t size, ucp_tag_t tag) {
  ucp_request_param_t p;
  std::memset(&p, 0, sizeof(p));
  p.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  void* r = ucp_tag_recv_nbx(w, buf, size, tag, kFullMask, &p);
  if (r == nullptr) r = UCS_STATUS_PTR(UCS_ERR_NO_MESSAGE);  // not expected
  return r;
}

// A posted receive's state now (and its length once complete).
ucs_status_t recvStatus(void* req, ucp_tag_recv_info_t* info) {
  return ucp_tag_recv_request_test(req, info);
}

// Cancels (receives) and frees a control request.
void dropControl(Comm* c, void** req, bool isRecv) {
  if (*req == nullptr) return;
  if (isRecv) ucp_request_cancel(c->worker, *req);
  ucp_request_free(*req);
  *req = nullptr;
}

// Cancels posted receives, then frees every data request still held.
void freeDataRequests(Comm* c) {
  bool any = false;
  for (Request& r : c->reqs) {
    if (r.ucx != nullptr && !c->isSend) {
      ucp_request_cancel(c->worker, r.ucx);
      any = true;
    }
  }
  if (any) progressWorker(c->worker);
  for (Request& r : c->reqs) {
    if (r.ucx != nullptr) ucp_request_free(r.ucx);
    r.ucx = nullptr;
    r.used = false;
  }
  c->live = 0;
}

// Takes the messages nobody received out of a worker about to be destroyed
// (UCX warns on stdout about each one left, and about its buffers). scratch
// outlives the worker: a message larger than it completes truncated.
void drainUnexpected(ucp_worker_h w, void* scratch, size_t scratchBytes) {
  const double deadline = nowSec() + 0.2;  // a best effort: bounded
  for (int i = 0; i < 4096 && nowSec() < deadline; ++i) {
    ucp_tag_recv_info_t info;
    ucp_tag_message_h m = ucp_tag_probe_nb(w, 0, 0, 1, &info);
    if (m == nullptr) return;
    ucp_request_param_t p;
    std::memset(&p, 0, sizeof(p));
    p.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    void* r = ucp_tag_msg_recv_nbx(w, scratch, scratchBytes, m, &p);
    if (!UCS_PTR_IS_PTR(r)) continue;
    while (ucp_request_check_status(r) == UCS_INPROGRESS && nowSec() < deadline) progressWorker(w);
    ucp_request_free(r);
  }
}

// Force-closes the endpoint (nothing arrives after that), frees every
// request, destroys the worker, frees the comm.
void destroyComm(Comm* c) {
  if (c->worker != nullptr) {
    if (c->ep != nullptr) {
      ucp_request_param_t p;
      std::memset(&p, 0, sizeof(p));
      p.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
      p.flags = UCP_EP_CLOSE_FLAG_FORCE;
      void* r = ucp_ep_close_nbx(c->ep, &p);
      if (UCS_PTR_IS_PTR(r)) {
        const double deadline = nowSec() + kCloseTimeoutSec;
        while (ucp_request_check_status(r) == UCS_INPROGRESS && nowSec() < deadline)
          progressWorker(c->worker);
        ucp_request_free(r);
      } else if (UCS_PTR_IS_ERR(r)) {
        UCXN_INFO("ucx: closing an endpoint: %s", ucs_status_string(UCS_PTR_STATUS(r)));
      }
      c->ep = nullptr;
    }
    freeDataRequests(c);
    dropControl(c, &c->helloReq, false);
    // The bye/ack roles differ: a receive comm waits for the bye, a closing
    // send comm for the ack.
    dropControl(c, &c->byeReq, !c->isSend);
    dropControl(c, &c->ackReq, c->isSend);
    progressWorker(c->worker);
    drainUnexpected(c->worker, c->scratch, sizeof(c->scratch));
    ucp_worker_destroy(c->worker);
    c->worker = nullptr;
  }
  c->magic = 0;
  delete c;
}

// Moves a request's UCX state into it; frees the UCX request once complete.
void pollRequest(Request* q) {
  if (q->complete || q->ucx == nullptr) return;
  ucs_status_t st;
  if (q->comm->isSend) {
    st = ucp_request_check_status(q->ucx);
  } else {
    st = recvStatus(q->ucx, &q->info);
    if (st == UCS_OK) q->length = q->info.length;
  }
  if (st == UCS_INPROGRESS) return;
  q->status = st;
  q->complete = true;
  ucp_request_free(q->ucx);
  q->ucx = nullptr;
}

// A receive comm answers the bye of a closing sender as soon as its worker
// matched it: every earlier message has been taken from the transports then.
void serviceBye(Comm* c) {
  if (c->isSend || c->byeSeen || c->byeReq == nullptr) return;
  ucp_tag_recv_info_t info;
  ucs_status_t st = recvStatus(c->byeReq, &info);
  if (st == UCS_INPROGRESS) return;
  ucp_request_free(c->byeReq);
  c->byeReq = nullptr;
  c->byeSeen = true;
  if (st != UCS_OK || epStatus(c) != UCS_OK) return;
  c->ackBuf = c->id;
  ucp_request_param_t p;
  std::memset(&p, 0, sizeof(p));
  void* r = ucp_tag_send_nbx(c->ep, &c->ackBuf, sizeof(c->ackBuf), kByeAckTag, &p);
  if (UCS_PTR_IS_PTR(r)) c->ackReq = r;
}

// ---- the reaper: send comms waiting for the peer's bye-ack ----------------------------

pthread_mutex_t g_reapMu = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t g_reapCv = PTHREAD_COND_INITIALIZER;
Comm* g_zombies = nullptr;  // guarded by g_reapMu
bool g_reaperStarted = false;
bool g_reaperStop = false;
pthread_t g_reaper;

// One step of a closing send comm; true when it is finished (and freed).
bool zombieStep(Comm* c, double now) {
  progressWorker(c->worker);
  bool acked = false;
  if (c->ackReq != nullptr) {
    ucp_tag_recv_info_t info;
    ucs_status_t st = recvStatus(c->ackReq, &info);
    if (st != UCS_INPROGRESS) {
      ucp_request_free(c->ackReq);
      c->ackReq = nullptr;
      acked = true;
    }
  }
  if (c->byeReq != nullptr && ucp_request_check_status(c->byeReq) != UCS_INPROGRESS) {
    ucp_request_free(c->byeReq);
    c->byeReq = nullptr;
  }
  const bool failed = epStatus(c) != UCS_OK;
  if (!acked && !failed && now < c->closeDeadline) return false;
  if (!acked && !failed)
    UCXN_INFO("ucx: the peer did not answer the close of a connection within %.0f s; closing it",
              kCloseTimeoutSec);
  destroyComm(c);
  return true;
}

void* reaperMain(void*) {
  pthread_mutex_lock(&g_reapMu);
  while (!g_reaperStop) {
    if (g_zombies == nullptr) {
      pthread_cond_wait(&g_reapCv, &g_reapMu);
      continue;
    }
    Comm* mine = g_zombies;
    g_zombies = nullptr;
    pthread_mutex_unlock(&g_reapMu);
    Comm* keep = nullptr;
    const double now = nowSec();
    while (mine != nullptr) {
      Comm* next = mine->nextZombie;
      if (!zombieStep(mine, now)) {
        mine->nextZombie = keep;
        keep = mine;
      }
      mine = next;
    }
    pthread_mutex_lock(&g_reapMu);
    while (keep != nullptr) {
      Comm* next = keep->nextZombie;
      keep->nextZombie = g_zombies;
      g_zombies = keep;
      keep = next;
    }
    if (g_zombies != nullptr && !g_reaperStop) {
      pthread_mutex_unlock(&g_reapMu);
      sleepMicros(100);
      pthread_mutex_lock(&g_reapMu);
    }
  }
  pthread_mutex_unlock(&g_reapMu);
  return nullptr;
}

// A forked child has no reaper thread (and must not join the parent's): it
// starts afresh, forgetting the parent's closing comms.
void reaperAtForkChild() {
  pthread_mutex_init(&g_reapMu, nullptr);
  pthread_cond_init(&g_reapCv, nullptr);
  g_zombies = nullptr;
  g_reaperStarted = false;
  g_reaperStop = false;
}

// Hands a closing send comm to the reaper; false if there is none.
bool reap(Comm* c) {
  static pthread_once_t atForkOnce = PTHREAD_ONCE_INIT;
  pthread_once(&atForkOnce, [] { pthread_atfork(nullptr, nullptr, reaperAtForkChild); });
  pthread_mutex_lock(&g_reapMu);
  if (!g_reaperStarted) {
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    // Block the signals an application handles itself in this thread.
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int rc = pthread_create(&g_reaper, &attr, reaperMain, nullptr);
    pthread_sigmask(SIG_SETMASK, &old, nullptr);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
      pthread_mutex_unlock(&g_reapMu);
      return false;
    }
    g_reaperStarted = true;
  }
  c->nextZombie = g_zombies;
  g_zombies = c;
  pthread_cond_signal(&g_reapCv);
  pthread_mutex_unlock(&g_reapMu);
  return true;
}

// At exit (or unload): stop the reaper, then give the closes left a last
// chance to finish (bounded), so that a process that closes and exits at once
// still lets its peers take its last messages.
__attribute__((destructor)) void stopReaper() {
  pthread_mutex_lock(&g_reapMu);
  const bool started = g_reaperStarted;
  g_reaperStop = true;
  pthread_cond_signal(&g_reapCv);
  pthread_mutex_unlock(&g_reapMu);
  if (!started) return;
  pthread_join(g_reaper, nullptr);
  pthread_mutex_lock(&g_reapMu);
  Comm* mine = g_zombies;
  g_zombies = nullptr;
  pthread_mutex_unlock(&g_reapMu);
  const double deadline = nowSec() + kCloseTimeoutSec;
  while (mine != nullptr) {
    Comm* keep = nullptr;
    const double now = nowSec();
    while (mine != nullptr) {
      Comm* next = mine->nextZombie;
      if (now < deadline && !zombieStep(mine, now)) {
        mine->nextZombie = keep;
        keep = mine;
      }
      mine = next;  // past the deadline: left to the process's exit
    }
    mine = keep;
    if (mine != nullptr) sleepMicros(100);
  }
}

// ---- pending connects ------------------------------------------------------------------

// Connections being made, by handle id (connect() is called again with the
// same handle until it hands out a comm).
struct PendingConnect {
  PendingConnect* next;
  uint64_t id;
  Comm* comm;
  char peer[INET6_ADDRSTRLEN + 8];
};

pthread_mutex_t g_pendingMu = PTHREAD_MUTEX_INITIALIZER;
PendingConnect* g_pending = nullptr;  // guarded by g_pendingMu

struct PendingLock {
  PendingLock() { pthread_mutex_lock(&g_pendingMu); }
  ~PendingLock() { pthread_mutex_unlock(&g_pendingMu); }
  PendingLock(const PendingLock&) = delete;
  PendingLock& operator=(const PendingLock&) = delete;
};

PendingConnect* findPending(uint64_t id) {
  PendingLock lock;
  for (PendingConnect* p = g_pending; p != nullptr; p = p->next)
    if (p->id == id) return p;
  return nullptr;
}

void removePending(PendingConnect* p) {
  PendingLock lock;
  for (PendingConnect** pp = &g_pending; *pp != nullptr; pp = &(*pp)->next) {
    if (*pp == p) {
      *pp = p->next;
      return;
    }
  }
}

// ---- init / devices / properties ---------------------------------------------------------

char g_devName[] = "ucx";

// The address listeners bind, chosen once by init().
Interface g_listen{};

NetResult ucxInit(NetLogger logger) {
  setLogger(logger);
  pthread_mutex_lock(&g_initMu);
  struct Unlock {
    ~Unlock() { pthread_mutex_unlock(&g_initMu); }
  } unlock;
  if (context() != nullptr) return kNetSuccess;

  const char* ifSource = "";
  const char* ifname = ifSpec(&ifSource);
  NetResult r = chooseInterface("ucx", ifname, &g_listen);
  if (r != kNetSuccess) return r;

  // UCX 1.13's tcp transport aborts the process on an internal assertion
  // (tcp_ep.c: UCT_TCP_EP_FLAG_PUT_TX_WAITING_ACK) when a peer dies during a
  // PUT-zcopy rendezvous: the survivors must get an error instead. Its PUT
  // path stays off unless the user asks for it (UCX reads this when the
  // config is read, just below; init runs once, under g_initMu).
  setenv("UCX_TCP_PUT_ENABLE", "n", /*overwrite=*/0);
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) {
    UCXN_WARN("ucx: ucp_config_read failed: %s", ucs_status_string(st));
    return kNetInternalError;
  }
  char netDevices[512] = "";
  const char* ucxNetDevices = std::getenv("UCX_NET_DEVICES");
  if ((ucxNetDevices == nullptr || *ucxNetDevices == '\0') && ifname != nullptr) {
    matchingIfNames(ifname, netDevices, sizeof(netDevices));
    if (netDevices[0] != '\0') {
      st = ucp_config_modify(config, "NET_DEVICES", netDevices);
      if (st != UCS_OK) {
        UCXN_WARN("ucx: setting UCX NET_DEVICES=%s (from %s%s) failed: %s", netDevices, ifSource,
                  ifname, ucs_status_string(st));
        ucp_config_release(config);
        return kNetInternalError;
      }
    }
  }
  ucp_params_t params;
  std::memset(&params, 0, sizeof(params));
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_TAG;
  params.mt_workers_shared = 1;
  ucp_context_h ctx = nullptr;
  st = ucp_init(&params, config, &ctx);
  ucp_config_release(config);
  if (st != UCS_OK) {
    UCXN_WARN("ucx: ucp_init failed: %s", ucs_status_string(st));
    return kNetInternalError;
  }
  __atomic_store_n(&g_ctx, ctx, __ATOMIC_RELEASE);
  if (netDevices[0] != '\0') {
    UCXN_INFO("ucx: init, UCX %s; listening on %s (%s); UCX NET_DEVICES=%s from %s%s",
              ucp_get_version_string(), g_listen.addrStr, g_listen.name, netDevices, ifSource,
              ifname);
  } else {
    UCXN_INFO("ucx: init, UCX %s; listening on %s (%s)", ucp_get_version_string(), g_listen.addrStr,
              g_listen.name);
  }
  return kNetSuccess;
}

NetResult ucxDevices(int* ndev) {
  if (ndev == nullptr) return kNetInvalidArgument;
  *ndev = 1;
  return kNetSuccess;
}

NetResult ucxGetProperties(int dev, NetPropertiesV8* props) {
  if (props == nullptr || dev != 0) return kNetInvalidArgument;
  std::memset(props, 0, sizeof(*props));
  props->name = g_devName;
  props->pciPath = nullptr;
  props->guid = 0;
  props->ptrSupport = kPtrHost;
  props->regIsGlobal = 0;
  props->speed = 10000;  // UCX does not say; a nominal 10 Gbit/s
  props->port = 1;
  props->latency = 0.0f;
  props->maxComms = 65536;
  props->maxRecvs = 1;
  props->netDeviceType = 0;
  props->netDeviceVersion = 0;
  return kNetSuccess;
}

bool ready(const char* what) {
  if (context() != nullptr) return true;
  UCXN_WARN("ucx: %s before init", what);
  return false;
}

// ---- listen / connect / accept ---------------------------------------------------------

void connHandler(ucp_conn_request_h req, void* arg) {
  ListenComm* l = static_cast<ListenComm*>(arg);
  if (l->connReq != nullptr || l->accepting != nullptr || l->accepted) {
    // One peer connects per listen: a second request is not ours.
    UCXN_INFO("ucx: rejecting a second connection request on a listen comm");
    ucp_listener_reject(l->listener, req);
    return;
  }
  l->connReq = req;
}

void destroyListenComm(ListenComm* l) {
  // Requests before their worker, the listener before its worker.
  if (l->helloReq != nullptr) {
    ucp_request_cancel(l->worker, l->helloReq);
    ucp_request_free(l->helloReq);
    l->helloReq = nullptr;
  }
  if (l->listener != nullptr) {
    if (l->connReq != nullptr) ucp_listener_reject(l->listener, l->connReq);
    l->connReq = nullptr;
    ucp_listener_destroy(l->listener);
    l->listener = nullptr;
  }
  if (l->accepting != nullptr) {
    destroyComm(l->accepting);  // destroys the shared worker
    l->accepting = nullptr;
    l->worker = nullptr;
  }
  if (l->worker != nullptr) {
    progressWorker(l->worker);
    drainUnexpected(l->worker, l->scratch, sizeof(l->scratch));
    ucp_worker_destroy(l->worker);
    l->worker = nullptr;
  }
  l->magic = 0;
  delete l;
}

NetResult ucxListen(int dev, void* handle, void** listenComm) {
  if (handle == nullptr || listenComm == nullptr) return kNetInvalidArgument;
  *listenComm = nullptr;
  if (dev != 0) {
    UCXN_WARN("ucx: listen on device %d of 1", dev);
    return kNetInvalidArgument;
  }
  if (!ready("listen")) return kNetInternalError;
  ListenComm* l = new ListenComm();
  std::memset(static_cast<void*>(l), 0, sizeof(*l));
  l->magic = kListenMagic;
  l->dev = dev;
  l->id = randomId();
  ucs_status_t st = createWorker(&l->worker);
  if (st != UCS_OK) {
    UCXN_WARN("ucx: listen: ucp_worker_create failed: %s", ucs_status_string(st));
    l->worker = nullptr;
    destroyListenComm(l);
    return kNetInternalError;
  }
  // The connector's hello may come as soon as its endpoint is up.
  void* hr = postRecv(l->worker, &l->helloBuf, sizeof(l->helloBuf), kHelloTag);
  if (UCS_PTR_IS_ERR(hr)) {
    UCXN_WARN("ucx: listen: posting the hello receive failed: %s",
              ucs_status_string(UCS_PTR_STATUS(hr)));
    destroyListenComm(l);
    return kNetInternalError;
  }
  l->helloReq = hr;  // cannot have completed: nobody knows the address yet

  sockaddr_in sa = g_listen.addr;
  sa.sin_port = 0;
  ucp_listener_params_t lp;
  std::memset(&lp, 0, sizeof(lp));
  lp.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  lp.sockaddr.addr = reinterpret_cast<const sockaddr*>(&sa);
  lp.sockaddr.addrlen = sizeof(sa);
  lp.conn_handler.cb = connHandler;
  lp.conn_handler.arg = l;
  st = ucp_listener_create(l->worker, &lp, &l->listener);
  if (st != UCS_OK) {
    UCXN_WARN("ucx: listen: ucp_listener_create on %s (%s) failed: %s", g_listen.addrStr,
              g_listen.name, ucs_status_string(st));
    l->listener = nullptr;
    destroyListenComm(l);
    return kNetSystemError;
  }
  ucp_listener_attr_t la;
  std::memset(&la, 0, sizeof(la));
  la.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  st = ucp_listener_query(l->listener, &la);
  if (st != UCS_OK || la.sockaddr.ss_family != AF_INET) {
    UCXN_WARN("ucx: listen: ucp_listener_query failed: %s",
              st != UCS_OK ? ucs_status_string(st) : "not an IPv4 address");
    destroyListenComm(l);
    return kNetInternalError;
  }
  const sockaddr_in* bound = reinterpret_cast<const sockaddr_in*>(&la.sockaddr);
  WireHandle h;
  std::memset(&h, 0, sizeof(h));
  h.magic = kHandleMagic;
  h.family = AF_INET;
  h.port = bound->sin_port;
  std::memcpy(h.addr, &sa.sin_addr, sizeof(sa.sin_addr));  // what we bound, never 0.0.0.0
  h.id = l->id;
  std::memset(handle, 0, kHandleBytes);
  std::memcpy(handle, &h, sizeof(h));
  *listenComm = l;
  return kNetSuccess;
}

NetResult ucxConnect(int dev, void* handle, void** sendComm) {
  if (handle == nullptr || sendComm == nullptr) return kNetInvalidArgument;
  *sendComm = nullptr;
  if (dev != 0) {
    UCXN_WARN("ucx: connect on device %d of 1", dev);
    return kNetInvalidArgument;
  }
  if (!ready("connect")) return kNetInternalError;
  WireHandle h;
  std::memcpy(&h, handle, sizeof(h));
  if (h.magic != kHandleMagic || (h.family != AF_INET && h.family != AF_INET6)) {
    UCXN_WARN("ucx: connect: the handle (magic 0x%08x, family %u) is not a ucx handle", h.magic,
              static_cast<unsigned>(h.family));
    return kNetInvalidArgument;
  }

  PendingConnect* p = findPending(h.id);
  if (p == nullptr) {
    // First call: start the connection, hand out nothing yet.
    sockaddr_storage ss;
    std::memset(&ss, 0, sizeof(ss));
    socklen_t len;
    char peer[INET6_ADDRSTRLEN + 8] = "?";
    char addrStr[INET6_ADDRSTRLEN] = "?";
    if (h.family == AF_INET) {
      sockaddr_in* sin = reinterpret_cast<sockaddr_in*>(&ss);
      sin->sin_family = AF_INET;
      sin->sin_port = h.port;
      std::memcpy(&sin->sin_addr, h.addr, sizeof(sin->sin_addr));
      len = sizeof(*sin);
      inet_ntop(AF_INET, &sin->sin_addr, addrStr, sizeof(addrStr));
    } else {
      sockaddr_in6* sin6 = reinterpret_cast<sockaddr_in6*>(&ss);
      sin6->sin6_family = AF_INET6;
      sin6->sin6_port = h.port;
      std::memcpy(&sin6->sin6_addr, h.addr, sizeof(sin6->sin6_addr));
      len = sizeof(*sin6);
      inet_ntop(AF_INET6, &sin6->sin6_addr, addrStr, sizeof(addrStr));
    }
    std::snprintf(peer, sizeof(peer), "%s:%u", addrStr, static_cast<unsigned>(ntohs(h.port)));

    Comm* c = newComm(true, dev);
    c->id = h.id;
    ucs_status_t st = createWorker(&c->worker);
    if (st != UCS_OK) {
      UCXN_WARN("ucx: connect to %s: ucp_worker_create failed: %s", peer, ucs_status_string(st));
      c->worker = nullptr;
      destroyComm(c);
      return kNetInternalError;
    }
    ucp_ep_params_t ep;
    std::memset(&ep, 0, sizeof(ep));
    ep.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                    UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
    ep.sockaddr.addr = reinterpret_cast<const sockaddr*>(&ss);
    ep.sockaddr.addrlen = len;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = epErrorHandler;
    ep.err_handler.arg = c;
    st = ucp_ep_create(c->worker, &ep, &c->ep);
    if (st != UCS_OK) {
      UCXN_WARN("ucx: connect to %s: ucp_ep_create failed: %s", peer, ucs_status_string(st));
      c->ep = nullptr;
      destroyComm(c);
      return kNetRemoteError;
    }
    c->helloBuf = h.id;
    ucp_request_param_t sp;
    std::memset(&sp, 0, sizeof(sp));
    void* r = ucp_tag_send_nbx(c->ep, &c->helloBuf, sizeof(c->helloBuf), kHelloTag, &sp);
    if (UCS_PTR_IS_ERR(r)) {
      UCXN_WARN("ucx: connect to %s: sending the hello failed: %s", peer,
                ucs_status_string(UCS_PTR_STATUS(r)));
      destroyComm(c);
      return kNetRemoteError;
    }
    c->helloReq = r;  // NULL: already sent
    p = new PendingConnect();
    p->next = nullptr;
    p->id = h.id;
    p->comm = c;
    std::snprintf(p->peer, sizeof(p->peer), "%s", peer);
    PendingLock lock;
    PendingConnect** pp = &g_pending;
    while (*pp != nullptr) pp = &(*pp)->next;
    *pp = p;
    return kNetSuccess;
  }

  Comm* c = p->comm;
  progressWorker(c->worker);
  ucs_status_t st = UCS_OK;
  if (c->helloReq != nullptr) {
    st = ucp_request_check_status(c->helloReq);
    if (st != UCS_INPROGRESS) {
      ucp_request_free(c->helloReq);
      c->helloReq = nullptr;
    }
  }
  if (st == UCS_OK && epStatus(c) != UCS_OK) st = epStatus(c);
  if (st == UCS_INPROGRESS) {
    if (epStatus(c) == UCS_OK) return kNetSuccess;  // still connecting
    st = epStatus(c);
  }
  removePending(p);
  if (st != UCS_OK) {
    // UCX 1.13 wires a client/server endpoint up over the transports of the
    // network device its address resolved to first: UCX_TLS without a network
    // transport (sm,self) or UCX_NET_DEVICES without that device fail here.
    UCXN_WARN("ucx: connect to %s failed: %s%s", p->peer, ucs_status_string(st),
              st == UCS_ERR_UNREACHABLE
                  ? " (UCX needs a network transport on that address's interface: check that "
                    "UCX_TLS has one, e.g. tcp, and that UCX_NET_DEVICES includes the interface)"
                  : "");
    delete p;
    destroyComm(c);
    return kNetRemoteError;
  }
  delete p;
  *sendComm = c;
  return kNetSuccess;
}

NetResult ucxAccept(void* listenComm, void** recvComm) {
  if (listenComm == nullptr || recvComm == nullptr) return kNetInvalidArgument;
  *recvComm = nullptr;
  ListenComm* l = static_cast<ListenComm*>(listenComm);
  if (l->magic != kListenMagic) {
    UCXN_WARN("ucx: accept: %p is not a listen comm", listenComm);
    return kNetInvalidArgument;
  }
  if (l->accepted) {
    UCXN_WARN("ucx: accept: this listen comm's connection was accepted already");
    return kNetInvalidUsage;
  }
  if (l->error != kNetSuccess) return l->error;
  progressWorker(l->worker);
  if (l->accepting == nullptr) {
    if (l->connReq == nullptr) return kNetSuccess;  // nobody yet
    Comm* c = newComm(false, l->dev);
    c->id = l->id;
    c->worker = l->worker;  // shared until handed out
    ucp_ep_params_t ep;
    std::memset(&ep, 0, sizeof(ep));
    ep.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                    UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
    ep.conn_request = l->connReq;
    ep.err_mode = UCP_ERR_HANDLING_MODE_PEER;
    ep.err_handler.cb = epErrorHandler;
    ep.err_handler.arg = c;
    l->connReq = nullptr;  // consumed by ucp_ep_create, whatever it returns
    ucs_status_t st = ucp_ep_create(l->worker, &ep, &c->ep);
    if (st != UCS_OK) {
      UCXN_WARN("ucx: accept: ucp_ep_create failed: %s", ucs_status_string(st));
      c->worker = nullptr;  // still the listen comm's
      c->ep = nullptr;
      destroyComm(c);
      return kNetRemoteError;
    }
    l->accepting = c;
    // One peer per listen: stop listening (a listener goes before its worker).
    ucp_listener_destroy(l->listener);
    l->listener = nullptr;
    progressWorker(l->worker);
  }
  Comm* c = l->accepting;
  if (l->helloReq != nullptr) {
    ucs_status_t st = recvStatus(l->helloReq, &l->helloInfo);
    if (st == UCS_INPROGRESS) {
      if (epStatus(c) != UCS_OK) {
        UCXN_WARN("ucx: accept: the connecting peer failed: %s", ucs_status_string(epStatus(c)));
        l->error = kNetRemoteError;  // closeListen frees it all
        return l->error;
      }
      return kNetSuccess;  // the hello has not come yet
    }
    ucp_request_free(l->helloReq);
    l->helloReq = nullptr;
    if (st != UCS_OK || l->helloInfo.length != sizeof(l->helloBuf) || l->helloBuf != l->id) {
      UCXN_WARN(
          "ucx: accept: bad hello from the connecting peer (%s, %zu bytes, id %016llx, "
          "expected %016llx)",
          ucs_status_string(st), st == UCS_OK ? l->helloInfo.length : size_t{0},
          static_cast<unsigned long long>(l->helloBuf), static_cast<unsigned long long>(l->id));
      l->error = kNetInternalError;
      return l->error;
    }
  }
  // Connected: the receive comm takes the worker over, and waits for a bye.
  void* br = postRecv(c->worker, &c->byeBuf, sizeof(c->byeBuf), kByeTag);
  if (UCS_PTR_IS_ERR(br)) {
    UCXN_WARN("ucx: accept: posting a receive failed: %s", ucs_status_string(UCS_PTR_STATUS(br)));
    l->error = kNetInternalError;
    return l->error;
  }
  c->byeReq = br;
  l->accepting = nullptr;
  l->worker = nullptr;
  l->accepted = true;
  *recvComm = c;
  return kNetSuccess;
}

// ---- memory registration ----------------------------------------------------------------

Comm* asComm(void* p) {
  Comm* c = static_cast<Comm*>(p);
  return (c != nullptr && c->magic == kCommMagic) ? c : nullptr;
}

NetResult ucxRegMr(void* comm, void* data, size_t size, int type, void** mhandle) {
  if (mhandle == nullptr) return kNetInvalidArgument;
  *mhandle = nullptr;
  Comm* c = asComm(comm);
  if (c == nullptr) {
    UCXN_WARN("ucx: regMr: %p is not a send or receive comm", comm);
    return kNetInvalidArgument;
  }
  if (type != kPtrHost) {
    UCXN_WARN("ucx: regMr: pointer type %d not supported (host memory only)", type);
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

NetResult ucxRegMrDmaBuf(void*, void*, size_t, int, uint64_t, int, void** mhandle) {
  if (mhandle != nullptr) *mhandle = nullptr;
  UCXN_WARN("ucx: regMrDmaBuf is not supported (host memory only)");
  return kNetInternalError;
}

NetResult ucxDeregMr(void*, void* mhandle) {
  MemHandle* mh = static_cast<MemHandle*>(mhandle);
  if (mh == nullptr) return kNetSuccess;
  if (mh->magic != kMrMagic) {
    UCXN_WARN("ucx: deregMr: %p is not a memory handle", mhandle);
    return kNetInvalidArgument;
  }
  mh->magic = 0;
  delete mh;
  return kNetSuccess;
}

// Whether [data, data+size) lies in a region registered on comm c.
NetResult checkRegistered(const char* what, Comm* c, void* data, size_t size, void* mhandle) {
  MemHandle* mh = static_cast<MemHandle*>(mhandle);
  if (mh == nullptr || mh->magic != kMrMagic) {
    UCXN_WARN(
        "ucx: %s: buffer %p (%zu bytes) was not registered (mhandle %p is not a memory "
        "handle)",
        what, data, size, mhandle);
    return kNetInvalidUsage;
  }
  if (mh->comm != c) {
    UCXN_WARN(
        "ucx: %s: buffer %p (%zu bytes) was not registered on this comm (mhandle belongs "
        "to comm %p, not %p)",
        what, data, size, static_cast<void*>(mh->comm), static_cast<void*>(c));
    return kNetInvalidUsage;
  }
  if (size == 0) return kNetSuccess;
  uintptr_t p = reinterpret_cast<uintptr_t>(data);
  if (p < mh->base || p - mh->base > mh->size || size > mh->size - (p - mh->base)) {
    UCXN_WARN("ucx: %s: buffer %p (%zu bytes) was not registered (mhandle covers %p, %zu bytes)",
              what, data, size, reinterpret_cast<void*>(mh->base), mh->size);
    return kNetInvalidUsage;
  }
  return kNetSuccess;
}

// ---- isend / irecv / test -------------------------------------------------------------------

NetResult failedComm(Comm* c, const char* what) {
  if (!c->warned) {
    c->warned = true;
    UCXN_WARN("ucx: %s: connection to peer failed: %s", what, ucs_status_string(epStatus(c)));
  }
  return kNetRemoteError;
}

// A free request slot, or nullptr when kMaxRequests are in flight.
Request* takeRequest(Comm* c) {
  if (c->live >= kMaxRequests) return nullptr;
  for (Request& r : c->reqs) {
    if (!r.used) {
      r.used = true;
      r.complete = false;
      r.seq = c->nextSeq++;
      r.ucx = nullptr;
      r.status = UCS_INPROGRESS;
      r.size = 0;
      r.length = 0;
      ++c->live;
      return &r;
    }
  }
  return nullptr;
}

void releaseRequest(Request* q) {
  if (q->ucx != nullptr) ucp_request_free(q->ucx);
  q->ucx = nullptr;
  q->used = false;
  --q->comm->live;
}

NetResult ucxIsend(void* sendComm, void* data, int size, int tag, void* mhandle, void** request) {
  if (request == nullptr) return kNetInvalidArgument;
  *request = nullptr;
  Comm* c = asComm(sendComm);
  if (c == nullptr || !c->isSend) {
    UCXN_WARN("ucx: isend: %p is not a send comm", sendComm);
    return kNetInvalidArgument;
  }
  if (size < 0 || (size > 0 && data == nullptr)) {
    UCXN_WARN("ucx: isend: bad buffer %p of %d bytes", data, size);
    return kNetInvalidArgument;
  }
  NetResult r = checkRegistered("isend", c, data, static_cast<size_t>(size), mhandle);
  if (r != kNetSuccess) return r;
  if (epStatus(c) != UCS_OK) return failedComm(c, "isend");
  Request* q = takeRequest(c);
  if (q == nullptr) return kNetSuccess;
  ucp_request_param_t p;
  std::memset(&p, 0, sizeof(p));
  void* u = ucp_tag_send_nbx(c->ep, data, static_cast<size_t>(size), dataTag(tag), &p);
  if (UCS_PTR_IS_ERR(u)) {
    releaseRequest(q);
    UCXN_WARN("ucx: isend of %d bytes failed: %s", size, ucs_status_string(UCS_PTR_STATUS(u)));
    return kNetRemoteError;
  }
  q->size = static_cast<size_t>(size);
  if (u == nullptr) {
    q->complete = true;
    q->status = UCS_OK;
  } else {
    q->ucx = u;
  }
  *request = q;
  return kNetSuccess;
}

NetResult ucxIrecv(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles,
                   void** request) {
  if (request == nullptr) return kNetInvalidArgument;
  *request = nullptr;
  Comm* c = asComm(recvComm);
  if (c == nullptr || c->isSend) {
    UCXN_WARN("ucx: irecv: %p is not a receive comm", recvComm);
    return kNetInvalidArgument;
  }
  if (n != 1) {
    UCXN_WARN("ucx: irecv: %d buffers, but maxRecvs is 1", n);
    return kNetInvalidArgument;
  }
  if (data == nullptr || sizes == nullptr || tags == nullptr || mhandles == nullptr) {
    UCXN_WARN("ucx: irecv: NULL array argument");
    return kNetInvalidArgument;
  }
  const int size = sizes[0];
  if (size < 0 || (size > 0 && data[0] == nullptr)) {
    UCXN_WARN("ucx: irecv: bad buffer %p of %d bytes", data[0], size);
    return kNetInvalidArgument;
  }
  NetResult r = checkRegistered("irecv", c, data[0], static_cast<size_t>(size), mhandles[0]);
  if (r != kNetSuccess) return r;
  // Posted even on a failed comm: it may still match a message that arrived
  // before the failure; test() reports the failure otherwise.
  Request* q = takeRequest(c);
  if (q == nullptr) return kNetSuccess;
  void* u = postRecv(c->worker, data[0], static_cast<size_t>(size), dataTag(tags[0]));
  if (UCS_PTR_IS_ERR(u)) {
    ucs_status_t st = UCS_PTR_STATUS(u);
    releaseRequest(q);
    if (st == UCS_ERR_MESSAGE_TRUNCATED) {
      UCXN_WARN("ucx: irecv: the message is larger than the posted buffer of %d bytes", size);
      return kNetInternalError;
    }
    UCXN_WARN("ucx: irecv of %d bytes failed: %s", size, ucs_status_string(st));
    return kNetRemoteError;
  }
  q->size = static_cast<size_t>(size);
  q->ucx = u;
  *request = q;
  return kNetSuccess;
}

NetResult ucxIflush(void*, int, void**, int*, void**, void** request) {
  if (request != nullptr) *request = nullptr;
  return kNetSuccess;
}

NetResult ucxTest(void* request, int* done, int* sizes) {
  if (request == nullptr || done == nullptr) return kNetInvalidArgument;
  *done = 0;
  Request* q = static_cast<Request*>(request);
  Comm* c = q->comm;
  if (c == nullptr || c->magic != kCommMagic || !q->used) {
    UCXN_WARN("ucx: test: %p is not a live request", request);
    return kNetInvalidArgument;
  }
  progressWorker(c->worker);
  serviceBye(c);
  // Done in posting order: q only once every earlier request has completed.
  bool earlierPending = false;
  for (Request& r : c->reqs) {
    if (!r.used || r.seq > q->seq) continue;
    pollRequest(&r);
    if (!r.complete && r.seq < q->seq) earlierPending = true;
  }
  if (q->complete && !earlierPending) {
    if (q->status == UCS_OK) {
      *done = 1;
      if (sizes != nullptr) *sizes = static_cast<int>(c->isSend ? q->size : q->length);
      releaseRequest(q);
      return kNetSuccess;
    }
    if (q->status == UCS_ERR_MESSAGE_TRUNCATED) {
      UCXN_WARN("ucx: irecv: the message is larger than the posted buffer of %zu bytes", q->size);
      return kNetInternalError;
    }
    if (epStatus(c) != UCS_OK) return failedComm(c, c->isSend ? "isend" : "irecv");
    UCXN_WARN("ucx: %s of %zu bytes failed: %s", c->isSend ? "isend" : "irecv", q->size,
              ucs_status_string(q->status));
    return kNetRemoteError;
  }
  if (epStatus(c) != UCS_OK) return failedComm(c, c->isSend ? "isend" : "irecv");
  return kNetSuccess;
}

// ---- close -----------------------------------------------------------------------------------

NetResult ucxCloseSend(void* sendComm) {
  if (sendComm == nullptr) return kNetSuccess;
  Comm* c = asComm(sendComm);
  if (c == nullptr || !c->isSend) {
    UCXN_WARN("ucx: closeSend: %p is not a send comm", sendComm);
    return kNetInvalidArgument;
  }
  // Sends still in flight (the caller gives up on them: an abort) read the
  // caller's buffers: force-close at once, so that nothing does after this
  // returns. So does a failed comm.
  progressWorker(c->worker);
  bool pending = false;
  for (Request& r : c->reqs) {
    if (!r.used) continue;
    pollRequest(&r);
    if (!r.complete) pending = true;
  }
  if (pending || epStatus(c) != UCS_OK) {
    destroyComm(c);
    return kNetSuccess;
  }
  freeDataRequests(c);
  // The bye follows every message; the peer acks once it matched it.
  void* ar = postRecv(c->worker, &c->ackBuf, sizeof(c->ackBuf), kByeAckTag);
  if (UCS_PTR_IS_ERR(ar)) {
    destroyComm(c);
    return kNetSuccess;
  }
  c->ackReq = ar;
  c->byeBuf = c->id;
  ucp_request_param_t sp;
  std::memset(&sp, 0, sizeof(sp));
  void* br = ucp_tag_send_nbx(c->ep, &c->byeBuf, sizeof(c->byeBuf), kByeTag, &sp);
  if (UCS_PTR_IS_ERR(br)) {
    destroyComm(c);
    return kNetSuccess;
  }
  c->byeReq = br;
  c->closeDeadline = nowSec() + kCloseTimeoutSec;
  if (zombieStep(c, nowSec())) return kNetSuccess;
  if (!reap(c)) {
    // No thread: wait here, bounded.
    while (!zombieStep(c, nowSec())) sleepMicros(100);
  }
  return kNetSuccess;
}

NetResult ucxCloseRecv(void* recvComm) {
  if (recvComm == nullptr) return kNetSuccess;
  Comm* c = asComm(recvComm);
  if (c == nullptr || c->isSend) {
    UCXN_WARN("ucx: closeRecv: %p is not a receive comm", recvComm);
    return kNetInvalidArgument;
  }
  destroyComm(c);  // cancels the posted receives
  return kNetSuccess;
}

NetResult ucxCloseListen(void* listenComm) {
  if (listenComm == nullptr) return kNetSuccess;
  ListenComm* l = static_cast<ListenComm*>(listenComm);
  if (l->magic != kListenMagic) {
    UCXN_WARN("ucx: closeListen: %p is not a listen comm", listenComm);
    return kNetInvalidArgument;
  }
  destroyListenComm(l);
  return kNetSuccess;
}

// ---- the ABI's entry points ---------------------------------------------------------------

NetResult v8Connect(int dev, void* handle, void** sendComm, NetDeviceHandle**) {
  return ucxConnect(dev, handle, sendComm);
}
NetResult v8Accept(void* listenComm, void** recvComm, NetDeviceHandle**) {
  return ucxAccept(listenComm, recvComm);
}

}  // namespace

extern "C" __attribute__((visibility("default"))) NetResult tuttiNetSetOption(const char* key,
                                                                              const char* value) {
  return setOption(key, value);
}

extern "C" __attribute__((visibility("default")))
const tutti::transport::ncclnet::NetV8 ncclNetPlugin_v8 = {
    "ucx",     ucxInit,  ucxDevices,     ucxGetProperties, ucxListen,      v8Connect,
    v8Accept,  ucxRegMr, ucxRegMrDmaBuf, ucxDeregMr,       ucxIsend,       ucxIrecv,
    ucxIflush, ucxTest,  ucxCloseSend,   ucxCloseRecv,     ucxCloseListen,
    nullptr,  // getDeviceMr
    nullptr,  // irecvConsumed
};
