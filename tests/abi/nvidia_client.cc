// abi_nvidia_preload / abi_nvidia_libpath / nccl_preload_cuda: an NCCL program
// built the NVIDIA way runs on tutti unchanged.
//
// Compiled against NVIDIA's own nccl.h and linked against NVIDIA's
// libnccl.so.2; the test then substitutes tutti at run time, either with
// LD_PRELOAD=libtutti.so or with tutti's libnccl.so.2 first on
// LD_LIBRARY_PATH.
//
// Two builds of this file:
// - nvidia_client (abi_nvidia_*): no CUDA runtime function is called; buffers
//   are host memory and the stream is NULL, which tutti completes before
//   returning.
// - nccl_preload_cuda (NVIDIA_CLIENT_CUDA, linked with the CUDA runtime; run
//   by tests/device/run_on_gpu.sh): buffers come from cudaMalloc on device
//   rank % deviceCount (so ranks share a GPU when there are more ranks than
//   GPUs), every call goes on the rank's own cudaStream, and the program
//   relies on stream order the way NCCL programs do: it copies inputs in
//   asynchronously, enqueues the collectives, copies results out and only then
//   synchronises. Rank 0 also times a 64 MiB and an 8 B all-reduce ("perf:"
//   lines). Without a usable GPU it exits 77 (skipped), checked in a child
//   process so the parent never initialises CUDA before forking.
//
//   nvidia_client [nranks] [nvidia-libnccl-path]
//
// The parent first makes sure tutti answers the NCCL symbols (so NVIDIA's
// library is never exercised), then forks nranks children. Rank 0 creates the
// unique id and hands it to the others through pipes; each rank runs
// AllReduce (out of place and in place), AllGather, ReduceScatter, Broadcast
// and a group of two AllReduces, and checks every result exactly. Exit 0
// only if every child succeeded.
#include <dlfcn.h>
#include <nccl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
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

// The memory the collectives run on, and the stream they are ordered by.
#ifdef NVIDIA_CLIENT_CUDA
#define CUDACHECK(call)                                                                  \
  do {                                                                                   \
    cudaError_t e_ = (call);                                                             \
    if (e_ != cudaSuccess) {                                                             \
      std::fprintf(stderr, "[rank %d] %s:%d: %s -> %s\n", gRank, __FILE__, __LINE__, #call, \
                   cudaGetErrorString(e_));                                              \
      return 1;                                                                          \
    }                                                                                    \
  } while (0)

class Mem {
 public:
  int init(int rank) {
    int n = 0;
    CUDACHECK(cudaGetDeviceCount(&n));
    CHECK(n > 0);
    CUDACHECK(cudaSetDevice(rank % n));
    CUDACHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    return 0;
  }
  ~Mem() {
    for (void* p : owned_) cudaFree(p);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  void* alloc(size_t bytes) {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes == 0 ? 1 : bytes) != cudaSuccess) return nullptr;
    owned_.push_back(p);
    return p;
  }
  // Enqueued on the stream; the host side must stay alive until sync().
  int put(void* dev, const void* host, size_t bytes) {
    CUDACHECK(cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, stream_));
    return 0;
  }
  int get(void* host, const void* dev, size_t bytes) {
    CUDACHECK(cudaMemcpyAsync(host, dev, bytes, cudaMemcpyDeviceToHost, stream_));
    return 0;
  }
  int sync() {
    CUDACHECK(cudaStreamSynchronize(stream_));
    return 0;
  }
  cudaStream_t stream() const { return stream_; }

 private:
  cudaStream_t stream_ = nullptr;
  std::vector<void*> owned_;
};
#else
class Mem {
 public:
  int init(int) { return 0; }
  ~Mem() {
    for (void* p : owned_) std::free(p);
  }
  void* alloc(size_t bytes) {
    void* p = std::malloc(bytes == 0 ? 1 : bytes);
    if (p != nullptr) owned_.push_back(p);
    return p;
  }
  int put(void* dst, const void* src, size_t bytes) {
    std::memcpy(dst, src, bytes);
    return 0;
  }
  int get(void* dst, const void* src, size_t bytes) {
    std::memcpy(dst, src, bytes);
    return 0;
  }
  int sync() { return 0; }
  cudaStream_t stream() const { return nullptr; }

 private:
  std::vector<void*> owned_;
};
#endif

template <typename T>
T* allocOf(Mem& mem, size_t count) {
  return static_cast<T*>(mem.alloc(count * sizeof(T)));
}

// A buffer holding a copy of `host` (enqueued on the stream), or nullptr.
template <typename T>
T* copyOf(Mem& mem, const std::vector<T>& host) {
  T* d = allocOf<T>(mem, host.size());
  if (d != nullptr && mem.put(d, host.data(), host.size() * sizeof(T)) != 0) return nullptr;
  return d;
}

// Enqueues the copy of `d` back into `host` (all of host.size()).
template <typename T>
int fetch(Mem& mem, std::vector<T>& host, const T* d) {
  return mem.get(host.data(), d, host.size() * sizeof(T));
}

double nowSeconds() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#ifdef NVIDIA_CLIENT_CUDA
// Rank 0 prints the time per call of a float sum all-reduce of `bytes`
// (median of 5 batches of `iters` calls after 3 warm-up calls) and its bus
// bandwidth, as nccl-tests counts it: 2 (n - 1) / n of the bytes.
int timeAllReduce(Mem& mem, ncclComm_t comm, int rank, int nranks, size_t bytes, int iters) {
  const size_t count = bytes / sizeof(float);
  float* buf = allocOf<float>(mem, count);
  CHECK(buf != nullptr);
  CUDACHECK(cudaMemsetAsync(buf, 0, bytes, mem.stream()));
  for (int i = 0; i < 3; ++i) {
    NCCLCHECK(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, mem.stream()));
  }
  CHECK(mem.sync() == 0);
  std::vector<double> batches;
  for (int b = 0; b < 5; ++b) {
    const double t0 = nowSeconds();
    for (int i = 0; i < iters; ++i) {
      NCCLCHECK(ncclAllReduce(buf, buf, count, ncclFloat32, ncclSum, comm, mem.stream()));
    }
    CHECK(mem.sync() == 0);
    batches.push_back((nowSeconds() - t0) / iters);
  }
  std::sort(batches.begin(), batches.end());
  const double t = batches[batches.size() / 2];
  if (rank == 0) {
    std::printf("perf: %d ranks, all_reduce float sum %zu B: %.1f us per call, busbw %.2f GB/s\n",
                nranks, bytes, t * 1e6, 2.0 * (nranks - 1) / nranks * bytes / t / 1e9);
  }
  return 0;
}
#endif

int runRank(int rank, int nranks, const ncclUniqueId& id) {
  gRank = rank;
  Mem mem;
  CHECK(mem.init(rank) == 0);
  ncclComm_t comm = nullptr;
  NCCLCHECK(ncclCommInitRank(&comm, nranks, id, rank));
  int n = -1, r = -1;
  NCCLCHECK(ncclCommCount(comm, &n));
  NCCLCHECK(ncclCommUserRank(comm, &r));
  CHECK(n == nranks && r == rank);
  cudaStream_t stream = mem.stream();

  // Every collective is enqueued on the stream between an asynchronous copy
  // in and an asynchronous copy out; the host looks at the results only after
  // one synchronisation at the end.

  // AllReduce, int32 sum, odd count, exact; then the same in place.
  const size_t count = (1u << 16) + 3;
  std::vector<int32_t> send(count), recv(count, -1), inplace(count, -1);
  for (size_t i = 0; i < count; ++i) send[i] = rank * 1000 + static_cast<int32_t>(i % 97);
  int32_t* dSend = copyOf(mem, send);
  int32_t* dRecv = allocOf<int32_t>(mem, count);
  CHECK(dSend != nullptr && dRecv != nullptr);
  NCCLCHECK(ncclAllReduce(dSend, dRecv, count, ncclInt32, ncclSum, comm, stream));
  CHECK(fetch(mem, recv, dRecv) == 0);
  NCCLCHECK(ncclAllReduce(dSend, dSend, count, ncclInt32, ncclSum, comm, stream));
  CHECK(fetch(mem, inplace, dSend) == 0);

  // AllGather, int32, unaligned count.
  const size_t per = 1001;
  std::vector<int32_t> mine(per), all(per * nranks, -1);
  for (size_t i = 0; i < per; ++i) mine[i] = rank * 100000 + static_cast<int32_t>(i);
  int32_t* dMine = copyOf(mem, mine);
  int32_t* dAll = allocOf<int32_t>(mem, all.size());
  CHECK(dMine != nullptr && dAll != nullptr);
  NCCLCHECK(ncclAllGather(dMine, dAll, per, ncclInt32, comm, stream));
  CHECK(fetch(mem, all, dAll) == 0);

  // ReduceScatter, int64 max: block p of rank q holds p * 7 + q + i.
  const size_t rsPer = 777;
  std::vector<int64_t> rsIn(rsPer * nranks), rsOut(rsPer, -1);
  for (int p = 0; p < nranks; ++p) {
    for (size_t i = 0; i < rsPer; ++i) rsIn[p * rsPer + i] = p * 7 + rank + static_cast<int64_t>(i);
  }
  int64_t* dRsIn = copyOf(mem, rsIn);
  int64_t* dRsOut = allocOf<int64_t>(mem, rsPer);
  CHECK(dRsIn != nullptr && dRsOut != nullptr);
  NCCLCHECK(ncclReduceScatter(dRsIn, dRsOut, rsPer, ncclInt64, ncclMax, comm, stream));
  CHECK(fetch(mem, rsOut, dRsOut) == 0);

  // Broadcast from the last rank, float (values exactly representable).
  const int root = nranks - 1;
  const size_t bcount = 4099;
  std::vector<float> src(bcount), dst(bcount, 0.0f);
  for (size_t i = 0; i < bcount; ++i) src[i] = rank == root ? 7.0f * i + 1.0f : -1.0f;
  float* dSrc = copyOf(mem, src);
  float* dDst = allocOf<float>(mem, bcount);
  CHECK(dSrc != nullptr && dDst != nullptr);
  NCCLCHECK(ncclBroadcast(dSrc, dDst, bcount, ncclFloat32, root, comm, stream));
  CHECK(fetch(mem, dst, dDst) == 0);

  // A group of two all-reduces (double sum and uint8 min), 3 and 0 elements.
  std::vector<double> g1(3);
  for (size_t i = 0; i < g1.size(); ++i) g1[i] = 0.5 * (rank + 1) + static_cast<double>(i);
  double* dG1 = copyOf(mem, g1);
  uint8_t* dG2 = allocOf<uint8_t>(mem, 0);
  CHECK(dG1 != nullptr && dG2 != nullptr);
  NCCLCHECK(ncclGroupStart());
  NCCLCHECK(ncclAllReduce(dG1, dG1, g1.size(), ncclFloat64, ncclSum, comm, stream));
  NCCLCHECK(ncclAllReduce(dG2, dG2, 0, ncclUint8, ncclMin, comm, stream));
  NCCLCHECK(ncclGroupEnd());
  CHECK(fetch(mem, g1, dG1) == 0);

  CHECK(mem.sync() == 0);
  const int32_t rankSum = 1000 * nranks * (nranks - 1) / 2;
  for (size_t i = 0; i < count; ++i) {
    CHECK(recv[i] == rankSum + nranks * static_cast<int32_t>(i % 97));
    CHECK(inplace[i] == recv[i]);
  }
  for (int p = 0; p < nranks; ++p) {
    for (size_t i = 0; i < per; ++i) {
      CHECK(all[p * per + i] == p * 100000 + static_cast<int32_t>(i));
    }
  }
  for (size_t i = 0; i < rsPer; ++i) {
    CHECK(rsOut[i] == rank * 7 + (nranks - 1) + static_cast<int64_t>(i));
  }
  for (size_t i = 0; i < bcount; ++i) CHECK(dst[i] == 7.0f * i + 1.0f);
  // Sums of halves and small integers: exact in double in any order.
  for (size_t i = 0; i < g1.size(); ++i) {
    CHECK(g1[i] == 0.25 * nranks * (nranks + 1) + nranks * static_cast<double>(i));
  }

#ifdef NVIDIA_CLIENT_CUDA
  CHECK(timeAllReduce(mem, comm, rank, nranks, 64u << 20, 10) == 0);
  CHECK(timeAllReduce(mem, comm, rank, nranks, 8, 200) == 0);
#endif

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

#ifdef NVIDIA_CLIENT_CUDA
// 0 when a GPU is usable, 77 (skipped, with the reason) when not. Asked in a
// child: CUDA must not be initialised in a process that forks afterwards.
int probeGpu() {
  pid_t pid = fork();
  if (pid < 0) {
    std::perror("fork");
    return 1;
  }
  if (pid == 0) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess || n == 0) {
      std::printf("SKIP: no usable GPU (%s)\n",
                  e != cudaSuccess ? cudaGetErrorString(e) : "no device");
      std::fflush(stdout);
      _exit(77);
    }
    std::printf("%d GPU(s) visible\n", n);
    std::fflush(stdout);
    _exit(0);
  }
  int status = 0;
  if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return 1;
  return WEXITSTATUS(status);
}
#endif

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
#ifdef NVIDIA_CLIENT_CUDA
  if (int rc = probeGpu(); rc != 0) return rc;
  const double limit = 240.0;
#else
  const double limit = 100.0;
#endif

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

  // Wait for all children, at most `limit` seconds (within ctest's timeout).
  int failed = 0;
  size_t left = pids.size();
  const double deadline = nowSeconds() + limit;
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
