// xpu_emu: the emulated device memory and its address registry.
//
// Contract:
// - Device memory is a memfd per allocation, mapped twice: a PROT_NONE "user"
//   view (the address handed to tutti and to applications; any host access to
//   it faults, as with real device memory) and a PROT_READ|WRITE "private"
//   view that only the emulated device (queue workers, kernels) touches.
//   Mappings are page aligned (>= 256 bytes as the ABI requires). The memfd
//   stays open while the allocation lives, so it can be exported (one file
//   descriptor per allocation).
// - Pinned host memory (hostAlloc) is anonymous memory registered here; its
//   user and private views are the same address.
// - Imported IPC memory maps a peer's memfd the same two ways.
// - translate() turns any user address inside a registered region into the
//   private address (a pointer may point anywhere inside an allocation) and
//   checks that a byte range stays inside it. Unregistered addresses are
//   "pageable" host memory and come back unchanged.
// - All methods are thread-safe (one mutex around a sorted map of regions) and
//   never touch queues. Failures set the thread's last error (emu_common.h).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>

#include "nccl.h"
#include "tutti/backend_plugin.h"

namespace xpu_emu {

enum class MemKind { kPageable, kDevice, kImported, kHostPinned };

struct Region {
  char* user = nullptr;  // address handed out (PROT_NONE for device memory)
  char* priv = nullptr;  // the device's read/write view (== user for host memory)
  uint64_t size = 0;     // bytes requested
  uint64_t mapSize = 0;  // bytes mapped (size rounded up to pages)
  int fd = -1;           // memfd of device allocations; -1 otherwise
  int device = -1;       // owning device (importing device for imports)
  MemKind kind = MemKind::kPageable;
};

// Where a (pointer, bytes) range lives and the address the device uses for it.
struct Span {
  MemKind kind = MemKind::kPageable;
  char* addr = nullptr;  // private view for device memory; the pointer itself otherwise
  int device = -1;
};

class MemoryRegistry {
 public:
  MemoryRegistry() = default;
  MemoryRegistry(const MemoryRegistry&) = delete;
  MemoryRegistry& operator=(const MemoryRegistry&) = delete;
  ~MemoryRegistry() { releaseAll(); }

  ncclResult_t allocDevice(int device, uint64_t size, void** ptr);
  ncclResult_t freeDevice(void* ptr);
  ncclResult_t allocHost(uint64_t size, void** ptr);
  ncclResult_t freeHost(void* ptr);

  // Fills handle for [ptr, ptr + size) of a device allocation (see xpu_emu.cc
  // for the handle format): a dup of the memfd plus the validated description.
  ncclResult_t exportIpc(void* ptr, uint64_t size, tuttiPluginIpcHandle_v1* handle);
  ncclResult_t importIpc(int device, const tuttiPluginIpcHandle_v1* handle, void** ptr);
  ncclResult_t closeIpc(void* ptr);

  // The region containing ptr (user view); false if none.
  bool find(const void* ptr, Region* out) const;

  // Classifies [ptr, ptr + bytes). A range that starts in a registered region
  // but runs past its end is an error (ncclInvalidArgument naming `what`).
  ncclResult_t translate(const void* ptr, uint64_t bytes, const char* what, Span* out) const;

  // Unmaps and closes everything (finalize).
  void releaseAll();

 private:
  bool findLocked(const void* ptr, std::map<uintptr_t, Region>::const_iterator* it) const;

  mutable std::mutex mu_;
  std::map<uintptr_t, Region> regions_;  // keyed by user base address
};

}  // namespace xpu_emu
