// The node arena: one shared-memory segment per communicator whose ranks all
// share a host, through which small collectives run in one shot (every rank
// writes its contribution once and reads everyone else's directly).
//
// Contract
// - Rank 0 create()s the segment under a fresh name ("/tutti-<hash>-arena-
//   <random>", O_EXCL, mode 0600, pages reserved with posix_fallocate), the
//   others attach() by name, and rank 0 unlinks the name once all have
//   attached, so no name outlives initialisation.
// - Layout: a header, one state word per rank, one line per rank of words
//   only that rank writes (acknowledgement, last posted operation), one line
//   per rank for its doorbell (doorbell.h: anyone rings it), then per
//   rank kSmallSlots small slots of kSmallSlotBytes payload followed by
//   kSlots large slots of `slotBytes` payload. Slot index i < kSmallSlots is small slot i, index
//   kSmallSlots + j large slot j (which operation uses which slot is the
//   caller's protocol: core/oneshot.h). A slot is a 64-bit sequence word and
//   a 64-bit signature followed, in the same cache line, by its payload, so a
//   small message and its flag travel together. Slots are kLine-aligned;
//   each rank's slots start on a page of their own and fill whole pages.
//   Many small slots let a rank run far ahead of its peers (a broadcast root
//   on an oversubscribed host) at little memory cost; the few large ones hold
//   the larger one-shot messages.
// - Rank r writes only its own slots and its own state word; everyone reads
//   everything. A writer fills the payload, then publishes with a release
//   store of the sequence word; readers acquire it before reading payload.
//   Which operation may overwrite a slot is the caller's protocol (see
//   core/oneshot.h).
// - An ArenaSegment owns its mapping. Destroying it marks this rank kClosed;
//   markFailed() marks it kFailed; markAborted() marks it kAborted (from any
//   thread: its communicator was aborted). The first mark sticks. None ever
//   blocks.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "base/status.h"
#include "transports/shm/doorbell.h"
#include "transports/shm/shm_ring.h"

namespace tutti::transport::shm {

class ArenaSegment {
 public:
  enum State : uint32_t { kOpen = 0, kClosed = 1, kFailed = 2, kAborted = 3 };
  // Slots per rank, of each size: how many operations of a size a rank may
  // run ahead of the slowest (a broadcast root, say) is the count - 1.
  static constexpr int kSmallSlots = 64;
  static constexpr size_t kSmallSlotBytes = 1024 - 16;  // one 1 KiB stride
  static constexpr int kSlots = 8;

  static Result<std::unique_ptr<ArenaSegment>> create(const std::string& name, int rank, int nranks,
                                                      size_t slotBytes);
  static Result<std::unique_ptr<ArenaSegment>> attach(const std::string& name, int rank, int nranks,
                                                      size_t slotBytes);
  ~ArenaSegment();
  ArenaSegment(const ArenaSegment&) = delete;
  ArenaSegment& operator=(const ArenaSegment&) = delete;

  // A fresh name for create(); unlinkName() removes it (idempotent).
  static std::string makeName(uint64_t commHash);
  static void unlinkName(const std::string& name);
  // Total bytes of a segment for nranks and slotBytes (page-rounded).
  static size_t segmentBytes(int nranks, size_t slotBytes);

  std::atomic<uint64_t>& seq(int rank, int index) {
    return *reinterpret_cast<std::atomic<uint64_t>*>(slot(rank, index));
  }
  // What the operation in the slot is (the caller's encoding), written
  // before the sequence word is published.
  uint64_t& signature(int rank, int index) {
    return *reinterpret_cast<uint64_t*>(slot(rank, index) + 8);
  }
  uint8_t* payload(int rank, int index) { return slot(rank, index) + kSlotHeader; }
  // Payload bytes of a large slot.
  size_t slotBytes() const { return slotBytes_; }

  // Rank r's acknowledgement word: the caller's protocol says what it counts
  // (core/oneshot.h: the last single-copy operation r finished reading).
  // Only rank r writes it.
  std::atomic<uint64_t>& ack(int rank) { return word(rank, 0); }
  // Rank r's last posted operation and its signature, in the same line (the
  // caller's encoding; core/oneshot.h uses them to name a mismatch between
  // ranks whose calls went to different slot classes). Only rank r writes.
  std::atomic<uint64_t>& posted(int rank) { return word(rank, 1); }
  std::atomic<uint64_t>& postedSignature(int rank) { return word(rank, 2); }
  // The caller's number of that operation (core/oneshot.h: its collective
  // call number + 1; 0 before any), written before posted().
  std::atomic<uint64_t>& postedCall(int rank) { return word(rank, 3); }

  // This rank's slots: whole pages, written only by this rank (for placement
  // near it; every peer reads them once per operation).
  std::pair<void*, size_t> ownSlots() { return {slot(rank_, 0), perRank_}; }

  // Rank r's doorbell (doorbell.h): its peers ring it after moving bytes for
  // it; r sleeps on it when it has nothing to do.
  Doorbell* bell(int rank) {
    return reinterpret_cast<Doorbell*>(bells_ + static_cast<size_t>(rank) * kLine);
  }

  uint32_t state(int rank) const { return states_[rank].load(std::memory_order_acquire); }
  void markFailed() { mark(kFailed); }
  void markAborted() { mark(kAborted); }

 private:
  static constexpr size_t kSlotHeader = 16;  // sequence word + signature
  ArenaSegment(void* base, size_t bytes, int rank, int nranks, size_t slotBytes);
  static constexpr size_t kSmallStride = kSmallSlotBytes + kSlotHeader;
  std::atomic<uint64_t>& word(int rank, int i) {
    return reinterpret_cast<std::atomic<uint64_t>*>(acks_ + static_cast<size_t>(rank) * kLine)[i];
  }
  uint8_t* slot(int rank, int index) {
    uint8_t* mine = slots_ + static_cast<size_t>(rank) * perRank_;
    if (index < kSmallSlots) return mine + static_cast<size_t>(index) * kSmallStride;
    return mine + kSmallSlots * kSmallStride + static_cast<size_t>(index - kSmallSlots) * stride_;
  }

  // The first state other than kOpen sticks (a rank aborted, whose operation
  // then fails, stays kAborted: that is what its peers should report).
  void mark(State s) {
    uint32_t open = kOpen;
    states_[rank_].compare_exchange_strong(open, s, std::memory_order_acq_rel);
  }

  void* base_;
  size_t bytes_;
  int rank_;
  size_t slotBytes_, stride_, perRank_;
  std::atomic<uint32_t>* states_;
  uint8_t* acks_;
  uint8_t* bells_;
  uint8_t* slots_;
};

}  // namespace tutti::transport::shm
