// Cross-memory attach: reading another process's memory in one copy
// (process_vm_readv), the single-copy mechanism for large host collectives on
// one host (core/oneshot.h).
//
// Contract
// - allowPeerReads() lets processes of the same user read this one when the
//   Yama security module would otherwise restrict it to ancestors
//   (ptrace_scope 1): prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY), as Open MPI
//   does for the same purpose. It changes nothing where Yama is absent or
//   stricter (scope 2 and 3 still refuse, and the probe below then fails).
// - read() copies `bytes` from address `remote` in process `pid` to `local`,
//   looping over partial transfers. It fails with the errno and a hint when
//   the kernel refuses (EPERM: ptrace restrictions or a seccomp filter;
//   ESRCH: the process is gone; EFAULT: a bad address on either side). It
//   blocks only for the copy itself.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

#include "base/status.h"

namespace tutti::transport::shm::cma {

void allowPeerReads();
// A random value per process: two ranks with the same one share an address
// space (a pid alone could repeat across pid namespaces).
uint64_t processToken();
Status read(pid_t pid, const void* remote, void* local, size_t bytes);
// Copies `bytes` from byte `offset` of a peer's buffer `base` to `local`: a
// memcpy when the peer is a thread of this process (`sameProcess`: equal
// processToken()s), with the ordering told to ThreadSanitizer keyed by `base`
// (base/tsan.h: the owner releases `base` before it publishes the address and
// acquires it once the readers are done), else read().
Status readPeer(pid_t pid, bool sameProcess, const void* base, size_t offset, void* local,
                size_t bytes);

}  // namespace tutti::transport::shm::cma
