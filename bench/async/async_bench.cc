// tutti-async-bench: what a caller sees of the progress engine (issue 25),
// between two processes forked after ncclGetUniqueId, over shared memory and
// over TCP (NCCL_SHM_DISABLE=1). docs/performance.md, "Asynchrony and abort".
//
// Phase 1, asynchrony (on the emulated accelerator, xpu_emu): 4 MiB float
// buffers from the plugin's memAlloc, a queue from its queueCreate passed as
// the stream, the input written by memcpyAsync on that queue right before
// the call, the result read back by memcpyAsync plus queueSynchronize on the
// same queue. For each kind (in-place all-reduce, all-gather, grouped
// send/recv): one first call with both ranks on time, then --trials calls in
// which one rank calls --late-ms late (rank 1 on even trials, rank 0 on odd
// ones); the time the on-time rank's call takes to return is recorded, and
// every result of every rank is compared exactly (fresh inputs each trial,
// so a stale result fails).
//
// Phase 2, abort (host memory, NULL stream): a --abort-bytes float
// all-reduce between the two ranks; --abort-delay-ms after both have called,
// a second thread of rank 0 calls ncclCommAbort. Recorded: whether the
// all-reduce was still running when the abort was called, the time from the
// abort call to rank 0's all-reduce returning, the time from the abort call
// to rank 1's all-reduce returning, and that both returned an error. A rank
// that has not ended --deadline-s after its phase started is killed and
// reported as a hang.
//
// Exit status: 0 when every result is exact, every call of phase 1 succeeded
// and, in phase 2, no process hung (every rank ended within --deadline-s and
// each all-reduce returned within --abort-bound-s of the abort) and, when
// the all-reduce was still running at the abort, both returned an error (one
// that had already ended is reported as such, not failed); 1 otherwise; 2 on
// bad usage. Times are reported, never asserted.
//
// The program speaks NCCL (include/nccl.h) and the backend plugin ABI
// (include/tutti/backend_plugin.h) only: the one thing it takes from tutti's
// internals is the plugin table and context the library loaded
// (core::processBackend(), as tests/device/async_test.cc does), so that its
// memory and queues are the ones the communicator sees.
#include <getopt.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "common/cli_parse.h"
#include "core/backend.h"
#include "nccl.h"
#include "tutti/backend_plugin.h"

#ifndef TUTTI_ASYNC_BENCH_PLUGIN_DIR
#define TUTTI_ASYNC_BENCH_PLUGIN_DIR ""
#endif

namespace {

constexpr int kRanks = 2;
constexpr int kKinds = 3;
constexpr int kTransports = 2;
constexpr int kMaxTrials = 1000;
const char* const kKindNames[kKinds] = {"AllReduceInPlace", "AllGather", "GroupedSendRecv"};
const char* const kTransportNames[kTransports] = {"shm", "tcp"};

struct Options {
  bool transports[kTransports] = {true, true};
  int trials = 10;
  int lateMs = 500;
  size_t bytes = 4u << 20;        // phase 1 buffers
  size_t abortBytes = 1ull << 30;  // phase 2 all-reduce; 0: no phase 2
  int abortDelayMs = 100;
  bool async = true;  // phase 1
  int deadlineS = 120;
  int abortBoundS = 20;  // an aborted call returning later than this counts as a hang
  double targetMs = 5;  // reported against, not asserted
};

int64_t nowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);  // one clock for every process of the host
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}
double msBetween(int64_t a, int64_t b) { return static_cast<double>(b - a) / 1e6; }

// Shared by the forked processes (MAP_SHARED, made before any fork).
struct Shared {
  std::atomic<int64_t> arrived[kTransports][2];  // barrier counters, per transport and phase
  // Phase 1, per transport and kind.
  double returnMs[kTransports][kKinds][kMaxTrials];
  std::atomic<int> inexact[kTransports][kKinds];
  std::atomic<int> failed[kTransports][kKinds];  // a call or a copy returned an error
  std::atomic<int> trialsDone[kTransports][kKinds];
  int asyncRan[kTransports];
  int asyncExit[kTransports][kRanks];  // exit status of the rank processes (-1: killed)
  char firstError[kTransports][256];
  // Phase 2, per transport.
  std::atomic<int> abortReturned0[kTransports];  // rank 0's all-reduce has returned
  int64_t tAbort[kTransports], tAbortDone[kTransports], tReturn[kTransports][kRanks];
  int abortRc[kTransports], rc[kTransports][kRanks], stillRunning[kTransports];
  int abortRan[kTransports];
  int abortExit[kTransports][kRanks];
  char abortError[kTransports][256];
};
Shared* g_shared = nullptr;

void noteError(char* slot, const std::string& what) {
  if (slot[0] == '\0') snprintf(slot, 256, "%s", what.c_str());
}

// Both ranks of one phase arrive; counts only go up, so it is reusable.
bool barrier(std::atomic<int64_t>* counter, int64_t* generation, int deadlineS) {
  ++*generation;
  counter->fetch_add(1);
  const int64_t deadline = nowNs() + static_cast<int64_t>(deadlineS) * 1000000000;
  while (counter->load() < kRanks * *generation) {
    if (nowNs() > deadline) return false;
    usleep(50);
  }
  return true;
}

// ---- the plugin, as the library loaded it ----------------------------------

struct Plugin {
  const tuttiBackendPlugin_v1* t = nullptr;
  void* ctx = nullptr;
  std::string error(const char* call, ncclResult_t rc) const {
    return std::string(call) + ": " + ncclGetErrorString(rc) + " (" + t->lastError(ctx) + ")";
  }
};

bool loadPlugin(Plugin* p, std::string* why) {
  auto b = tutti::core::processBackend();
  if (!b) {
    *why = "no backend: " + b.status().message();
    return false;
  }
  p->t = &b.value()->table();
  p->ctx = b.value()->context();
  if (b.value()->hostOnly()) {
    *why = "the backend is the CPU backend (set TUTTI_BACKEND_PLUGIN=xpu_emu)";
    return false;
  }
  if (!p->t->hostEventCreate || !p->t->hostEventSignal) {
    *why = std::string("backend ") + p->t->name + " has no host events (calls stay synchronous)";
    return false;
  }
  return true;
}

// ---- phase 1: asynchrony ------------------------------------------------------

// Integer-valued and small: every sum of two ranks is exact in float. The
// trial number makes each trial's inputs differ from the last one's.
float value(int rank, size_t i, int trial) {
  return static_cast<float>((i % 251) + 300 * rank + 1000 * (trial % 4000));
}

struct AsyncRank {
  int rank = 0, tr = 0;
  const Options* o = nullptr;
  Plugin pl;
  ncclComm_t comm = nullptr;
  tuttiPluginQueue_t q = nullptr;
  float* in = nullptr;
  float* out = nullptr;
  size_t count = 0;  // floats per buffer
  std::vector<float> host;

  bool fail(int kind, const std::string& what) {
    g_shared->failed[tr][kind].fetch_add(1);
    noteError(g_shared->firstError[tr], "rank " + std::to_string(rank) + ": " + what);
    return false;
  }
  // The input, written on the queue right before the call (as a kernel would).
  bool put(int kind, int trial) {
    const size_t n = kind == 1 ? count / 2 : count;
    host.resize(n);
    for (size_t i = 0; i < n; ++i) host[i] = value(rank, i, trial);
    ncclResult_t rc = pl.t->memcpyAsync(pl.ctx, in, host.data(), n * sizeof(float), q);
    return rc == ncclSuccess || fail(kind, pl.error("memcpyAsync (input)", rc));
  }
  ncclResult_t call(int kind) {
    const int peer = 1 - rank;
    cudaStream_t s = reinterpret_cast<cudaStream_t>(q);
    switch (kind) {
      case 0:
        return ncclAllReduce(in, in, count, ncclFloat32, ncclSum, comm, s);
      case 1:
        return ncclAllGather(in, out, count / 2, ncclFloat32, comm, s);
      default: {
        ncclResult_t rc = ncclGroupStart();
        if (rc == ncclSuccess) rc = ncclSend(in, count, ncclFloat32, peer, comm, s);
        if (rc == ncclSuccess) rc = ncclRecv(out, count, ncclFloat32, peer, comm, s);
        ncclResult_t end = ncclGroupEnd();
        return rc != ncclSuccess ? rc : end;
      }
    }
  }
  // The result, read back on the same queue; true when every element is exact.
  bool check(int kind, int trial) {
    host.assign(count, -1.0f);
    const float* src = kind == 0 ? in : out;
    ncclResult_t rc = pl.t->memcpyAsync(pl.ctx, host.data(), src, count * sizeof(float), q);
    if (rc != ncclSuccess) return fail(kind, pl.error("memcpyAsync (result)", rc));
    if ((rc = pl.t->queueSynchronize(pl.ctx, q)) != ncclSuccess)
      return fail(kind, pl.error("queueSynchronize", rc));
    const size_t half = count / 2;
    for (size_t i = 0; i < count; ++i) {
      float want;
      if (kind == 0)
        want = value(0, i, trial) + value(1, i, trial);
      else if (kind == 1)
        want = value(static_cast<int>(i / half), i % half, trial);
      else
        want = value(1 - rank, i, trial);
      if (host[i] != want) {
        g_shared->inexact[tr][kind].fetch_add(1);
        char buf[160];
        snprintf(buf, sizeof buf, "%s trial %d: element %zu is %.1f, expected %.1f",
                 kKindNames[kind], trial, i, static_cast<double>(host[i]),
                 static_cast<double>(want));
        noteError(g_shared->firstError[tr], "rank " + std::to_string(rank) + ": " + buf);
        return false;
      }
    }
    return true;
  }
};

int asyncRank(const Options& o, int tr, int rank, const ncclUniqueId& id) {
  AsyncRank a;
  a.rank = rank;
  a.tr = tr;
  a.o = &o;
  a.count = o.bytes / sizeof(float) / 2 * 2;
  std::string why;
  if (!loadPlugin(&a.pl, &why)) {
    noteError(g_shared->firstError[tr], why);
    return 1;
  }
  ncclResult_t rc = ncclCommInitRank(&a.comm, kRanks, id, rank);
  if (rc != ncclSuccess) {
    noteError(g_shared->firstError[tr], std::string("ncclCommInitRank: ") + ncclGetLastError(nullptr));
    return 1;
  }
  int dev = 0;
  (void)ncclCommCuDevice(a.comm, &dev);
  const Plugin& pl = a.pl;
  void* p = nullptr;
  if ((rc = pl.t->memAlloc(pl.ctx, dev, a.count * sizeof(float), &p)) != ncclSuccess) {
    noteError(g_shared->firstError[tr], pl.error("memAlloc", rc));
    return 1;
  }
  a.in = static_cast<float*>(p);
  if ((rc = pl.t->memAlloc(pl.ctx, dev, a.count * sizeof(float), &p)) != ncclSuccess) {
    noteError(g_shared->firstError[tr], pl.error("memAlloc", rc));
    return 1;
  }
  a.out = static_cast<float*>(p);
  if ((rc = pl.t->queueCreate(pl.ctx, dev, &a.q)) != ncclSuccess) {
    noteError(g_shared->firstError[tr], pl.error("queueCreate", rc));
    return 1;
  }
  int64_t gen = 0;
  bool ok = true;
  for (int k = 0; k < kKinds && ok; ++k) {
    // A first call of the kind (connections, schedules), both ranks on time.
    if (!barrier(&g_shared->arrived[tr][0], &gen, o.deadlineS)) return 1;
    if (!a.put(k, 0)) return 1;
    if ((rc = a.call(k)) != ncclSuccess) {
      a.fail(k, std::string(kKindNames[k]) + ": " + ncclGetLastError(a.comm));
      return 1;
    }
    a.check(k, 0);
    for (int t = 1; t <= o.trials; ++t) {
      if (!barrier(&g_shared->arrived[tr][0], &gen, o.deadlineS)) return 1;
      const int late = t % 2 == 1 ? 1 : 0;
      if (rank == late) usleep(static_cast<useconds_t>(o.lateMs) * 1000);
      if (!a.put(k, t)) return 1;
      const int64_t t0 = nowNs();
      rc = a.call(k);
      const int64_t t1 = nowNs();
      if (rc != ncclSuccess) {
        a.fail(k, std::string(kKindNames[k]) + ": " + ncclGetLastError(a.comm));
        ok = false;
        break;
      }
      if (rank != late) g_shared->returnMs[tr][k][t - 1] = msBetween(t0, t1);
      a.check(k, t);
      if (rank == 0) g_shared->trialsDone[tr][k].fetch_add(1);
    }
  }
  ncclResult_t async = ncclSuccess;
  if (ncclCommGetAsyncError(a.comm, &async) != ncclSuccess || async != ncclSuccess) {
    noteError(g_shared->firstError[tr], std::string("async error: ") + ncclGetErrorString(async));
    ok = false;
  }
  if ((rc = ncclCommDestroy(a.comm)) != ncclSuccess) {
    noteError(g_shared->firstError[tr], std::string("ncclCommDestroy: ") + ncclGetErrorString(rc));
    ok = false;
  }
  (void)pl.t->queueSynchronize(pl.ctx, a.q);
  (void)pl.t->queueDestroy(pl.ctx, a.q);
  (void)pl.t->memFree(pl.ctx, a.in);
  (void)pl.t->memFree(pl.ctx, a.out);
  return ok ? 0 : 1;
}

// ---- phase 2: abort while a large all-reduce moves data -------------------------

int abortRank(const Options& o, int tr, int rank, const ncclUniqueId& id) {
  Shared& s = *g_shared;
  ncclComm_t comm = nullptr;
  ncclResult_t rc = ncclCommInitRank(&comm, kRanks, id, rank);
  if (rc != ncclSuccess) {
    noteError(s.abortError[tr], std::string("ncclCommInitRank: ") + ncclGetLastError(nullptr));
    return 1;
  }
  const size_t count = o.abortBytes / sizeof(float);
  std::vector<float> send(count, static_cast<float>(rank + 1)), recv(count, 0.0f);  // pages touched
  // Connections made before the measured call (1 MiB: past the one-shot path).
  std::vector<float> small(1 << 18, 1.0f);
  if ((rc = ncclAllReduce(small.data(), small.data(), small.size(), ncclFloat32, ncclSum, comm,
                          nullptr)) != ncclSuccess ||
      small[0] != 2.0f || small.back() != 2.0f) {
    noteError(s.abortError[tr], std::string("warm-up all-reduce: ") + ncclGetLastError(comm));
    return 1;
  }
  int64_t gen = 0;
  if (!barrier(&s.arrived[tr][1], &gen, o.deadlineS)) return 1;
  std::thread aborter;
  if (rank == 0) {
    aborter = std::thread([&] {
      usleep(static_cast<useconds_t>(o.abortDelayMs) * 1000);
      s.stillRunning[tr] = s.abortReturned0[tr].load() ? 0 : 1;
      s.tAbort[tr] = nowNs();
      s.abortRc[tr] = ncclCommAbort(comm);
      s.tAbortDone[tr] = nowNs();
    });
  }
  rc = ncclAllReduce(send.data(), recv.data(), count, ncclFloat32, ncclSum, comm, nullptr);
  s.tReturn[tr][rank] = nowNs();
  s.rc[tr][rank] = rc;
  if (rank == 0) {
    s.abortReturned0[tr] = 1;
    aborter.join();
  } else {
    (void)ncclCommAbort(comm);
  }
  return 0;
}

// ---- the processes ----------------------------------------------------------------

// Forks the two ranks of one phase and waits for them, at most deadlineS;
// exits[r] is the rank's exit status, -1 when it had to be killed.
bool runPair(const Options& o, int (*body)(const Options&, int, int, const ncclUniqueId&), int tr,
             int exits[kRanks], char* errorSlot) {
  ncclUniqueId id;
  ncclResult_t rc = ncclGetUniqueId(&id);
  if (rc != ncclSuccess) {
    noteError(errorSlot, std::string("ncclGetUniqueId: ") + ncclGetLastError(nullptr));
    return false;
  }
  fflush(stdout);
  fflush(stderr);
  pid_t pids[kRanks];
  for (int r = 0; r < kRanks; ++r) {
    pids[r] = fork();
    if (pids[r] < 0) {
      noteError(errorSlot, std::string("fork: ") + strerror(errno));
      for (int k = 0; k < r; ++k) kill(pids[k], SIGKILL);
      return false;
    }
    if (pids[r] == 0) {
      int code = 1;
      try {
        code = body(o, tr, r, id);
      } catch (const std::exception& e) {
        noteError(errorSlot, std::string("exception: ") + e.what());
      }
      fflush(stdout);
      _exit(code);
    }
  }
  const int64_t deadline = nowNs() + static_cast<int64_t>(o.deadlineS) * 1000000000;
  int left = kRanks;
  bool done[kRanks] = {false, false};
  while (left > 0) {
    for (int r = 0; r < kRanks; ++r) {
      if (done[r]) continue;
      int st = 0;
      if (waitpid(pids[r], &st, WNOHANG) == pids[r]) {
        done[r] = true;
        --left;
        exits[r] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
      }
    }
    if (left > 0 && nowNs() > deadline) {
      for (int r = 0; r < kRanks; ++r)
        if (!done[r]) {
          kill(pids[r], SIGKILL);
          waitpid(pids[r], nullptr, 0);
          exits[r] = -1;
          noteError(errorSlot, "rank " + std::to_string(r) + " still running after " +
                                   std::to_string(o.deadlineS) + " s: killed (a hang)");
        }
      break;
    }
    if (left > 0) usleep(1000);
  }
  return true;
}

// Runs one transport's phases in a process of its own (the environment is
// set there, before ncclGetUniqueId).
void runTransport(const Options& o, int tr) {
  setenv("NCCL_SHM_DISABLE", tr == 1 ? "1" : "0", 1);
  Shared& s = *g_shared;
  if (o.async) {
    s.asyncRan[tr] = 1;
    runPair(o, asyncRank, tr, s.asyncExit[tr], s.firstError[tr]);
  }
  if (o.abortBytes > 0) {
    s.abortRan[tr] = 1;
    runPair(o, abortRank, tr, s.abortExit[tr], s.abortError[tr]);
  }
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int report(const Options& o) {
  Shared& s = *g_shared;
  bool good = true;
  if (o.async) {
    printf("# asynchrony: 2 processes on xpu_emu, %zu-byte float buffers, the peer %d ms late,\n"
           "# return time of the on-time rank's call over %d trials (after a first call of each kind)\n",
           o.bytes, o.lateMs, o.trials);
    printf("%-18s %-9s %6s %12s %12s %8s %6s\n", "kind", "transport", "trials", "median_ms",
           "max_ms", "<target", "exact");
    for (int tr = 0; tr < kTransports; ++tr) {
      if (!s.asyncRan[tr]) continue;
      const bool exited = s.asyncExit[tr][0] == 0 && s.asyncExit[tr][1] == 0;
      for (int k = 0; k < kKinds; ++k) {
        const int n = s.trialsDone[tr][k].load();
        std::vector<double> v(s.returnMs[tr][k], s.returnMs[tr][k] + n);
        const double mx = v.empty() ? 0 : *std::max_element(v.begin(), v.end());
        const bool exact = exited && n == o.trials && s.inexact[tr][k] == 0 && s.failed[tr][k] == 0;
        good = good && exact;
        printf("%-18s %-9s %6d %12.3f %12.3f %8s %6s\n", kKindNames[k], kTransportNames[tr], n,
               median(v), mx, n == 0 ? "-" : (mx < o.targetMs ? "yes" : "no"), exact ? "yes" : "no");
      }
      good = good && exited;
      if (s.firstError[tr][0]) printf("#   %s: %s\n", kTransportNames[tr], s.firstError[tr]);
    }
  }
  if (o.abortBytes > 0) {
    printf("# abort: 2 processes, a %zu-byte float all-reduce on host memory (NULL stream);\n"
           "# rank 0's second thread calls ncclCommAbort %d ms after both called\n",
           o.abortBytes, o.abortDelayMs);
    printf("%-9s %8s %14s %14s %12s %10s %6s\n", "transport", "running", "abort_to_ret0",
           "abort_to_ret1", "abort_call", "errors", "hang");
    for (int tr = 0; tr < kTransports; ++tr) {
      if (!s.abortRan[tr]) continue;
      const bool exited = s.abortExit[tr][0] == 0 && s.abortExit[tr][1] == 0;
      const bool measured = exited && s.tAbort[tr] != 0;
      bool hang = s.abortExit[tr][0] < 0 || s.abortExit[tr][1] < 0;
      for (int r = 0; r < kRanks && measured; ++r)
        if (msBetween(s.tAbort[tr], s.tReturn[tr][r]) > o.abortBoundS * 1000.0) {
          hang = true;
          printf("#   %s: rank %d returned more than %d s after the abort\n", kTransportNames[tr],
                 r, o.abortBoundS);
        }
      const bool err0 = s.rc[tr][0] != ncclSuccess, err1 = s.rc[tr][1] != ncclSuccess;
      const char* errors = !measured ? "-" : err0 && err1 ? "both" : err0 ? "rank0" : err1 ? "rank1" : "none";
      char r0[32] = "-", r1[32] = "-", call[32] = "-";
      if (measured) {
        snprintf(r0, sizeof r0, "%.3f ms", msBetween(s.tAbort[tr], s.tReturn[tr][0]));
        snprintf(r1, sizeof r1, "%.3f ms", msBetween(s.tAbort[tr], s.tReturn[tr][1]));
        snprintf(call, sizeof call, "%.3f ms", msBetween(s.tAbort[tr], s.tAbortDone[tr]));
      }
      printf("%-9s %8s %14s %14s %12s %10s %6s\n", kTransportNames[tr],
             measured ? (s.stillRunning[tr] ? "yes" : "no") : "-", r0, r1, call,
             errors, hang ? "yes" : "no");
      if (s.abortError[tr][0]) printf("#   %s: %s\n", kTransportNames[tr], s.abortError[tr]);
      if (measured && !s.stillRunning[tr])
        printf("#   %s: the all-reduce had ended before the abort (use a larger --abort-bytes)\n",
               kTransportNames[tr]);
      // Both calls end with an error when the abort came while data moved;
      // an all-reduce that had already ended is reported, not failed.
      good = good && measured && !hang && s.abortRc[tr] == ncclSuccess &&
             (!s.stillRunning[tr] || (err0 && err1));
    }
  }
  printf("# %s\n", good ? "PASS" : "FAIL");
  return good ? 0 : 1;
}

void usage(FILE* f) {
  fprintf(f,
          "usage: tutti-async-bench [--transport shm|tcp|both] [--trials N] [--late-ms MS]\n"
          "                         [--bytes SIZE] [--abort-bytes SIZE] [--abort-delay-ms MS]\n"
          "                         [--no-async] [--deadline-s S] [--abort-bound-s S]\n"
          "                         [--target-ms MS]\n"
          "  defaults: both transports, 10 trials, 500 ms late, 4M buffers, a 1G abort 100 ms\n"
          "  in (2 GiB of host memory per process; 0 leaves the abort out), 120 s per phase\n"
          "  before a rank counts as hung, 20 s for an aborted call to return; --no-async\n"
          "  leaves out the asynchrony phase; --target-ms only labels the <target column.\n");
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  static const option longOpts[] = {{"transport", required_argument, nullptr, 't'},
                                    {"trials", required_argument, nullptr, 'n'},
                                    {"late-ms", required_argument, nullptr, 'l'},
                                    {"bytes", required_argument, nullptr, 'b'},
                                    {"abort-bytes", required_argument, nullptr, 'a'},
                                    {"abort-delay-ms", required_argument, nullptr, 'd'},
                                    {"no-async", no_argument, nullptr, 'N'},
                                    {"deadline-s", required_argument, nullptr, 'D'},
                                    {"abort-bound-s", required_argument, nullptr, 'B'},
                                    {"target-ms", required_argument, nullptr, 'T'},
                                    {"help", no_argument, nullptr, 'h'},
                                    {nullptr, 0, nullptr, 0}};
  int c;
  long v = 0;
  while ((c = getopt_long(argc, argv, "", longOpts, nullptr)) != -1) {
    bool ok = true;
    switch (c) {
      case 't':
        o.transports[0] = !strcmp(optarg, "shm") || !strcmp(optarg, "both");
        o.transports[1] = !strcmp(optarg, "tcp") || !strcmp(optarg, "both");
        ok = o.transports[0] || o.transports[1];
        break;
      case 'n':
        ok = tutti::bench::parseLong(optarg, 1, kMaxTrials, &v);
        o.trials = static_cast<int>(v);
        break;
      case 'l':
        ok = tutti::bench::parseLong(optarg, 0, 60000, &v);
        o.lateMs = static_cast<int>(v);
        break;
      case 'b':
        ok = tutti::bench::parseSize(optarg, &o.bytes) && o.bytes >= 8 && o.bytes <= (1ull << 32);
        break;
      case 'a':
        ok = tutti::bench::parseSize(optarg, &o.abortBytes) && o.abortBytes <= (8ull << 30);
        break;
      case 'd':
        ok = tutti::bench::parseLong(optarg, 0, 60000, &v);
        o.abortDelayMs = static_cast<int>(v);
        break;
      case 'N':
        o.async = false;
        break;
      case 'D':
        ok = tutti::bench::parseLong(optarg, 1, 86400, &v);
        o.deadlineS = static_cast<int>(v);
        break;
      case 'B':
        ok = tutti::bench::parseLong(optarg, 1, 86400, &v);
        o.abortBoundS = static_cast<int>(v);
        break;
      case 'T':
        o.targetMs = atof(optarg);
        break;
      case 'h':
        usage(stdout);
        return 0;
      default:
        ok = false;
    }
    if (!ok) {
      if (c != '?' && optarg) fprintf(stderr, "tutti-async-bench: bad value '%s'\n", optarg);
      usage(stderr);
      return 2;
    }
  }
  if (optind != argc) {
    usage(stderr);
    return 2;
  }
  // The emulated accelerator from the build tree unless told otherwise; the
  // ranks are processes of this host.
  setenv("TUTTI_BACKEND_PLUGIN", "xpu_emu", 0);
  if (TUTTI_ASYNC_BENCH_PLUGIN_DIR[0]) setenv("TUTTI_PLUGIN_PATH", TUTTI_ASYNC_BENCH_PLUGIN_DIR, 0);
  setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  void* mem = mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS,
                   -1, 0);
  if (mem == MAP_FAILED) {
    perror("mmap");
    return 1;
  }
  g_shared = new (mem) Shared();
  // Each transport in a process of its own: this one never loads tutti's
  // state, so its environment stays the user's.
  for (int tr = 0; tr < kTransports; ++tr) {
    if (!o.transports[tr]) continue;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      return 1;
    }
    if (pid == 0) {
      runTransport(o, tr);
      fflush(stdout);
      _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
  }
  return report(o);
}
