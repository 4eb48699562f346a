// abi_nvidia_preload / abi_nvidia_libpath: an NCCL program built the NVIDIA way
// runs on tutti unchanged.
//
// Compiled against NVIDIA's own nccl.h and linked against NVIDIA's
// libnccl.so.2; the test then substitutes tutti at run time, either with
// LD_PRELOAD=libtutti.so or with tutti's libnccl.so.2 first on
// LD_LIBRARY_PATH. No CUDA runtime function is called: buffers are host
// memory and the stream is NULL, which tutti completes before returning.
//
//   nvidia_client [nranks] [nvidia-libnccl-path]
//
// The parent first makes sure tutti answers the NCCL symbols (so NVIDIA's
// library, which needs a GPU, is never exercised), then forks nranks children.
// Rank 0 creates the unique id and hands it to the others through pipes; each
// rank runs AllReduce, AllGather and Broadcast on host buffers and checks the
// results exactly. Exit 0 only if every child succeeded.
#include <dlfcn.h>
#include <nccl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#ifdef TUTTI_NCCL_H
#error "nvidia_client.cc must be compiled against NVIDIA's nccl.h"
#endif

namespace {

int gRank = -1;

#define CHECK(cond)                                                                          \
  do {                                                                                       \
    if (!(cond)) {                                                                           \
      std::fprintf(stderr, "[rank %d] %s:%d: check failed: %s\n", gRank, __FILE__, __LINE__, \
                   #cond);                                                                   \
      return 1;                                                                              \
    }                                                                                        \
  } while (0)

#define NCCLCHECK(call)                                                                       \
  do {                                                                                        \
    ncclResult_t r_ = (call);                                                                 \
    if (r_ != ncclSuccess) {                                                                  \
      std::fprintf(stderr, "[rank %d] %s:%d: %s -> %d (%s): %s\n", gRank, __FILE__, __LINE__, \
                   #call, static_cast<int>(r_), ncclGetErrorString(r_),                       \
                   ncclGetLastError(nullptr));                                                \
      return 1;                                                                               \
    }                                                                                         \
  } while (0)

// Path of the object defining `symbol` as the dynamic linker resolves it for
// this program (dlsym on the default scope, not &fn: in a PIE that may be a
// PLT stub or canonical address inside the executable).
bool definingObject(const char* symbol, Dl_info* info) {
  void* addr = dlsym(RTLD_DEFAULT, symbol);
  return addr != nullptr && dladdr(addr, info) != 0 && info->dli_fname != nullptr;
}

// 0 if tutti answers the NCCL API in this process, 1 (with a reason) if not.
int checkRunningTutti(const char* nvidiaPath) {
  Dl_info tutti{}, api{};
  if (!definingObject("tuttiGetVersion", &tutti)) {
    std::fprintf(stderr,
                 "tuttiGetVersion is not loaded: NCCL calls would go to NVIDIA's library\n");
    return 1;
  }
  if (!definingObject("ncclAllReduce", &api)) {
    std::fprintf(stderr, "ncclAllReduce cannot be resolved\n");
    return 1;
  }
  if (api.dli_fbase != tutti.dli_fbase) {
    std::fprintf(stderr, "ncclAllReduce resolves to %s, not to tutti's %s\n", api.dli_fname,
                 tutti.dli_fname);
    return 1;
  }
  if (nvidiaPath != nullptr) {
    char a[PATH_MAX], b[PATH_MAX];
    if (realpath(api.dli_fname, a) != nullptr && realpath(nvidiaPath, b) != nullptr &&
        std::strcmp(a, b) == 0) {
      std::fprintf(stderr, "ncclAllReduce resolves to NVIDIA's %s\n", b);
      return 1;
    }
  }
  using VersionFn = ncclResult_t (*)(int*);
  using PathFn = const char* (*)();
  int v = -1;
  auto getVersion = reinterpret_cast<VersionFn>(dlsym(RTLD_DEFAULT, "tuttiGetVersion"));
  auto libPath = reinterpret_cast<PathFn>(dlsym(RTLD_DEFAULT, "tuttiLibraryPath"));
  if (getVersion(&v) != ncclSuccess) {
    std::fprintf(stderr, "tuttiGetVersion failed\n");
    return 1;
  }
  std::printf("NCCL API answered by %s (tutti %d, tuttiLibraryPath=%s)\n", api.dli_fname, v,
              libPath ? libPath() : "?");
  return 0;
}

int runRank(int rank, int nranks, const ncclUniqueId& id) {
  gRank = rank;
  ncclComm_t comm = nullptr;
  NCCLCHECK(ncclCommInitRank(&comm, nranks, id, rank));
  int n = -1, r = -1;
  NCCLCHECK(ncclCommCount(comm, &n));
  NCCLCHECK(ncclCommUserRank(comm, &r));
  CHECK(n == nranks && r == rank);

  // AllReduce, int32 sum, odd count, exact.
  const size_t count = (1u << 16) + 3;
  std::vector<int32_t> send(count), recv(count, -1);
  for (size_t i = 0; i < count; ++i) send[i] = rank * 1000 + static_cast<int32_t>(i % 97);
  NCCLCHECK(ncclAllReduce(send.data(), recv.data(), count, ncclInt32, ncclSum, comm, nullptr));
  const int32_t rankSum = 1000 * nranks * (nranks - 1) / 2;
  for (size_t i = 0; i < count; ++i) {
    CHECK(recv[i] == rankSum + nranks * static_cast<int32_t>(i % 97));
  }

  // AllGather, int32.
  const size_t per = 1001;
  std::vector<int32_t> mine(per), all(per * nranks, -1);
  for (size_t i = 0; i < per; ++i) mine[i] = rank * 100000 + static_cast<int32_t>(i);
  NCCLCHECK(ncclAllGather(mine.data(), all.data(), per, ncclInt32, comm, nullptr));
  for (int p = 0; p < nranks; ++p) {
    for (size_t i = 0; i < per; ++i) {
      CHECK(all[p * per + i] == p * 100000 + static_cast<int32_t>(i));
    }
  }

  // Broadcast from the last rank, float (values exactly representable).
  const int root = nranks - 1;
  const size_t bcount = 4099;
  std::vector<float> src(bcount), dst(bcount, 0.0f);
  for (size_t i = 0; i < bcount; ++i) src[i] = rank == root ? 7.0f * i + 1.0f : -1.0f;
  NCCLCHECK(ncclBroadcast(src.data(), dst.data(), bcount, ncclFloat32, root, comm, nullptr));
  for (size_t i = 0; i < bcount; ++i) CHECK(dst[i] == 7.0f * i + 1.0f);

  NCCLCHECK(ncclCommDestroy(comm));
  std::printf("[rank %d] ok\n", rank);
  return 0;
}

bool readAll(int fd, void* buf, size_t len) {
  char* p = static_cast<char*>(buf);
  while (len > 0) {
    ssize_t got = read(fd, p, len);
    if (got <= 0) return false;
    p += got;
    len -= static_cast<size_t>(got);
  }
  return true;
}

bool writeAll(int fd, const void* buf, size_t len) {
  const char* p = static_cast<const char*>(buf);
  while (len > 0) {
    ssize_t put = write(fd, p, len);
    if (put <= 0) return false;
    p += put;
    len -= static_cast<size_t>(put);
  }
  return true;
}

// Child body: rank 0 creates the id and sends it to ranks 1..n-1.
int child(int rank, int nranks, const std::vector<int>& readFds, const std::vector<int>& writeFds) {
  gRank = rank;
  ncclUniqueId id;
  std::memset(&id, 0, sizeof id);
  if (rank == 0) {
    NCCLCHECK(ncclGetUniqueId(&id));
    for (int r = 1; r < nranks; ++r) CHECK(writeAll(writeFds[r], &id, sizeof id));
  } else {
    CHECK(readAll(readFds[rank], &id, sizeof id));
  }
  for (int r = 1; r < nranks; ++r) {
    close(readFds[r]);
    close(writeFds[r]);
  }
  return runRank(rank, nranks, id);
}

double nowSeconds() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  const int nranks = argc > 1 ? std::atoi(argv[1]) : 3;
  const char* nvidiaPath = argc > 2 ? argv[2] : nullptr;
  if (nranks < 1 || nranks > 64) {
    std::fprintf(stderr, "usage: %s [nranks 1..64] [nvidia-libnccl-path]\n", argv[0]);
    return 2;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  if (checkRunningTutti(nvidiaPath) != 0) return 1;

  // pipe r carries the id from rank 0 to rank r.
  std::vector<int> readFds(nranks, -1), writeFds(nranks, -1);
  for (int r = 1; r < nranks; ++r) {
    int fds[2];
    if (pipe(fds) != 0) {
      std::perror("pipe");
      return 1;
    }
    readFds[r] = fds[0];
    writeFds[r] = fds[1];
  }

  std::vector<pid_t> pids;
  for (int rank = 0; rank < nranks; ++rank) {
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      for (pid_t p : pids) kill(p, SIGKILL);
      return 1;
    }
    if (pid == 0) {
      int rc = child(rank, nranks, readFds, writeFds);
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(rc);
    }
    pids.push_back(pid);
  }
  for (int r = 1; r < nranks; ++r) {
    close(readFds[r]);
    close(writeFds[r]);
  }

  // Wait for all children, at most 100 s (ctest's timeout is 120 s).
  int failed = 0;
  size_t left = pids.size();
  const double deadline = nowSeconds() + 100.0;
  std::vector<bool> done(pids.size(), false);
  while (left > 0) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (done[i]) continue;
      int status = 0;
      pid_t got = waitpid(pids[i], &status, WNOHANG);
      if (got == pids[i]) {
        done[i] = true;
        --left;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
          std::fprintf(stderr, "rank %zu failed (%s %d)\n", i,
                       WIFEXITED(status) ? "exit" : "signal",
                       WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
          ++failed;
        }
      }
    }
    // One rank failing leaves its peers waiting for it: stop them now rather
    // than at the deadline.
    if (failed > 0 && left > 0) {
      std::fprintf(stderr, "stopping %zu remaining rank(s) after a failure\n", left);
      for (size_t i = 0; i < pids.size(); ++i) {
        if (!done[i]) {
          kill(pids[i], SIGKILL);
          waitpid(pids[i], nullptr, 0);
          done[i] = true;
          ++failed;
        }
      }
      break;
    }
    if (left > 0 && nowSeconds() > deadline) {
      std::fprintf(stderr, "timeout: killing %zu rank(s) still running\n", left);
      for (size_t i = 0; i < pids.size(); ++i) {
        if (!done[i]) {
          kill(pids[i], SIGKILL);
          waitpid(pids[i], nullptr, 0);
          ++failed;
        }
      }
      break;
    }
    if (left > 0) usleep(20000);
  }
  std::printf("%d of %d ranks succeeded\n", nranks - failed, nranks);
  return failed == 0 ? 0 : 1;
}
