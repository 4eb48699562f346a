// Shared-memory segment layout and the single-producer/single-consumer byte
// ring used by the shm transport.
//
// Contract
// - One segment per (pair, channel): a SegmentHeader followed by two data
//   areas of ringBytes each. Ring 0 carries lower->higher, ring 1 higher->lower.
//   Side 0 is the lower rank, side 1 the higher.
// - head (bytes ever written) is stored only by the producer, tail (bytes ever
//   consumed) only by the consumer; both are monotonically increasing 64-bit
//   counters on their own cache lines. The producer publishes data with a
//   release store of head; the consumer reads head with acquire before reading
//   data and releases tail after it is done with the bytes, which the producer
//   acquires before overwriting them. No other synchronisation is needed.
// - SpscRing is a per-process view (one producer view, one consumer view per
//   ring); it is not thread-safe by itself: one thread at a time per view.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <type_traits>

namespace tutti::transport::shm {

inline constexpr uint64_t kSegmentMagic = 0x314d536974747574ull;  // "tuttiSM1" little-endian
inline constexpr uint32_t kSegmentVersion = 1;
// 128: keeps adjacent-line prefetching from pairing head and tail.
inline constexpr size_t kLine = 128;
inline constexpr size_t kPage = 4096;

static_assert(std::atomic<uint64_t>::is_always_lock_free, "shm needs lock-free 64-bit atomics");
static_assert(std::atomic<int64_t>::is_always_lock_free, "shm needs lock-free 64-bit atomics");
static_assert(std::atomic<uint32_t>::is_always_lock_free, "shm needs lock-free 32-bit atomics");

struct RingControl {
  alignas(kLine) std::atomic<uint64_t> head;  // written by the producer
  alignas(kLine) std::atomic<uint64_t> tail;  // written by the consumer
};

struct SegmentHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t reserved;
  uint64_t ringBytes;
  uint64_t dataOffset[2];
  alignas(kLine) std::atomic<int64_t> pid[2];  // process of each side, 0 until known
  std::atomic<uint32_t> closed[2];             // side has closed/aborted
  RingControl ring[2];
};
static_assert(std::is_standard_layout_v<SegmentHeader>);
static_assert(sizeof(SegmentHeader) <= kPage);

inline size_t roundUp(size_t v, size_t a) { return (v + a - 1) / a * a; }

// Bytes of a segment holding two rings of ringBytes each.
inline size_t segmentBytes(size_t ringBytes) { return kPage + 2 * roundUp(ringBytes, kPage); }

// Initialises a freshly created (zero-filled) segment. The peer may read the
// plain fields only after a control message sent after this call (that
// message orders them).
inline SegmentHeader* initSegment(void* base, size_t ringBytes) {
  auto* h = new (base) SegmentHeader{};
  h->magic = kSegmentMagic;
  h->version = kSegmentVersion;
  h->ringBytes = ringBytes;
  h->dataOffset[0] = kPage;
  h->dataOffset[1] = kPage + roundUp(ringBytes, kPage);
  for (int i = 0; i < 2; ++i) {
    h->pid[i].store(0, std::memory_order_relaxed);
    h->closed[i].store(0, std::memory_order_relaxed);
    h->ring[i].head.store(0, std::memory_order_relaxed);
    h->ring[i].tail.store(0, std::memory_order_relaxed);
  }
  return h;
}

// One end (producer or consumer) of one ring.
class SpscRing {
 public:
  SpscRing() = default;
  SpscRing(RingControl* ctl, uint8_t* data, uint64_t cap) : ctl_(ctl), data_(data), cap_(cap) {
    head_ = ctl_->head.load(std::memory_order_acquire);
    tail_ = ctl_->tail.load(std::memory_order_acquire);
  }

  // Producer: copies up to n bytes, returns how many.
  size_t write(const void* src, size_t n) {
    uint64_t space = cap_ - (head_ - tail_);
    if (space < n) {
      tail_ = ctl_->tail.load(std::memory_order_acquire);
      space = cap_ - (head_ - tail_);
    }
    n = std::min<uint64_t>(n, space);
    if (n == 0) return 0;
    const size_t off = head_ % cap_;
    const size_t first = std::min<uint64_t>(n, cap_ - off);
    std::memcpy(data_ + off, src, first);
    if (n > first) std::memcpy(data_, static_cast<const uint8_t*>(src) + first, n - first);
    head_ += n;
    ctl_->head.store(head_, std::memory_order_release);
    return n;
  }

  // Consumer: copies up to n bytes out, returns how many.
  size_t read(void* dst, size_t n) {
    uint64_t avail = head_ - tail_;
    if (avail < n) {
      head_ = ctl_->head.load(std::memory_order_acquire);
      avail = head_ - tail_;
    }
    n = std::min<uint64_t>(n, avail);
    if (n == 0) return 0;
    const size_t off = tail_ % cap_;
    const size_t first = std::min<uint64_t>(n, cap_ - off);
    std::memcpy(dst, data_ + off, first);
    if (n > first) std::memcpy(static_cast<uint8_t*>(dst) + first, data_, n - first);
    tail_ += n;
    ctl_->tail.store(tail_, std::memory_order_release);
    return n;
  }

  // Consumer: contiguous readable bytes without copying.
  const void* peek(size_t* avail) {
    head_ = ctl_->head.load(std::memory_order_acquire);
    const size_t off = tail_ % cap_;
    *avail = std::min<uint64_t>(head_ - tail_, cap_ - off);
    return *avail ? data_ + off : nullptr;
  }

  // Consumer: releases n bytes obtained from peek() (clamped to what is there).
  void consume(size_t n) {
    n = std::min<uint64_t>(n, head_ - tail_);
    if (n == 0) return;
    tail_ += n;
    ctl_->tail.store(tail_, std::memory_order_release);
  }

  // Consumer: fresh count of bytes available (acquire).
  uint64_t readable() {
    head_ = ctl_->head.load(std::memory_order_acquire);
    return head_ - tail_;
  }

 private:
  RingControl* ctl_ = nullptr;
  uint8_t* data_ = nullptr;
  uint64_t cap_ = 0;
  // Producer view: head_ is ours, tail_ a cached copy. Consumer: the reverse.
  uint64_t head_ = 0;
  uint64_t tail_ = 0;
};

}  // namespace tutti::transport::shm
