#include "core/device_ipc.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <type_traits>

#include "base/log.h"
#include "base/params.h"
#include "nccl.h"

namespace tutti::core {

using algo::Collective;
using Clock = std::chrono::steady_clock;

namespace {

// ---- file descriptors between processes (abstract unix sockets) ----------

// The listener name of `rank` (process `pid`) of the communicator `hash`;
// abstract (leading NUL), so nothing is left in the file system.
sockaddr_un socketName(uint64_t hash, int rank, int pid, socklen_t* len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  int n = snprintf(a.sun_path + 1, sizeof(a.sun_path) - 1, "tutti-ipc-%016llx-%d-%d",
                   static_cast<unsigned long long>(hash), rank, pid);
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
  return a;
}

Status sysError(const std::string& what) {
  return Status(Code::kSystemError, what + ": " + strerror(errno));
}

struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Fd& operator=(Fd&& o) noexcept {
    std::swap(fd, o.fd);
    return *this;
  }
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

Result<Fd> listenOn(uint64_t hash, int rank, int nranks) {
  socklen_t len;
  sockaddr_un a = socketName(hash, rank, getpid(), &len);
  Fd s(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (s.fd < 0) return sysError("IPC: socket(AF_UNIX)");
  if (bind(s.fd, reinterpret_cast<sockaddr*>(&a), len) != 0)
    return sysError("IPC: bind of the abstract socket " + std::string(a.sun_path + 1));
  if (listen(s.fd, nranks) != 0) return sysError("IPC: listen");
  return s;
}

// One message of the descriptor exchange: the sender's rank as data, room
// for one SCM_RIGHTS descriptor as control (pointers into itself: not copied).
struct FdMessage {
  int32_t rank = -1;
  iovec iov{&rank, sizeof(rank)};
  alignas(cmsghdr) char ctl[CMSG_SPACE(sizeof(int))] = {};
  msghdr m{};
  FdMessage() {
    m.msg_iov = &iov;
    m.msg_iovlen = 1;
    m.msg_control = ctl;
    m.msg_controllen = sizeof(ctl);
  }
  FdMessage(const FdMessage&) = delete;
  FdMessage& operator=(const FdMessage&) = delete;
};

// Sends this rank's number and `fd` to the listener of peer `q` (pid `pid`).
// The message waits in the peer's socket until it accepts.
Status sendFd(uint64_t hash, int rank, int q, int pid, int fd) {
  socklen_t len;
  sockaddr_un a = socketName(hash, q, pid, &len);
  Fd s(socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (s.fd < 0) return sysError("IPC: socket(AF_UNIX)");
  if (connect(s.fd, reinterpret_cast<sockaddr*>(&a), len) != 0)
    return sysError("IPC: connect to rank " + std::to_string(q) + "'s socket");
  FdMessage msg;
  msg.rank = rank;
  cmsghdr* c = CMSG_FIRSTHDR(&msg.m);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int));
  memcpy(CMSG_DATA(c), &fd, sizeof(int));
  ssize_t n;
  do n = sendmsg(s.fd, &msg.m, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  if (n != static_cast<ssize_t>(sizeof(msg.rank)))
    return sysError("IPC: passing a file descriptor to rank " + std::to_string(q));
  return Status();
}

// Accepts one connection from a peer's process and receives (rank, fd); the
// sender's pid must be that rank's in `peers`. The name of the listener is
// visible to every local user (/proc/net/unix): a connection from any other
// process is closed unread, and the wait goes on.
Status recvFd(int listener, const std::vector<PeerInfo>& peers, Clock::time_point deadline,
              const std::atomic<bool>* abortFlag, int* rankOut, Fd* fdOut) {
  Fd conn;
  ucred cred{};
  for (;;) {
    int c = accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
    if (c >= 0) {
      conn = Fd(c);
      socklen_t cl = sizeof(cred);
      if (getsockopt(c, SOL_SOCKET, SO_PEERCRED, &cred, &cl) != 0)
        return sysError("IPC: SO_PEERCRED");
      bool peer = std::any_of(peers.begin(), peers.end(),
                              [&](const PeerInfo& p) { return p.pid == cred.pid; });
      if (peer) break;
      TUTTI_WARN(
          "IPC: closed a connection to the descriptor socket from pid {}, not a process of "
          "this communicator",
          cred.pid);
      conn = Fd();
      continue;
    }
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return sysError("IPC: accept");
    if (abortFlag && abortFlag->load()) return invalidUsage("communicator aborted");
    if (Clock::now() >= deadline)
      return systemError("IPC: timed out waiting for a peer's descriptor");
    pollfd p{listener, POLLIN, 0};
    poll(&p, 1, 50);
  }
  const int c = conn.fd;
  // The message was sent before accept; the socket is blocking (accept4 gives
  // a blocking socket), but bound the wait anyway.
  timeval tv{5, 0};
  setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  FdMessage msg;
  ssize_t n;
  do n = recvmsg(c, &msg.m, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  Fd got;
  for (cmsghdr* h = CMSG_FIRSTHDR(&msg.m); h; h = CMSG_NXTHDR(&msg.m, h))
    if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS)
      memcpy(&got.fd, CMSG_DATA(h), sizeof(int));
  const int32_t who = msg.rank;
  if (n != static_cast<ssize_t>(sizeof(msg.rank)) || got.fd < 0)
    return Status(Code::kSystemError, "IPC: a peer's message carried no file descriptor");
  if (who < 0 || who >= static_cast<int>(peers.size()) || cred.pid != peers[who].pid)
    return Status(Code::kSystemError, "IPC: a connection claiming rank " + std::to_string(who) +
                                          " came from pid " + std::to_string(cred.pid) +
                                          ", not that rank's process");
  *rankOut = who;
  *fdOut = std::move(got);
  return Status();
}

// All-reduces up to this size skip the reduce-scatter/all-gather split.
constexpr size_t kOneShotBytes = 64 << 10;

// Elements of slice j when `count` elements are cut into n near-equal slices.
void sliceOf(size_t count, int n, int j, size_t* start, size_t* len) {
  const size_t base = count / n, rem = count % n, jj = static_cast<size_t>(j);
  *start = jj * base + std::min(jj, rem);
  *len = base + (jj < rem ? 1 : 0);
}

}  // namespace

Result<std::unique_ptr<DeviceIpc>> DeviceIpc::negotiate(Comm* comm, Backend* backend, int device) {
  const int n = comm->nranks(), rank = comm->rank();
  struct Offer {
    int32_t want;
    int32_t reserved;
    uint64_t chunk;
    uint64_t minBytes;
    char backend[48];
  };
  static_assert(sizeof(Offer) == 72 && std::is_trivially_copyable_v<Offer>);
  std::vector<Offer> offers(n);
  Offer& me = offers[rank];
  me.want =
      !backend->hostOnly() && backend->hasIpc() && !params::getBool("NCCL_SHM_DISABLE", false) &&
      !params::getBool("NCCL_P2P_DISABLE", false) && params::getBool("TUTTI_DEVICE_IPC", true);
  int64_t chunk = params::getInt("TUTTI_IPC_CHUNK_BYTES", 4 << 20);
  chunk = std::clamp<int64_t>(chunk, 64 << 10, int64_t(1) << 30) / 4096 * 4096;
  me.chunk = static_cast<uint64_t>(chunk);
  me.minBytes =
      static_cast<uint64_t>(std::max<int64_t>(0, params::getInt("TUTTI_IPC_MIN_BYTES", 0)));
  snprintf(me.backend, sizeof(me.backend), "%s", backend->name().c_str());
  TUTTI_RETURN_IF_ERROR(comm->bootstrap().allGather(offers.data(), sizeof(Offer)));
  std::string why;
  uint64_t agreedChunk = me.chunk, agreedMin = me.minBytes;
  for (int q = 0; q < n && why.empty(); ++q) {
    offers[q].backend[sizeof(offers[q].backend) - 1] = 0;
    if (!offers[q].want)
      why = "rank " + std::to_string(q) +
            " does not offer it (host-only backend, no IPC in its "
            "plugin, NCCL_SHM_DISABLE, NCCL_P2P_DISABLE or TUTTI_DEVICE_IPC=0)";
    else if (strcmp(offers[q].backend, me.backend) != 0)
      why = "rank " + std::to_string(q) + " uses backend " + offers[q].backend;
    agreedChunk = std::min<uint64_t>(agreedChunk, offers[q].chunk);
    agreedMin = std::max<uint64_t>(agreedMin, offers[q].minBytes);
  }
  if (!why.empty()) {
    if (me.want) TUTTI_INFO(log::kShm, "device IPC not used: {}", why);
    return std::unique_ptr<DeviceIpc>();
  }
  std::unique_ptr<DeviceIpc> ipc(new DeviceIpc(comm, backend, device, agreedChunk, agreedMin));
  Status st = ipc->setUp();
  if (!st) {
    if (st.code() == Code::kRemoteError || comm->aborted()) return st;  // the peers are gone
    TUTTI_INFO(log::kShm, "device IPC not used: {}", st.message());
    return std::unique_ptr<DeviceIpc>();
  }
  TUTTI_INFO(log::kShm,
             "device IPC: collectives of {} bytes and more run device to device in chunks of "
             "{} bytes ({} backend)",
             agreedMin, agreedChunk, backend->name());
  return ipc;
}

// Set-up in collective phases; a local failure is carried to the next
// exchange so every rank gives up at the same point. Errors returned as
// kRemoteError are the control plane's own (a peer gone): the communicator
// is broken then, not just IPC.
Status DeviceIpc::setUp() {
  const int n = comm_->nranks(), rank = comm_->rank();
  auto& boot = comm_->bootstrap();
  const bool needsFd = be_->capabilities() & TUTTI_PLUGIN_CAP_IPC_NEEDS_FD;
  struct Record {
    int32_t ok;
    int32_t reserved;
    tuttiPluginIpcHandle_v1 handle;
  };
  static_assert(std::is_trivially_copyable_v<Record>);
  std::vector<Record> recs(n);
  Record& me = recs[rank];
  me.handle.structSize = sizeof(tuttiPluginIpcHandle_v1);
  me.handle.fd = -1;
  Status local;
  Fd listener, exported;
  auto mem = be_->alloc(device_, 2 * chunk_);
  if (!mem) local = mem.status();
  if (local) {
    mine_ = mem.value();
    std::vector<int32_t> pids;
    for (int q = 0; q < n; ++q)
      if (q != rank) pids.push_back(comm_->peer(q).pid);
    local =
        be_->ipcExport(mine_, 2 * chunk_, pids.data(), static_cast<int>(pids.size()), &me.handle);
    exported.fd = me.handle.fd;
    me.handle.fd = -1;
    if (local && needsFd && exported.fd < 0)
      local = Status(Code::kInternalError,
                     "the backend needs a file descriptor for IPC but exported none");
  }
  if (local && needsFd) {
    auto l = listenOn(comm_->commHash(), rank, n);
    if (l)
      listener = std::move(l.value());
    else
      local = l.status();
  }
  // Phase 1: handles (and, for descriptors, everyone is listening).
  auto failed = [&](const char* phase) -> std::string {
    for (int q = 0; q < n; ++q)
      if (!recs[q].ok)
        return "rank " + std::to_string(q) + " failed to " + phase +
               (q == rank ? ": " + local.message() : "");
    return "";
  };
  std::vector<Fd> peerFds(n);
  bufs_.assign(n, nullptr);
  bufs_[rank] = mine_;
  // Gives up on IPC: closes what was imported, waits until the peers have
  // closed theirs (when they can still be reached), frees the buffers.
  auto giveUp = [&](const Status& why, bool peersReachable) {
    for (int q = 0; q < n; ++q)
      if (q != rank && bufs_[q]) (void)be_->ipcClose(bufs_[q]);
    bufs_.clear();
    Status b = peersReachable ? boot.barrier() : Status();
    if (mine_) (void)be_->free(mine_);
    mine_ = nullptr;
    if (!peersReachable || !b) return remoteError(b ? why.message() : b.message());
    return internalError(why.message());
  };
  // Every rank reports how its part of `phase` went (with its record);
  // false, and *result what setUp returns, when any rank failed.
  auto agree = [&](const char* phase, Status* result) {
    for (auto& r : recs) r.ok = 1;
    me.ok = local.isOk();
    Status st = boot.allGather(recs.data(), sizeof(Record));
    if (!st) {
      *result = giveUp(st, false);
      return false;
    }
    std::string why = failed(phase);
    if (!why.empty()) *result = giveUp(internalError(why), true);
    return why.empty();
  };
  Status result;
  if (!agree("allocate and export its IPC buffers", &result)) return result;
  // Phase 2: descriptors, each rank to each other (queued in the listener's
  // backlog, so sending first cannot deadlock), then everyone accepts.
  if (needsFd) {
    for (int q = 0; q < n && local; ++q)
      if (q != rank) local = sendFd(comm_->commHash(), rank, q, comm_->peer(q).pid, exported.fd);
    if (!agree("pass its descriptor to every peer", &result)) return result;
    for (int k = 0; k < n - 1 && local; ++k) {
      int who = -1;
      Fd fd;
      local = recvFd(listener.fd, comm_->bootstrap().peers(), boot.deadline(), comm_->abortFlag(),
                     &who, &fd);
      if (local && peerFds[who].fd >= 0)
        local = Status(Code::kSystemError, "IPC: two descriptors from rank " + std::to_string(who));
      if (local) peerFds[who] = std::move(fd);
    }
  }
  // Phase 3: import every peer's buffers.
  for (int q = 0; q < n && local; ++q) {
    if (q == rank) continue;
    tuttiPluginIpcHandle_v1 h = recs[q].handle;
    h.fd = peerFds[q].fd;
    auto p = be_->ipcImport(device_, h);
    if (!p)
      local = p.status();
    else
      bufs_[q] = p.value();
  }
  peerFds.clear();  // the backend dup()ed what it keeps
  if (!agree("import its peers' IPC buffers", &result)) return result;
  // Phase 4: the barriers' own arena (collective; nullptr on every rank or none).
  auto control = OneShot::create(comm_, 64);
  if (!control) return giveUp(control.status(), false);
  if (!control.value())
    return giveUp(internalError("no shared-memory arena for its barriers"), true);
  control_ = std::move(control.value());
  // The event each step's device work is followed by (polled, so nothing
  // blocks); without one a step drains its stream blocking.
  auto ev = be_->eventCreate(device_);
  if (ev)
    event_ = ev.value();
  else
    TUTTI_INFO(log::kShm, "device IPC: no event ({}): each step drains its stream blocking",
               ev.status().message());
  srcs_.resize(n);
  return Status();
}

DeviceIpc::~DeviceIpc() {
  control_.reset();
  if (event_) (void)be_->eventDestroy(event_);
  const int rank = comm_->rank();
  for (size_t q = 0; q < bufs_.size(); ++q)
    if (static_cast<int>(q) != rank && bufs_[q]) (void)be_->ipcClose(bufs_[q]);
  if (mine_) (void)be_->free(mine_);
}

bool DeviceIpc::takes(Collective coll, size_t count, size_t elemSize, bool raw) const {
  if (!raw || count == 0 || coll == Collective::kSend || coll == Collective::kRecv) return false;
  return count * elemSize >= minBytes_;
}

namespace {

// 24 bits of the call a device-IPC collective runs (collective, count,
// datatype, operator, root, call number): the barriers carry them in their
// one-shot signature (operator and root fields), and the arena compares the
// ranks' signatures before anyone reads a peer's data, so mismatched calls
// fail at the first barrier instead of combining different calls.
uint32_t fingerprintOf(const IpcOp& op) {
  uint64_t words[] = {static_cast<uint64_t>(op.coll), op.count, static_cast<uint64_t>(op.datatype),
                      static_cast<uint64_t>(static_cast<uint32_t>(op.redop)),
                      static_cast<uint64_t>(static_cast<uint32_t>(op.root)), op.call};
  uint32_t h = 2166136261u;
  for (uint64_t w : words)
    for (int b = 0; b < 8; ++b) h = (h ^ static_cast<uint8_t>(w >> (8 * b))) * 16777619u;
  return (h ^ (h >> 24)) & 0xffffff;
}

}  // namespace

void DeviceIpc::postBarrier(IpcRun& run) {
  const int n = comm_->nranks();
  run.all.assign(n, 0);
  run.mine = run.local.isOk() ? 0 : 1 + static_cast<int64_t>(run.local.code());
  run.meet = OneShotOp();
  run.meet.coll = Collective::kAllGather;
  run.meet.send = reinterpret_cast<const uint8_t*>(&run.mine);
  run.meet.recv = reinterpret_cast<uint8_t*>(run.all.data());
  run.meet.count = sizeof(int64_t);
  run.meet.elemSize = 1;
  run.meet.spec.dt = DataType::kUint8;
  const uint32_t fp = fingerprintOf(run.op);
  run.meet.redop = static_cast<int>(fp & 0xff);
  run.meet.root = static_cast<int>(fp >> 8);
}

Status DeviceIpc::meetError(const IpcRun& run, const Status& st) const {
  if (st.code() != Code::kInvalidUsage || st.message().find("collective mismatch") == std::string::npos)
    return st;
  return invalidUsage(fmt::format(
      "collective mismatch on the device-to-device path: a peer's call is not this rank's {} of "
      "{} x {} (op {}, root {}, collective call {}): the ranks called collectives in a different "
      "order or with different counts, datatypes, ops or roots (the barrier's fingerprints "
      "differ: {})",
      algo::collectiveName(run.op.coll), run.op.count,
      dataTypeName(static_cast<DataType>(run.op.datatype)), run.op.redop, run.op.root,
      run.op.call, st.message()));
}

Status DeviceIpc::barrierResult(const IpcRun& run) const {
  if (!run.local) return run.local;
  for (size_t q = 0; q < run.all.size(); ++q)
    if (run.all[q])
      return Status(static_cast<Code>(run.all[q] - 1),
                    "rank " + std::to_string(q) + " failed a device step of this collective");
  return Status();
}

Status DeviceIpc::copyIn(const IpcOp& op, uint8_t* dst, const uint8_t* src, size_t elems) {
  if (!op.scalar) return be_->copyAsync(dst, src, elems * op.elemSize, op.stream);
  tuttiPluginReduceArgs_v1 a{};
  a.structSize = sizeof(a);
  a.datatype = op.datatype;
  a.op = TUTTI_PLUGIN_OP_PREMULSUM;
  a.nSrcs = 1;
  a.count = elems;
  a.dst = dst;
  const void* s[1] = {src};
  a.srcs = s;
  a.scalar = op.scalar;
  a.scalarResidence = op.scalarOnDevice ? ncclScalarDevice : ncclScalarHostImmediate;
  a.avgDivisor = 1;
  return be_->reduce(a, op.stream);
}

Status DeviceIpc::reduceFrom(const IpcOp& op, void* dst, uint64_t round, size_t off, size_t elems) {
  const int n = comm_->nranks();
  for (int q = 0; q < n; ++q) srcs_[q] = buf(q, round) + off;
  tuttiPluginReduceArgs_v1 a{};
  a.structSize = sizeof(a);
  a.datatype = op.datatype;
  a.op = op.reduceOp;
  a.nSrcs = n;
  a.count = elems;
  a.dst = dst;
  a.srcs = srcs_.data();
  a.scalarResidence = ncclScalarHostImmediate;
  a.avgDivisor = static_cast<uint32_t>(n);
  return be_->reduce(a, op.stream);
}

// The steps of `op`'s rounds. Each round writes buffer r % 2 of every rank;
// a step with a barrier is where the ranks meet, carrying each one's status,
// so a failed step ends the operation on every rank at the same point.
Status DeviceIpc::start(const IpcOp& op, IpcRun* run) {
  *run = IpcRun();
  run->op = op;
  const int n = comm_->nranks(), rank = comm_->rank();
  const size_t E = op.elemSize, count = op.count;
  const auto* send = static_cast<const uint8_t*>(op.send);
  auto* recv = static_cast<uint8_t*>(op.recv);
  const Queue q = op.stream;
  // Elements per round: the whole chunk, or a region of it per rank.
  const bool regions = op.coll == Collective::kReduceScatter || op.coll == Collective::kScatter ||
                       op.coll == Collective::kAllToAll;
  const size_t perRound = std::max<size_t>(1, chunk_ / E / (regions ? n : 1));
  switch (op.coll) {
    case Collective::kAllReduce:
    case Collective::kReduceScatter:
    case Collective::kReduce:
    case Collective::kBroadcast:
    case Collective::kAllGather:
    case Collective::kGather:
    case Collective::kScatter:
    case Collective::kAllToAll:
      break;
    default:
      return Status(Code::kInternalError,
                    std::string("device IPC cannot run ") + algo::collectiveName(op.coll));
  }
  ++ops_;
  auto add = [run](std::function<Status()> work, bool barrier) {
    run->steps.push_back({std::move(work), barrier});
  };
  for (size_t off = 0; off < count; off += perRound) {
    const size_t c = std::min(perRound, count - off);
    const uint64_t r = round_++;
    uint8_t* own = buf(rank, r);
    // Block p's part of this round into region p (reduce-scatter, scatter,
    // all-to-all).
    auto copyInRegions = [this, op, own, send, c, off, count, E, n] {
      Status st;
      for (int p = 0; p < n && st; ++p)
        st = copyIn(op, own + p * c * E, send + (p * count + off) * E, c);
      return st;
    };
    switch (op.coll) {
      case Collective::kAllReduce: {
        // Round k: reduce this rank's slice in place, meet, gather every
        // slice and (same step) copy in round k+1's input, meet. Round k+1
        // writes the other buffer, whose last readers (round k-1's gathers)
        // finished before the meeting after round k's reduction.
        if (off == 0) add([this, op, own, send, c] { return copyIn(op, own, send, c); }, true);
        if (count * E <= kOneShotBytes) {
          // Small: every rank reduces the whole message (the same sources in
          // the same order, so the same bits everywhere); no gather.
          add([this, op, recv, r, c] { return reduceFrom(op, recv, r, 0, c); }, false);
          break;
        }
        size_t s0, len;
        sliceOf(c, n, rank, &s0, &len);
        add([this, op, own, r, s0, len,
             E] { return len ? reduceFrom(op, own + s0 * E, r, s0 * E, len) : Status(); },
            true);
        const size_t next = off + c;
        add(
            [this, op, recv, r, c, off, next, count, perRound, send, E, n, rank, q] {
              Status st;
              for (int p = 0; p < n && st; ++p) {
                size_t p0, plen;
                sliceOf(c, n, p, &p0, &plen);
                if (plen)
                  st = be_->copyAsync(recv + (off + p0) * E, buf(p, r) + p0 * E, plen * E, q);
              }
              if (st && next < count)
                st =
                    copyIn(op, buf(rank, r + 1), send + next * E, std::min(perRound, count - next));
              return st;
            },
            next < count);
        break;
      }
      case Collective::kReduceScatter:
        add(copyInRegions, true);
        add([this, op, recv, r, off, rank, c,
             E] { return reduceFrom(op, recv + off * E, r, rank * c * E, c); },
            false);
        break;
      case Collective::kReduce:
        add([this, op, own, send, off, c, E] { return copyIn(op, own, send + off * E, c); }, true);
        if (rank == op.root)
          add([this, op, recv, r, off, c, E] { return reduceFrom(op, recv + off * E, r, 0, c); },
              false);
        break;
      case Collective::kBroadcast:
        add([this, op, own, send, off, c, E,
             rank] { return rank == op.root ? copyIn(op, own, send + off * E, c) : Status(); },
            true);
        if (rank != op.root)
          add([this, recv, r, off, c, E, q,
               root = op.root] { return be_->copyAsync(recv + off * E, buf(root, r), c * E, q); },
              false);
        else if (send != recv)
          add([this, recv, send, off, c, E,
               q] { return be_->copyAsync(recv + off * E, send + off * E, c * E, q); },
              false);
        break;
      case Collective::kAllGather:
      case Collective::kGather:
        add([this, op, own, send, off, c, E] { return copyIn(op, own, send + off * E, c); }, true);
        if (op.coll == Collective::kGather && rank != op.root) break;
        add(
            [this, recv, r, off, c, E, q, n, count] {
              Status st;
              for (int p = 0; p < n && st; ++p)
                st = be_->copyAsync(recv + (p * count + off) * E, buf(p, r), c * E, q);
              return st;
            },
            false);
        break;
      case Collective::kScatter:
        add([copyInRegions, rank,
             root = op.root] { return rank == root ? copyInRegions() : Status(); },
            true);
        add(
            [this, recv, r, off, c, E, q, rank, root = op.root] {
              return be_->copyAsync(recv + off * E, buf(root, r) + rank * c * E, c * E, q);
            },
            false);
        break;
      case Collective::kAllToAll:
        add(copyInRegions, true);
        add(
            [this, recv, r, off, c, E, q, n, rank, count] {
              Status st;
              for (int p = 0; p < n && st; ++p)
                st = be_->copyAsync(recv + (p * count + off) * E, buf(p, r) + rank * c * E, c * E,
                                    q);
              return st;
            },
            false);
        break;
      default:
        break;
    }
  }
  // Nobody leaves while a peer may still read its buffers.
  add(nullptr, true);
  return Status();
}

// The step in progress has had its device work done: its barrier next, or
// the next step.
void DeviceIpc::endStep(IpcRun& run) {
  if (run.steps[run.next].barrier) {
    postBarrier(run);
    run.phase = IpcRun::Phase::kBarrier;
  } else {
    run.phase = IpcRun::Phase::kStep;
    ++run.next;
  }
}

Status DeviceIpc::progress(IpcRun& run, bool* moved, bool block) {
  const Queue q = run.op.stream;
  // Waits for the queued work blocking; its error, if the first, is the step's.
  auto drain = [&] {
    Status d = be_->sync(q);
    if (run.local) run.local = d;
  };
  for (;;) {
    switch (run.phase) {
      case IpcRun::Phase::kStep: {
        if (run.next == run.steps.size()) {
          run.done = true;
          return run.local;
        }
        const IpcRun::Step& st = run.steps[run.next];
        *moved = true;
        if (st.work) {
          // The work only while this rank is still well (a failed step's
          // error travels to the next barrier); the wait always, so no
          // queued work outlives a failed step.
          if (run.local) run.local = st.work();
          if (event_ && !block) {
            Status rec = be_->eventRecord(event_, q);
            if (rec) {
              run.phase = IpcRun::Phase::kDevice;
              break;
            }
            if (run.local) run.local = rec;
          }
          drain();
        }
        endStep(run);
        break;
      }
      case IpcRun::Phase::kDevice: {
        auto done = be_->eventDone(event_);
        if (done && !done.value()) return Status();
        if (!done) {
          if (run.local) run.local = done.status();
          drain();
        }
        *moved = true;
        endStep(run);
        break;
      }
      case IpcRun::Phase::kBarrier: {
        if (block)
          TUTTI_RETURN_IF_ERROR(meetError(run, control_->run(run.meet)));  // sleeps on its doorbell
        else
          TUTTI_RETURN_IF_ERROR(meetError(run, control_->progress(run.meet, moved)));
        if (!run.meet.done) return Status();
        TUTTI_RETURN_IF_ERROR(barrierResult(run));
        run.local = Status();
        run.phase = IpcRun::Phase::kStep;
        ++run.next;
        break;
      }
    }
  }
}

void DeviceIpc::quiesce(IpcRun& run) {
  if (run.phase != IpcRun::Phase::kDevice) return;
  (void)be_->sync(run.op.stream);
  run.phase = IpcRun::Phase::kStep;
}

Status DeviceIpc::check(const IpcRun& run, Clock::duration idle) const {
  if (run.phase != IpcRun::Phase::kBarrier) return Status();
  return meetError(run, control_->check(run.meet, idle));
}

}  // namespace tutti::core
