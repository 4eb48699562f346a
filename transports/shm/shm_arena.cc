#include "transports/shm/shm_arena.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <type_traits>

#include "base/log.h"

namespace tutti::transport::shm {
namespace {

constexpr uint64_t kArenaMagic = 0x3141526974747574ull;  // "tuttiRA1" little-endian
constexpr uint32_t kArenaVersion = 6;

struct ArenaHeader {
  std::atomic<uint64_t> magic;  // stored last by the creator
  uint32_t version;
  int32_t nranks;
  uint64_t slotBytes;
};
static_assert(sizeof(ArenaHeader) <= kLine);

size_t statesOffset() { return kLine; }
size_t acksOffset(int nranks) {
  return roundUp(statesOffset() + sizeof(std::atomic<uint32_t>) * nranks, kLine);
}
size_t bellsOffset(int nranks) { return acksOffset(nranks) + kLine * static_cast<size_t>(nranks); }
// Each rank's slots start on a page of their own, so that they can be placed
// on that rank's NUMA node (ArenaSegment::ownSlots).
size_t slotsOffset(int nranks) {
  return roundUp(bellsOffset(nranks) + kLine * static_cast<size_t>(nranks), kPage);
}
size_t strideFor(size_t slotBytes) { return roundUp(16 + slotBytes, kLine); }
size_t perRankBytes(size_t slotBytes) {
  static_assert(ArenaSegment::kSmallSlotBytes % kLine == kLine - 16);
  return roundUp(ArenaSegment::kSmallSlots * (ArenaSegment::kSmallSlotBytes + 16) +
                     size_t{ArenaSegment::kSlots} * strideFor(slotBytes),
                 kPage);
}

}  // namespace

size_t ArenaSegment::segmentBytes(int nranks, size_t slotBytes) {
  return roundUp(slotsOffset(nranks) + static_cast<size_t>(nranks) * perRankBytes(slotBytes),
                 kPage);
}

std::string ArenaSegment::makeName(uint64_t commHash) {
  std::random_device rd;
  uint64_t r = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  return fmt::format("/tutti-{:016x}-arena-{:016x}", commHash, r);
}

void ArenaSegment::unlinkName(const std::string& name) { shm_unlink(name.c_str()); }

ArenaSegment::ArenaSegment(void* base, size_t bytes, int rank, int nranks, size_t slotBytes)
    : base_(base),
      bytes_(bytes),
      rank_(rank),
      slotBytes_(slotBytes),
      stride_(strideFor(slotBytes)),
      perRank_(perRankBytes(slotBytes)),
      states_(
          reinterpret_cast<std::atomic<uint32_t>*>(static_cast<uint8_t*>(base) + statesOffset())),
      acks_(static_cast<uint8_t*>(base) + acksOffset(nranks)),
      bells_(static_cast<uint8_t*>(base) + bellsOffset(nranks)),
      slots_(static_cast<uint8_t*>(base) + slotsOffset(nranks)) {}

ArenaSegment::~ArenaSegment() {
  uint32_t open = kOpen;
  states_[rank_].compare_exchange_strong(open, kClosed, std::memory_order_acq_rel);
  munmap(base_, bytes_);
}

Result<std::unique_ptr<ArenaSegment>> ArenaSegment::create(const std::string& name, int rank,
                                                           int nranks, size_t slotBytes) {
  const size_t bytes = segmentBytes(nranks, slotBytes);
  const std::string who = fmt::format("SHM: arena {}", name);
  int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return errnoError(who + ": shm_open", errno);
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    close(fd);
    shm_unlink(name.c_str());
    return errnoError(who + ": ftruncate", err);
  }
  // Reserve the pages now: a full /dev/shm must fail here, not SIGBUS later.
  int err = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  if (err != 0 && err != EINVAL && err != EOPNOTSUPP) {
    close(fd);
    shm_unlink(name.c_str());
    return errnoError(
        fmt::format("{}: reserving {} bytes in /dev/shm (is it large enough?)", who, bytes), err);
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  err = errno;
  close(fd);
  if (base == MAP_FAILED) {
    shm_unlink(name.c_str());
    return errnoError(fmt::format("{}: mmap of {} bytes", who, bytes), err);
  }
  // ftruncate zero-filled the segment: every sequence and acknowledgement word is
  // 0, every state kOpen.
  auto* hdr = static_cast<ArenaHeader*>(base);
  hdr->version = kArenaVersion;
  hdr->nranks = nranks;
  hdr->slotBytes = slotBytes;
  hdr->magic.store(kArenaMagic, std::memory_order_release);
  return std::unique_ptr<ArenaSegment>(new ArenaSegment(base, bytes, rank, nranks, slotBytes));
}

Result<std::unique_ptr<ArenaSegment>> ArenaSegment::attach(const std::string& name, int rank,
                                                           int nranks, size_t slotBytes) {
  const size_t bytes = segmentBytes(nranks, slotBytes);
  const std::string who = fmt::format("SHM: arena {}", name);
  int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return errnoError(who + ": shm_open", errno);
  struct stat sb {};
  if (fstat(fd, &sb) != 0 || static_cast<uint64_t>(sb.st_size) < bytes) {
    close(fd);
    return remoteError(fmt::format("{}: segment is smaller than announced", who));
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (base == MAP_FAILED) return errnoError(fmt::format("{}: mmap of {} bytes", who, bytes), err);
  auto* hdr = static_cast<ArenaHeader*>(base);
  if (hdr->magic.load(std::memory_order_acquire) != kArenaMagic || hdr->version != kArenaVersion ||
      hdr->nranks != nranks || hdr->slotBytes != slotBytes) {
    munmap(base, bytes);
    return remoteError(fmt::format("{}: bad header", who));
  }
  return std::unique_ptr<ArenaSegment>(new ArenaSegment(base, bytes, rank, nranks, slotBytes));
}

}  // namespace tutti::transport::shm
