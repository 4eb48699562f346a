// xpu_emu: device memory as doubly mapped memfds, pinned host memory, IPC.
// See emu_memory.h for the contract.
//
// IPC handle (tuttiPluginIpcHandle_v1):
//   fd      a dup (close-on-exec) of the allocation's memfd; tutti owns it
//   offset  exported pointer - allocation base
//   data    IpcDescriptor below (dataSize = sizeof(IpcDescriptor)): a magic, a
//           format version, the allocation's size and mapped size, the
//           exporting device and process, the exported byte count and a
//           checksum over all of it. ipcImport rejects anything that does not
//           add up (and an fd that is not a file at least mapSize long).
#include "emu_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "emu_common.h"

namespace xpu_emu {
namespace {

constexpr uint32_t kIpcMagic = 0x554d4558u;  // "XEMU"
constexpr uint32_t kIpcFormat = 1;

struct IpcDescriptor {
  uint32_t magic;
  uint32_t format;
  uint64_t allocSize;
  uint64_t mapSize;
  uint64_t exportedSize;
  int32_t device;
  int32_t pid;
  uint64_t checksum;  // FNV-1a over the fields above
};
static_assert(sizeof(IpcDescriptor) <= TUTTI_PLUGIN_IPC_HANDLE_BYTES, "fits the handle");

uint64_t checksumOf(const IpcDescriptor& d) {
  uint64_t h = 0xcbf29ce484222325ull;
  const auto* p = reinterpret_cast<const unsigned char*>(&d);
  for (size_t i = 0; i < offsetof(IpcDescriptor, checksum); ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

uint64_t pageSize() {
  static const uint64_t size = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  return size;
}

// Rounds size up to whole pages; false on overflow.
bool roundToPages(uint64_t size, uint64_t* out) {
  const uint64_t page = pageSize();
  if (size > UINT64_MAX - (page - 1)) return false;
  *out = (size + page - 1) / page * page;
  return true;
}

// Maps fd twice (PROT_NONE user view, read/write private view).
ncclResult_t mapTwice(int fd, uint64_t mapSize, char** user, char** priv) {
  void* u = mmap(nullptr, mapSize, PROT_NONE, MAP_SHARED, fd, 0);
  if (u == MAP_FAILED) return setSystemError("mmap of the device view");
  void* p = mmap(nullptr, mapSize, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    ncclResult_t r = setSystemError("mmap of the private view");
    munmap(u, mapSize);
    return r;
  }
  *user = static_cast<char*>(u);
  *priv = static_cast<char*>(p);
  return ncclSuccess;
}

void unmapRegion(const Region& r) {
  if (r.kind == MemKind::kHostPinned) {
    munmap(r.user, r.mapSize);
    return;
  }
  munmap(r.user, r.mapSize);
  munmap(r.priv, r.mapSize);
  if (r.fd >= 0) close(r.fd);
}

std::string hexPtr(const void* p) {
  char buf[32];
  snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

}  // namespace

bool MemoryRegistry::findLocked(const void* ptr,
                                std::map<uintptr_t, Region>::const_iterator* it) const {
  const uintptr_t a = reinterpret_cast<uintptr_t>(ptr);
  auto next = regions_.upper_bound(a);
  if (next == regions_.begin()) return false;
  auto cand = std::prev(next);
  if (a - cand->first >= cand->second.size) return false;
  *it = cand;
  return true;
}

bool MemoryRegistry::find(const void* ptr, Region* out) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<uintptr_t, Region>::const_iterator it;
  if (!findLocked(ptr, &it)) return false;
  *out = it->second;
  return true;
}

ncclResult_t MemoryRegistry::translate(const void* ptr, uint64_t bytes, const char* what,
                                       Span* out) const {
  Region r;
  if (!find(ptr, &r)) {
    *out = Span{MemKind::kPageable, static_cast<char*>(const_cast<void*>(ptr)), -1};
    return ncclSuccess;
  }
  const uint64_t off = static_cast<uint64_t>(static_cast<const char*>(ptr) - r.user);
  if (bytes > r.size - off) {
    return setError(ncclInvalidArgument, std::string(what) + ": " + std::to_string(bytes) +
                                             " bytes at offset " + std::to_string(off) +
                                             " run past the end of its " + std::to_string(r.size) +
                                             "-byte allocation");
  }
  *out = Span{r.kind, r.priv + off, r.device};
  return ncclSuccess;
}

ncclResult_t MemoryRegistry::allocDevice(int device, uint64_t size, void** ptr) {
  uint64_t mapSize = 0;
  if (!roundToPages(size, &mapSize) || mapSize > static_cast<uint64_t>(INT64_MAX))
    return setError(ncclSystemError, "memAlloc: " + std::to_string(size) + " bytes is too large");
  int fd = memfd_create("xpu_emu", MFD_CLOEXEC);
  if (fd < 0) return setSystemError("memfd_create");
  if (ftruncate(fd, static_cast<off_t>(mapSize)) != 0) {
    ncclResult_t r = setSystemError("ftruncate of " + std::to_string(mapSize) + " bytes");
    close(fd);
    return r;
  }
  Region reg;
  ncclResult_t r = mapTwice(fd, mapSize, &reg.user, &reg.priv);
  if (r != ncclSuccess) {
    close(fd);
    return r;
  }
  reg.size = size;
  reg.mapSize = mapSize;
  reg.fd = fd;
  reg.device = device;
  reg.kind = MemKind::kDevice;
  try {
    std::lock_guard<std::mutex> lock(mu_);
    regions_.emplace(reinterpret_cast<uintptr_t>(reg.user), reg);
  } catch (...) {
    unmapRegion(reg);
    return setError(ncclSystemError, "memAlloc: out of host memory");
  }
  *ptr = reg.user;
  return ncclSuccess;
}

ncclResult_t MemoryRegistry::freeDevice(void* ptr) {
  Region reg;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == regions_.end() || it->second.kind != MemKind::kDevice) {
      const bool imported = it != regions_.end() && it->second.kind == MemKind::kImported;
      return setError(ncclInvalidArgument,
                      "memFree: " + hexPtr(ptr) +
                          (imported ? " is imported IPC memory (use ipcClose)"
                                    : " is not the start of a memAlloc allocation"));
    }
    reg = it->second;
    regions_.erase(it);
  }
  unmapRegion(reg);
  return ncclSuccess;
}

ncclResult_t MemoryRegistry::allocHost(uint64_t size, void** ptr) {
  uint64_t mapSize = 0;
  if (!roundToPages(size, &mapSize) || mapSize > static_cast<uint64_t>(INT64_MAX))
    return setError(ncclSystemError, "hostAlloc: " + std::to_string(size) + " bytes is too large");
  void* p = mmap(nullptr, mapSize, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return setSystemError("hostAlloc: mmap");
  Region reg;
  reg.user = reg.priv = static_cast<char*>(p);
  reg.size = size;
  reg.mapSize = mapSize;
  reg.kind = MemKind::kHostPinned;
  try {
    std::lock_guard<std::mutex> lock(mu_);
    regions_.emplace(reinterpret_cast<uintptr_t>(reg.user), reg);
  } catch (...) {
    munmap(p, mapSize);
    return setError(ncclSystemError, "hostAlloc: out of host memory");
  }
  *ptr = p;
  return ncclSuccess;
}

ncclResult_t MemoryRegistry::freeHost(void* ptr) {
  Region reg;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.find(reinterpret_cast<uintptr_t>(ptr));
    if (it == regions_.end() || it->second.kind != MemKind::kHostPinned)
      return setError(ncclInvalidArgument,
                      "hostFree: " + hexPtr(ptr) + " is not the start of a hostAlloc allocation");
    reg = it->second;
    regions_.erase(it);
  }
  unmapRegion(reg);
  return ncclSuccess;
}

ncclResult_t MemoryRegistry::exportIpc(void* ptr, uint64_t size, tuttiPluginIpcHandle_v1* handle) {
  if (handle->structSize < sizeof(tuttiPluginIpcHandle_v1))
    return setError(ncclInvalidArgument, "ipcExport: handle->structSize " +
                                             std::to_string(handle->structSize) + " is too small");
  IpcDescriptor d{};
  uint64_t offset = 0;
  int fd = -1;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::map<uintptr_t, Region>::const_iterator it;
    if (!findLocked(ptr, &it) || it->second.kind != MemKind::kDevice)
      return setError(ncclInvalidArgument,
                      "ipcExport: " + hexPtr(ptr) + " is not inside a memAlloc allocation");
    const Region& r = it->second;
    offset = static_cast<uint64_t>(static_cast<char*>(ptr) - r.user);
    if (size > r.size - offset)
      return setError(ncclInvalidArgument, "ipcExport: " + std::to_string(size) +
                                               " bytes at offset " + std::to_string(offset) +
                                               " run past the end of the allocation");
    fd = fcntl(r.fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0) return setSystemError("ipcExport: dup of the memfd");
    d.magic = kIpcMagic;
    d.format = kIpcFormat;
    d.allocSize = r.size;
    d.mapSize = r.mapSize;
    d.exportedSize = size;
    d.device = r.device;
    d.pid = static_cast<int32_t>(getpid());
    d.checksum = checksumOf(d);
  }
  handle->dataSize = sizeof d;
  handle->fd = fd;
  handle->reserved0 = 0;
  handle->offset = offset;
  std::memset(handle->data, 0, sizeof handle->data);
  std::memcpy(handle->data, &d, sizeof d);
  return ncclSuccess;
}

ncclResult_t MemoryRegistry::importIpc(int device, const tuttiPluginIpcHandle_v1* handle,
                                       void** ptr) {
  if (handle->structSize < sizeof(tuttiPluginIpcHandle_v1))
    return setError(ncclInvalidArgument, "ipcImport: handle->structSize " +
                                             std::to_string(handle->structSize) + " is too small");
  if (handle->dataSize != sizeof(IpcDescriptor))
    return setError(ncclInvalidArgument, "ipcImport: not an xpu_emu handle (dataSize " +
                                             std::to_string(handle->dataSize) + ", expected " +
                                             std::to_string(sizeof(IpcDescriptor)) + ")");
  IpcDescriptor d;
  std::memcpy(&d, handle->data, sizeof d);
  if (d.magic != kIpcMagic || d.format != kIpcFormat)
    return setError(ncclInvalidArgument, "ipcImport: not an xpu_emu handle (bad magic/format)");
  if (d.checksum != checksumOf(d))
    return setError(ncclInvalidArgument, "ipcImport: handle is corrupt (checksum mismatch)");
  uint64_t expectMap = 0;
  if (d.allocSize == 0 || !roundToPages(d.allocSize, &expectMap) || expectMap != d.mapSize ||
      d.mapSize > static_cast<uint64_t>(INT64_MAX))
    return setError(ncclInvalidArgument, "ipcImport: handle has inconsistent sizes");
  if (handle->offset >= d.allocSize || d.exportedSize > d.allocSize - handle->offset)
    return setError(ncclInvalidArgument, "ipcImport: offset " + std::to_string(handle->offset) +
                                             " is outside the exported allocation");
  if (handle->fd < 0)
    return setError(ncclInvalidArgument, "ipcImport: the handle has no file descriptor");
  struct stat st;
  if (fstat(handle->fd, &st) != 0) return setSystemError("ipcImport: fstat of handle->fd");
  if (!S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) < d.mapSize)
    return setError(ncclInvalidArgument,
                    "ipcImport: handle->fd is not the exported memory (wrong type or size)");
  Region reg;
  ncclResult_t r = mapTwice(handle->fd, d.mapSize, &reg.user, &reg.priv);
  if (r != ncclSuccess) return r;
  reg.size = d.allocSize;
  reg.mapSize = d.mapSize;
  reg.fd = -1;  // the mappings keep the memory alive; tutti closes handle->fd
  reg.device = device;
  reg.kind = MemKind::kImported;
  try {
    std::lock_guard<std::mutex> lock(mu_);
    regions_.emplace(reinterpret_cast<uintptr_t>(reg.user), reg);
  } catch (...) {
    unmapRegion(reg);
    return setError(ncclSystemError, "ipcImport: out of host memory");
  }
  *ptr = reg.user + handle->offset;
  return ncclSuccess;
}

ncclResult_t MemoryRegistry::closeIpc(void* ptr) {
  Region reg;
  {
    std::lock_guard<std::mutex> lock(mu_);
    std::map<uintptr_t, Region>::const_iterator it;
    if (!findLocked(ptr, &it) || it->second.kind != MemKind::kImported)
      return setError(ncclInvalidArgument,
                      "ipcClose: " + hexPtr(ptr) + " was not returned by ipcImport");
    reg = it->second;
    regions_.erase(it);
  }
  unmapRegion(reg);
  return ncclSuccess;
}

void MemoryRegistry::releaseAll() {
  std::map<uintptr_t, Region> all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    all.swap(regions_);
  }
  for (const auto& kv : all) unmapRegion(kv.second);
}

}  // namespace xpu_emu
