#include "transports/shm/cma.h"

#include <sys/prctl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <random>

#include "base/log.h"
#include "base/tsan.h"

namespace tutti::transport::shm::cma {

void allowPeerReads() {
#ifdef PR_SET_PTRACER
  // Fails with EINVAL where Yama is not built in: nothing to allow then.
  (void)prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
#endif
}

uint64_t processToken() {
  static const uint64_t token = [] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(getpid());
  }();
  return token;
}

Status read(pid_t pid, const void* remote, void* local, size_t bytes) {
  auto* dst = static_cast<char*>(local);
  auto src = reinterpret_cast<uintptr_t>(remote);
  while (bytes > 0) {
    iovec l{dst, bytes};
    iovec r{reinterpret_cast<void*>(src), bytes};
    ssize_t got = process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (got < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      const char* hint = err == EPERM    ? " (ptrace restrictions or a seccomp filter forbid it)"
                         : err == ESRCH  ? " (the process is gone)"
                         : err == EFAULT ? " (a buffer address is not mapped)"
                                         : "";
      return errnoError(fmt::format("SHM: single-copy read of {} bytes from process {}{}", bytes,
                                    static_cast<int>(pid), hint),
                        err);
    }
    if (got == 0)
      return remoteError(
          fmt::format("SHM: single-copy read from process {} made no progress ({} bytes left)",
                      static_cast<int>(pid), bytes));
    dst += got;
    src += static_cast<uintptr_t>(got);
    bytes -= static_cast<size_t>(got);
  }
  return Status::ok();
}

Status readPeer(pid_t pid, bool sameProcess, const void* base, size_t offset, void* local,
                size_t bytes) {
  const char* src = static_cast<const char*>(base) + offset;
  if (!sameProcess) return read(pid, src, local, bytes);
  tutti::base::tsanAcquire(base);  // the owner's writes before it published the address
  memcpy(local, src, bytes);
  tutti::base::tsanRelease(base);  // before the owner learns that this reader is done
  return Status::ok();
}

}  // namespace tutti::transport::shm::cma
