#include "transports/shm/shm_transport.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <type_traits>

#include "base/log.h"
#include "base/thread.h"
#include "transports/handshake_util.h"
#include "transports/shm/shm_arena.h"

namespace tutti::transport::shm {
namespace {

constexpr const char* kName = "SHM";
constexpr uint64_t kOfferMagic = 0x7475747469534f46ull;
constexpr uint64_t kAckMagic = 0x7475747469534143ull;
constexpr uint64_t kTagOffer = 0;
constexpr uint64_t kTagAck = 1;

// Lower -> higher: where the segment is.
struct Offer {
  uint64_t magic;
  uint64_t segBytes;
  uint64_t ringBytes;
  int32_t rank;
  int32_t channel;
  char name[192];
};
static_assert(std::is_trivially_copyable_v<Offer> && sizeof(Offer) == 224);

// Higher -> lower: mapped (err == 0) or the errno of the failure.
struct Ack {
  uint64_t magic;
  int32_t err;
  int32_t rank;
};
static_assert(std::is_trivially_copyable_v<Ack> && sizeof(Ack) == 16);

// Unlinks a shm name when it goes out of scope (idempotent; ENOENT is fine:
// the peer may have unlinked it first).
class NameGuard {
 public:
  explicit NameGuard(std::string name) : name_(std::move(name)) {}
  ~NameGuard() { release(); }
  void release() {
    if (!name_.empty()) shm_unlink(name_.c_str());
    name_.clear();
  }

 private:
  std::string name_;
};

uint64_t randomU64() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

Status mapFd(int fd, size_t bytes, void** base) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) return errnoError(fmt::format("mmap of {} bytes", bytes), errno);
  *base = p;
  return Status::ok();
}

// The ring `side` receives from, near this rank when the caller says where
// that is (the sender writes each byte once; the receiver reads it, and the
// header's control lines, in every poll).
void placeReceiveRing(const ConnectContext& ctx, SegmentHeader* hdr, int side) {
  if (!ctx.placeNear) return;
  const int in = 1 - side;
  ctx.placeNear(reinterpret_cast<uint8_t*>(hdr) + hdr->dataOffset[in],
                roundUp(hdr->ringBytes, kPage));
}

Result<std::unique_ptr<Connection>> connectLower(const ConnectContext& ctx) {
  const size_t ringBytes = ctx.bufferBytes;
  const size_t segBytes = segmentBytes(ringBytes);
  const std::string name = fmt::format("/tutti-{:016x}-{}-{}-{}-{:016x}", ctx.commHash, ctx.rank,
                                       ctx.peer, ctx.channel, randomU64());
  const std::string who = fmt::format("SHM: segment {} for rank {}", name, ctx.peer);

  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return errnoError(who + ": shm_open", errno);
  NameGuard guard(name);
  if (ftruncate(fd, static_cast<off_t>(segBytes)) != 0) {
    int err = errno;
    close(fd);
    return errnoError(who + ": ftruncate", err);
  }
  // Reserve the pages now: a full /dev/shm must fail here, not SIGBUS later.
  int err = posix_fallocate(fd, 0, static_cast<off_t>(segBytes));
  if (err != 0 && err != EINVAL && err != EOPNOTSUPP) {
    close(fd);
    return errnoError(
        fmt::format("{}: reserving {} bytes in /dev/shm (is it large enough?)", who, segBytes),
        err);
  }
  void* base = nullptr;
  Status st = mapFd(fd, segBytes, &base);
  close(fd);
  if (!st.isOk()) return st.withContext(who);

  SegmentHeader* hdr = initSegment(base, ringBytes);
  hdr->pid[0].store(getpid(), std::memory_order_release);
  placeReceiveRing(ctx, hdr, 0);
  // From here on the connection owns the mapping; if the handshake fails, its
  // destructor marks our side closed so a peer that did map it errors out.
  auto conn = std::make_unique<ShmConnection>(base, segBytes, 0, ctx.rank, ctx.peer, ctx.channel);
  conn->setPeerBell(ctx.peerBell);

  Offer offer{};
  offer.magic = kOfferMagic;
  offer.segBytes = segBytes;
  offer.ringBytes = ringBytes;
  offer.rank = ctx.rank;
  offer.channel = ctx.channel;
  std::snprintf(offer.name, sizeof(offer.name), "%s", name.c_str());
  TUTTI_RETURN_IF_ERROR(
      detail::controlSend(ctx, kTagOffer, &offer, sizeof(offer), kName, "sending segment name"));

  auto reply = detail::controlRecv(ctx, kTagAck, kName, "waiting for the segment ack");
  guard.release();  // unlink now, whatever the outcome
  if (!reply.isOk()) return reply.status();
  Ack ack{};
  if (reply->size() != sizeof(Ack)) {
    return remoteError(
        fmt::format("SHM: malformed ack from rank {} ({} bytes)", ctx.peer, reply->size()));
  }
  std::memcpy(&ack, reply->data(), sizeof(ack));
  if (ack.magic != kAckMagic || ack.rank != ctx.peer) {
    return remoteError(fmt::format("SHM: malformed ack from rank {}", ctx.peer));
  }
  if (ack.err != 0) {
    return remoteError(fmt::format("SHM: rank {} could not map segment {}: {}", ctx.peer, name,
                                   std::strerror(ack.err)));
  }
  TUTTI_INFO(log::kShm, "SHM: connected to rank {} channel {} ({} bytes per direction)", ctx.peer,
             ctx.channel, ringBytes);
  return std::unique_ptr<Connection>(std::move(conn));
}

Result<std::unique_ptr<Connection>> connectHigher(const ConnectContext& ctx) {
  TUTTI_ASSIGN_OR_RETURN(
      auto msg, detail::controlRecv(ctx, kTagOffer, kName, "waiting for the segment name"));
  Offer offer{};
  if (msg.size() != sizeof(Offer)) {
    return remoteError(
        fmt::format("SHM: malformed segment offer from rank {} ({} bytes)", ctx.peer, msg.size()));
  }
  std::memcpy(&offer, msg.data(), sizeof(offer));
  offer.name[sizeof(offer.name) - 1] = '\0';
  if (offer.magic != kOfferMagic || offer.rank != ctx.peer || offer.channel != ctx.channel ||
      offer.ringBytes == 0 || offer.segBytes != segmentBytes(offer.ringBytes)) {
    return remoteError(fmt::format("SHM: malformed segment offer from rank {}", ctx.peer));
  }
  const std::string name = offer.name;
  const std::string who = fmt::format("SHM: segment {} from rank {}", name, ctx.peer);

  auto nack = [&](int err) {
    Ack ack{kAckMagic, err == 0 ? EIO : err, ctx.rank};
    (void)ctx.control->send(ctx.peer, ctx.tagBase + kTagAck, &ack, sizeof(ack));
  };

  int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    int err = errno;
    nack(err);
    return errnoError(who + ": shm_open", err);
  }
  shm_unlink(name.c_str());  // either side may unlink first
  struct stat sb {};
  if (fstat(fd, &sb) != 0 || static_cast<uint64_t>(sb.st_size) < offer.segBytes) {
    int err = errno ? errno : EINVAL;
    close(fd);
    nack(err);
    return remoteError(fmt::format("{}: segment is smaller than announced", who));
  }
  void* base = nullptr;
  Status st = mapFd(fd, offer.segBytes, &base);
  close(fd);
  if (!st.isOk()) {
    nack(ENOMEM);
    return st.withContext(who);
  }
  auto* hdr = static_cast<SegmentHeader*>(base);
  if (hdr->magic != kSegmentMagic || hdr->version != kSegmentVersion ||
      hdr->ringBytes != offer.ringBytes) {
    munmap(base, offer.segBytes);
    nack(EPROTO);
    return remoteError(fmt::format("{}: bad segment header", who));
  }
  hdr->pid[1].store(getpid(), std::memory_order_release);
  placeReceiveRing(ctx, hdr, 1);
  auto conn =
      std::make_unique<ShmConnection>(base, offer.segBytes, 1, ctx.rank, ctx.peer, ctx.channel);
  conn->setPeerBell(ctx.peerBell);
  Ack ack{kAckMagic, 0, ctx.rank};
  TUTTI_RETURN_IF_ERROR(detail::controlSend(ctx, kTagAck, &ack, sizeof(ack), kName, "sending ack"));
  TUTTI_INFO(log::kShm, "SHM: connected to rank {} channel {} ({} bytes per direction)", ctx.peer,
             ctx.channel, offer.ringBytes);
  return std::unique_ptr<Connection>(std::move(conn));
}

}  // namespace

ShmConnection::ShmConnection(void* base, size_t mapBytes, int side, int rank, int peer, int channel)
    : base_(base),
      mapBytes_(mapBytes),
      hdr_(static_cast<SegmentHeader*>(base)),
      side_(side),
      rank_(rank),
      peer_(peer),
      channel_(channel) {
  auto* bytes = static_cast<uint8_t*>(base);
  const int out = side;     // we produce on ring[side]
  const int in = 1 - side;  // and consume ring[1 - side]
  send_ = SpscRing(&hdr_->ring[out], bytes + hdr_->dataOffset[out], hdr_->ringBytes);
  recv_ = SpscRing(&hdr_->ring[in], bytes + hdr_->dataOffset[in], hdr_->ringBytes);
}

ShmConnection::~ShmConnection() {
  hdr_->closed[side_].store(1, std::memory_order_release);
  munmap(base_, mapBytes_);
}

bool ShmConnection::peerClosed() const {
  return hdr_->closed[1 - side_].load(std::memory_order_acquire) != 0;
}

Status ShmConnection::closedError() const {
  return remoteError(
      fmt::format("SHM: connection to rank {} (channel {}) closed by peer", peer_, channel_));
}

Status ShmConnection::abortedError() const {
  return internalError(
      fmt::format("SHM: connection to rank {} (channel {}) was aborted", peer_, channel_));
}

Result<size_t> ShmConnection::trySend(const void* data, size_t bytes) {
  if (aborted_.load(std::memory_order_relaxed)) return abortedError();
  if (peerClosed()) return closedError();
  const size_t n = send_.write(data, bytes);
  if (n && peerBell_) ring(peerBell_);  // data for a peer that may sleep
  return n;
}

Result<size_t> ShmConnection::tryRecv(void* data, size_t bytes) {
  if (aborted_.load(std::memory_order_relaxed)) return abortedError();
  if (bytes == 0) return size_t{0};
  size_t n = recv_.read(data, bytes);
  if (n > 0) {
    if (peerBell_) ring(peerBell_);  // space for a peer that may sleep on a full ring
    return n;
  }
  if (peerClosed()) {
    // The peer's last head store happened before its closed store; drain it.
    n = recv_.read(data, bytes);
    if (n > 0) return n;
    return closedError();
  }
  return size_t{0};
}

const void* ShmConnection::peek(size_t* avail) {
  if (aborted_.load(std::memory_order_relaxed)) {
    *avail = 0;
    return nullptr;
  }
  return recv_.peek(avail);
}

void ShmConnection::consume(size_t bytes) {
  recv_.consume(bytes);
  if (bytes && peerBell_) ring(peerBell_);
}

Status ShmConnection::checkAlive() {
  if (aborted_.load(std::memory_order_relaxed)) return abortedError();
  if (peerClosed()) return closedError();
  const int64_t pid = hdr_->pid[1 - side_].load(std::memory_order_acquire);
  if (pid > 0 && base::processDead(static_cast<pid_t>(pid))) {
    return remoteError(fmt::format(
        "SHM: rank {} (pid {}) is gone: its process no longer exists (seen from rank {})", peer_,
        pid, rank_));
  }
  return Status::ok();
}

void ShmConnection::abort() {
  aborted_.store(true, std::memory_order_relaxed);
  hdr_->closed[side_].store(1, std::memory_order_release);
}

Result<std::unique_ptr<Connection>> ShmTransport::connect(const ConnectContext& ctx) {
  TUTTI_RETURN_IF_ERROR(detail::checkContext(ctx, kName));
  if (ctx.bufferBytes == 0) return invalidArgument("SHM: bufferBytes must be > 0");
  auto r = ctx.isLower ? connectLower(ctx) : connectHigher(ctx);
  if (!r.isOk()) TUTTI_INFO(log::kShm, "{}", r.status().message());
  return r;
}

}  // namespace tutti::transport::shm

namespace tutti::transport {
std::unique_ptr<Transport> makeShmTransport() { return std::make_unique<shm::ShmTransport>(); }
}  // namespace tutti::transport
