#include "transports/net_stream.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

namespace tutti::transport {
namespace {

constexpr int kSlots = 8;
constexpr size_t kMinSlotBytes = 4 << 10;

struct FreeDeleter {
  void operator()(uint8_t* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<uint8_t, FreeDeleter>;

Buffer allocBuffer(size_t bytes) {
  void* p = nullptr;
  if (posix_memalign(&p, 4096, bytes) != 0) return nullptr;
  return Buffer(static_cast<uint8_t*>(p));
}

class StreamConnection final : public Connection {
 public:
  StreamConnection(std::unique_ptr<NetComm> comm, std::string name)
      : comm_(std::move(comm)), name_(std::move(name)) {}
  // The comm first: closing it may still let the transport write into the
  // receive slots (until it has cancelled what was posted there).
  ~StreamConnection() override { comm_.reset(); }

  Status init(size_t bufferBytes, const std::string& peer) {
    slotBytes_ = std::clamp(bufferBytes / kSlots, kMinSlotBytes, comm_->maxMessageBytes());
    const size_t total = slotBytes_ * kSlots;
    sendBuf_ = allocBuffer(total);
    recvBuf_ = allocBuffer(total);
    if (!sendBuf_ || !recvBuf_)
      return systemError(
          fmt::format("cannot allocate 2 x {} bytes of bounce buffers for {}", total, peer));
    auto s = comm_->registerMemory(sendBuf_.get(), total, MemKind::kHost);
    if (!s) return s.status().withContext("registering the send buffers");
    sendMr_ = *s;
    auto r = comm_->registerMemory(recvBuf_.get(), total, MemKind::kHost);
    if (!r) return r.status().withContext("registering the receive buffers");
    recvMr_ = *r;
    postRecvs();
    return postError_;
  }

  Result<size_t> trySend(const void* data, size_t bytes) override {
    return trySend2(data, bytes, nullptr, 0);
  }

  // a and b travel in one message when they fit in a slot: a header and its
  // small payload cost one message, not two.
  Result<size_t> trySend2(const void* a, size_t na, const void* b, size_t nb) override {
    TUTTI_RETURN_IF_ERROR(progressSends());
    size_t taken = 0;
    const size_t total = na + nb;
    while (taken < total && send_[sendHead_].state == Slot::kFree) {
      Slot& s = send_[sendHead_];
      uint8_t* dst = slot(sendBuf_, sendHead_);
      size_t n = 0;
      while (n < slotBytes_ && taken < total) {
        const bool inA = taken < na;
        const uint8_t* src = inA ? static_cast<const uint8_t*>(a) + taken
                                 : static_cast<const uint8_t*>(b) + (taken - na);
        size_t left = inA ? na - taken : total - taken;
        size_t m = std::min(left, slotBytes_ - n);
        std::memcpy(dst + n, src, m);
        n += m;
        taken += m;
      }
      s.state = Slot::kFilled;
      s.bytes = n;
      ++unsent_;
      sendHead_ = (sendHead_ + 1) % kSlots;
      TUTTI_RETURN_IF_ERROR(postSends());
    }
    return taken;
  }

  Result<size_t> tryRecv(void* data, size_t bytes) override {
    TUTTI_RETURN_IF_ERROR(progressRecvs());
    size_t got = 0;
    while (got < bytes && recv_[readNext_].state == Slot::kReady) {
      Slot& s = recv_[readNext_];
      size_t m = std::min(bytes - got, s.bytes - s.offset);
      std::memcpy(static_cast<uint8_t*>(data) + got, slot(recvBuf_, readNext_) + s.offset, m);
      got += m;
      consumeFront(m);
    }
    return got;
  }

  const void* peek(size_t* avail) override {
    *avail = 0;
    if (!progressRecvs()) return nullptr;  // the error comes again from tryRecv
    const Slot& s = recv_[readNext_];
    if (s.state != Slot::kReady) return nullptr;
    *avail = s.bytes - s.offset;
    return slot(recvBuf_, readNext_) + s.offset;
  }

  void consume(size_t bytes) override { consumeFront(bytes); }

  bool supportsPeek() const override { return true; }

  size_t buffered() const override {
    const Slot& s = recv_[readNext_];
    return s.state == Slot::kReady ? s.bytes - s.offset : 0;
  }

  bool needsProgress() const override { return true; }

  Result<bool> progress() override {
    TUTTI_RETURN_IF_ERROR(progressSends());
    return unsent_ == 0;
  }

  void abort() override { comm_->abort(); }
  const char* name() const override { return name_.c_str(); }

 private:
  struct Slot {
    enum State : uint8_t { kFree, kFilled, kPosted, kReady } state = kFree;
    size_t bytes = 0;   // send: bytes filled; receive: bytes received
    size_t offset = 0;  // receive: bytes handed out
    NetRequest* req = nullptr;
  };

  uint8_t* slot(const Buffer& b, int i) const {
    return b.get() + static_cast<size_t>(i) * slotBytes_;
  }

  // Posts filled send slots in order; a transport that takes no request now
  // gets the same slot again next time.
  Status postSends() {
    while (send_[postNext_].state == Slot::kFilled) {
      Slot& s = send_[postNext_];
      auto r = comm_->isend(slot(sendBuf_, postNext_), s.bytes, sendMr_);
      if (!r) return r.status();
      if (!*r) return Status::ok();
      s.req = *r;
      s.state = Slot::kPosted;
      postNext_ = (postNext_ + 1) % kSlots;
    }
    return Status::ok();
  }

  Status progressSends() {
    TUTTI_RETURN_IF_ERROR(postSends());
    while (send_[sendTail_].state == Slot::kPosted) {
      Slot& s = send_[sendTail_];
      auto done = comm_->test(s.req, nullptr);
      if (!done) return done.status();
      if (!*done) break;
      s = Slot();
      --unsent_;
      sendTail_ = (sendTail_ + 1) % kSlots;
    }
    return Status::ok();
  }

  // Keeps an irecv posted on every free receive slot, in ring order. A post
  // that fails (the peer has closed, say) is an error only once the bytes
  // received before it are read: progressRecvs() returns it when the front
  // slot is left unposted.
  void postRecvs() {
    while (postError_.isOk() && recv_[recvPostNext_].state == Slot::kFree) {
      Slot& s = recv_[recvPostNext_];
      auto r = comm_->irecv(slot(recvBuf_, recvPostNext_), slotBytes_, recvMr_);
      if (!r) {
        postError_ = r.status();
        break;
      }
      if (!*r) return;  // the transport takes no request now: next time
      s.req = *r;
      s.state = Slot::kPosted;
      recvPostNext_ = (recvPostNext_ + 1) % kSlots;
    }
  }

  // Also moves this connection's sends along: a caller waiting for an answer
  // (the link probe, a ring's next chunk) need not call progress() too.
  Status progressRecvs() {
    TUTTI_RETURN_IF_ERROR(progressSends());
    postRecvs();
    // Completions come in posting order: the front slot first.
    for (;;) {
      Slot& s = recv_[readNext_];
      if (s.state != Slot::kPosted) break;
      size_t n = 0;
      auto done = comm_->test(s.req, &n);
      if (!done) return done.status();
      if (!*done) break;
      s.req = nullptr;
      s.bytes = n;
      s.offset = 0;
      s.state = Slot::kReady;
      if (n == 0) {
        consumeFront(0);
        continue;
      }
      break;
    }
    if (recv_[readNext_].state == Slot::kFree && !postError_.isOk()) return postError_;
    return Status::ok();
  }

  void consumeFront(size_t bytes) {
    Slot& s = recv_[readNext_];
    s.offset += bytes;
    if (s.offset < s.bytes) return;
    s = Slot();
    readNext_ = (readNext_ + 1) % kSlots;
    postRecvs();
  }

  std::unique_ptr<NetComm> comm_;
  std::string name_;
  size_t slotBytes_ = 0;
  Buffer sendBuf_, recvBuf_;
  const MemRegion* sendMr_ = nullptr;
  const MemRegion* recvMr_ = nullptr;
  Slot send_[kSlots], recv_[kSlots];
  int sendHead_ = 0, postNext_ = 0, sendTail_ = 0;  // fill, post, complete
  int recvPostNext_ = 0, readNext_ = 0;
  int unsent_ = 0;    // send slots filled or posted, not yet complete
  Status postError_;  // the first irecv that failed (postRecvs)
};

class StreamTransport final : public Transport {
 public:
  explicit StreamTransport(NetTransport* net) : net_(net) {}
  const char* name() const override { return net_->name(); }
  Result<std::unique_ptr<Connection>> connect(const ConnectContext& ctx) override {
    auto comm = net_->connect(ctx);
    if (!comm) return comm.status();
    auto conn = std::make_unique<StreamConnection>(std::move(comm.value()), net_->name());
    TUTTI_RETURN_IF_ERROR(conn->init(ctx.bufferBytes, fmt::format("rank {}", ctx.peer)));
    return std::unique_ptr<Connection>(std::move(conn));
  }

 private:
  NetTransport* net_;
};

}  // namespace

std::unique_ptr<Transport> makeStreamTransport(NetTransport* net) {
  return std::make_unique<StreamTransport>(net);
}

}  // namespace tutti::transport
