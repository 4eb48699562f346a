#include "launch.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <string>
#include <thread>
#include <vector>

#ifdef TUTTI_PERF_WITH_MPI
#include <mpi.h>
#endif

#include "bench.h"
#include "nccl.h"
#include "slurm.h"

namespace tutti::perf {
namespace {

// ---- environment -------------------------------------------------------------

// 0: absent, 1: a valid integer in [lo, hi], -1: present but malformed.
int envInt(const char* name, int lo, int hi, int* out) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return 0;
  char* end = nullptr;
  errno = 0;
  long x = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || errno != 0 || x < lo || x > hi) return -1;
  *out = static_cast<int>(x);
  return 1;
}

bool haveEnv(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0';
}

// ---- one rank -----------------------------------------------------------------

int g_timeout_rank = 0;

void onAlarm(int) {
  char msg[96];
  int len = std::snprintf(msg, sizeof(msg), "tutti-perf: rank %d: timed out (-T/--timeout)\n",
                          g_timeout_rank);
  if (len > 0) {
    ssize_t ignored = write(STDERR_FILENO, msg, static_cast<size_t>(len));
    (void)ignored;
  }
  _exit(kExitTimeout);
}

void armTimeout(const Options& opts, int rank) {
  if (opts.timeout_s <= 0) return;
  g_timeout_rank = rank;
  struct sigaction sa {};
  sa.sa_handler = onAlarm;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGALRM, &sa, nullptr);
  alarm(static_cast<unsigned>(opts.timeout_s));
}

// --mem device: the rank's device is local rank % device count, set before
// the communicator is made (it is bound to the current device), as nccl-tests
// calls cudaSetDevice. tutti's calls are looked up at run time: another NCCL
// library has none, and --mem device then fails later with the reason.
void setRankDevice(const Options& opts, int rank, int local_rank) {
  if (opts.mem != Mem::kDevice) return;
  using CountFn = ncclResult_t (*)(int*);
  using SetFn = ncclResult_t (*)(int);
  auto count = reinterpret_cast<CountFn>(dlsym(RTLD_DEFAULT, "tuttiGetDeviceCount"));
  auto set = reinterpret_cast<SetFn>(dlsym(RTLD_DEFAULT, "tuttiSetDevice"));
  int n = 0;
  if (!count || !set || count(&n) != ncclSuccess || n < 1) return;
  if (set(local_rank % n) != ncclSuccess) {
    const char* last = ncclGetLastError(nullptr);
    std::fprintf(stderr, "tutti-perf: rank %d: tuttiSetDevice(%d): %s\n", rank, local_rank % n,
                 last ? last : "failed");
  }
}

int runRank(const Options& opts, int rank, int size, int local_rank, const ncclUniqueId& id) {
  if (rank == 0) printPreamble(opts, size);
  setRankDevice(opts, rank, local_rank);
  const long long rss_before_init = residentBytes();
  ncclComm_t comm = nullptr;
  ncclResult_t res = ncclCommInitRank(&comm, size, id, rank);
  if (res != ncclSuccess) {
    const char* last = ncclGetLastError(nullptr);
    std::fprintf(stderr, "tutti-perf: rank %d: ncclCommInitRank(nranks=%d) failed: %s%s%s\n", rank,
                 size, ncclGetErrorString(res), (last && *last) ? ": " : "", last ? last : "");
    return kExitError;
  }
  RankContext ctx;
  ctx.rank = rank;
  ctx.nranks = size;
  ctx.local_rank = local_rank;
  ctx.comm = comm;
  ctx.rss_before_init = rss_before_init;
  int rc = runBenchmark(opts, ctx);
  // NCCL's orderly shutdown: flush (collectively) before freeing.
  res = ncclCommFinalize(comm);
  if (res != ncclSuccess && rc == kExitOk) {
    std::fprintf(stderr, "tutti-perf: rank %d: ncclCommFinalize failed: %s\n", rank,
                 ncclGetErrorString(res));
    rc = kExitError;
  }
  res = ncclCommDestroy(comm);
  if (res != ncclSuccess && rc == kExitOk) {
    std::fprintf(stderr, "tutti-perf: rank %d: ncclCommDestroy failed: %s\n", rank,
                 ncclGetErrorString(res));
    rc = kExitError;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  return rc;
}

bool getId(ncclUniqueId* id, const char* who) {
  ncclResult_t res = ncclGetUniqueId(id);
  if (res == ncclSuccess) return true;
  const char* last = ncclGetLastError(nullptr);
  std::fprintf(stderr, "tutti-perf: %s: ncclGetUniqueId failed: %s%s%s\n", who,
               ncclGetErrorString(res), (last && *last) ? ": " : "", last ? last : "");
  return false;
}

// ---- fork mode ----------------------------------------------------------------

std::vector<pid_t> g_children;

void forwardSignal(int sig) {
  for (pid_t p : g_children) {
    if (p > 0) kill(p, sig);
  }
}

bool readAll(int fd, void* buf, size_t len) {
  char* p = static_cast<char*>(buf);
  while (len > 0) {
    ssize_t r = read(fd, p, len);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    len -= static_cast<size_t>(r);
  }
  return true;
}

bool writeAll(int fd, const void* buf, size_t len) {
  const char* p = static_cast<const char*>(buf);
  while (len > 0) {
    ssize_t w = write(fd, p, len);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    len -= static_cast<size_t>(w);
  }
  return true;
}

[[noreturn]] void childMain(const Options& opts, int rank, int np, int id_fd, pid_t parent) {
#ifdef __linux__
  prctl(PR_SET_PDEATHSIG, SIGKILL);
#endif
  if (getppid() != parent) _exit(kExitError);
  armTimeout(opts, rank);
  ncclUniqueId id;
  if (!readAll(id_fd, &id, sizeof(id))) _exit(kExitError);  // the parent says why
  close(id_fd);
  int rc = runRank(opts, rank, np, rank, id);
  std::fflush(stdout);
  std::fflush(stderr);
  _exit(rc);
}

const char* firstEnv(std::initializer_list<const char*> names) {
  for (const char* n : names)
    if (haveEnv(n)) return std::getenv(n);
  return "";
}

// srun with no PMI for MPI to use: the ranks take the root's address from the
// job step (bench/tutti_perf/slurm.h) as NCCL_COMM_ID. kExitOk, or kExitUsage
// with the reason on stderr.
int setSlurmCommId(const LaunchEnv& env) {
  const std::string list =
      firstEnv({"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"});
  const std::string job = firstEnv({"SLURM_JOB_ID", "SLURM_JOBID"});
  const std::string step = firstEnv({"SLURM_STEP_ID", "SLURM_STEPID"});
  const std::string host = firstSlurmHost(list);
  const int port = slurmRootPort(job, step);
  if (host.empty() || port < 0) {
    std::fprintf(stderr,
                 "tutti-perf: rank %d: launched by srun without PMI and NCCL_COMM_ID is not set; "
                 "cannot derive the root's address from SLURM_STEP_NODELIST='%s', "
                 "SLURM_JOB_ID='%s', SLURM_STEP_ID='%s': set NCCL_COMM_ID=<host of rank 0>:<free "
                 "port> for every rank, or use srun --mpi=pmix\n",
                 env.rank, list.c_str(), job.c_str(), step.c_str());
    return kExitUsage;
  }
  const std::string comm_id = host + ":" + std::to_string(port);
  if (env.rank == 0) {
    const char* me = std::getenv("SLURMD_NODENAME");
    if (me != nullptr && *me != '\0' && host != me) {
      std::fprintf(stderr,
                   "tutti-perf: rank 0 runs on %s, not on the step's first node %s (an srun "
                   "--distribution other than block?), so the derived NCCL_COMM_ID=%s would not "
                   "be rank 0's: set NCCL_COMM_ID=<host of rank 0>:<free port> for every rank\n",
                   me, host.c_str(), comm_id.c_str());
      return kExitUsage;
    }
    std::fprintf(stderr,
                 "tutti-perf: srun without PMI: the ranks meet at NCCL_COMM_ID=%s (the step's "
                 "first node; the port from the job and step ids)\n",
                 comm_id.c_str());
  }
  setenv("NCCL_COMM_ID", comm_id.c_str(), 1);
  return kExitOk;
}

// Exit codes every rank returns together: no reason to stop the others.
bool collectiveExit(int code) {
  return code == kExitOk || code == kExitWrongResults || code == kExitUsage;
}

}  // namespace

bool detectLaunch(LaunchEnv* env, std::string* error) {
  struct Source {
    LaunchEnv::Kind kind;
    const char* name;
    const char* rank;
    const char* size;
    const char* local;
  };
  // torchrun first: under srun or mpirun one torchrun per node sets RANK itself.
  const Source sources[] = {
      {LaunchEnv::Kind::kTorchrun, "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"},
      {LaunchEnv::Kind::kMpi, "mpirun (Open MPI)", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
       "OMPI_COMM_WORLD_LOCAL_RANK"},
      {LaunchEnv::Kind::kMpi, "mpirun (PMI)", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"},
      {LaunchEnv::Kind::kSlurm, "srun", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_LOCALID"},
  };
  for (const Source& s : sources) {
    if (!haveEnv(s.rank) || !haveEnv(s.size)) continue;
    // A batch script outside srun has SLURM_PROCID=0 but no job step.
    if (s.kind == LaunchEnv::Kind::kSlurm && !haveEnv("SLURM_STEP_ID")) continue;
    int size = 0, rank = 0, local = 0;
    if (envInt(s.size, 1, 1 << 24, &size) != 1 || envInt(s.rank, 0, size - 1, &rank) != 1) {
      *error = std::string("launched by ") + s.name + " but " + s.rank + "='" +
               std::getenv(s.rank) + "' / " + s.size + "='" + std::getenv(s.size) +
               "' is not a valid rank / size";
      return false;
    }
    if (envInt(s.local, 0, 1 << 24, &local) != 1) local = 0;
    env->kind = s.kind;
    env->name = s.name;
    env->rank = rank;
    env->size = size;
    env->local_rank = local;
    return true;
  }
  env->kind = LaunchEnv::Kind::kLocal;
  return true;
}

int runForked(const Options& opts) {
  const int np = opts.np;
  if (opts.coll->has_root && opts.root >= np) {
    std::fprintf(stderr, "tutti-perf: -r/--root %d is not a rank: --np %d starts ranks 0..%d\n",
                 opts.root, np, np - 1);
    return kExitUsage;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t parent = getpid();
  std::vector<int> id_fds;
  g_children.assign(np, -1);
  for (int r = 0; r < np; ++r) {
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0) {
      std::fprintf(stderr, "tutti-perf: pipe: %s\n", std::strerror(errno));
      forwardSignal(SIGKILL);
      return kExitError;
    }
    pid_t pid = fork();
    if (pid < 0) {
      std::fprintf(stderr, "tutti-perf: fork of rank %d failed: %s\n", r, std::strerror(errno));
      forwardSignal(SIGKILL);
      return kExitError;
    }
    if (pid == 0) {
      close(fds[1]);
      for (int fd : id_fds) close(fd);
      childMain(opts, r, np, fds[0], parent);
    }
    close(fds[0]);
    id_fds.push_back(fds[1]);
    g_children[r] = pid;
  }

  struct sigaction sa {};
  sa.sa_handler = forwardSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  // Only now, with every child forked, touch tutti: the id's root listener
  // (if the library keeps one) lives in this process, which outlives the ranks.
  ncclUniqueId id;
  bool ok = getId(&id, "launcher");
  for (int r = 0; r < np; ++r) {
    if (ok && !writeAll(id_fds[r], &id, sizeof(id))) {
      std::fprintf(stderr, "tutti-perf: could not pass the unique id to rank %d: %s\n", r,
                   std::strerror(errno));
    }
    close(id_fds[r]);
  }

  int result = ok ? kExitOk : kExitError;
  int remaining = np;
  bool stopping = false;
  auto kill_deadline = std::chrono::steady_clock::time_point::max();
  while (remaining > 0) {
    int status = 0;
    pid_t pid = waitpid(-1, &status, stopping ? WNOHANG : 0);
    if (pid < 0) {
      if (errno == EINTR) continue;
      break;
    }
    if (pid == 0) {  // stopping, nothing exited yet
      if (std::chrono::steady_clock::now() > kill_deadline) {
        forwardSignal(SIGKILL);
        kill_deadline = std::chrono::steady_clock::time_point::max();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      continue;
    }
    int rank = -1;
    for (int r = 0; r < np; ++r) {
      if (g_children[r] == pid) rank = r;
    }
    if (rank < 0) continue;
    g_children[rank] = -1;
    --remaining;
    int code;
    if (WIFEXITED(status)) {
      code = WEXITSTATUS(status);
    } else if (WIFSIGNALED(status)) {
      code = 128 + WTERMSIG(status);
      if (!stopping) {
        std::fprintf(stderr, "tutti-perf: rank %d (pid %d) was killed by signal %d (%s)\n", rank,
                     static_cast<int>(pid), WTERMSIG(status), strsignal(WTERMSIG(status)));
      }
    } else {
      continue;
    }
    // Report the first real failure; a wrong-results exit yields to it.
    if (code != kExitOk &&
        (result == kExitOk || (result == kExitWrongResults && !collectiveExit(code)))) {
      result = code;
    }
    if (!collectiveExit(code) && !stopping) {
      if (remaining > 0) {
        std::fprintf(stderr,
                     "tutti-perf: rank %d failed (exit code %d); stopping the other ranks\n", rank,
                     code);
      }
      stopping = true;
      forwardSignal(SIGTERM);
      kill_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
    }
  }
  return result;
}

int runLaunched(const Options& opts, const LaunchEnv& env) {
  armTimeout(opts, env.rank);
  if (opts.np_given && opts.np != env.size && env.rank == 0) {
    std::fprintf(stderr, "tutti-perf: --np %d ignored: launched by %s with %d ranks\n", opts.np,
                 env.name, env.size);
  }
  char who[64];
  std::snprintf(who, sizeof(who), "rank %d", env.rank);
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (env.size == 1) {
    if (!getId(&id, who)) return kExitError;
    return runRank(opts, env.rank, env.size, env.local_rank, id);
  }

  if (env.kind == LaunchEnv::Kind::kTorchrun && !haveEnv("NCCL_COMM_ID")) {
    const char* addr = std::getenv("MASTER_ADDR");
    int port = 0;
    if (addr == nullptr || *addr == '\0' || envInt("MASTER_PORT", 1, 65534, &port) != 1) {
      std::fprintf(stderr,
                   "tutti-perf: rank %d: launched by torchrun (RANK/WORLD_SIZE set) but "
                   "MASTER_ADDR/MASTER_PORT are missing or invalid, and NCCL_COMM_ID is not set\n",
                   env.rank);
      return kExitUsage;
    }
    // The rendezvous store listens on MASTER_PORT; tutti's root takes the next one.
    std::string comm_id = std::strchr(addr, ':') != nullptr && addr[0] != '['
                              ? "[" + std::string(addr) + "]:" + std::to_string(port + 1)
                              : std::string(addr) + ":" + std::to_string(port + 1);
    setenv("NCCL_COMM_ID", comm_id.c_str(), 1);
  }

  if (env.kind == LaunchEnv::Kind::kTorchrun) {
    if (!getId(&id, who)) return kExitError;
    return runRank(opts, env.rank, env.size, env.local_rank, id);
  }

  // srun without --mpi=pmix or pmi2 leaves no PMI(x) variables: MPI could not
  // see the other tasks (MPI_Init would make a singleton, or abort), so the
  // job step's variables give the root's address instead.
  const bool slurm_without_pmi = env.kind == LaunchEnv::Kind::kSlurm && !haveEnv("PMIX_RANK") &&
                                 !haveEnv("PMIX_NAMESPACE") && !haveEnv("PMI_FD");
  if (slurm_without_pmi && !haveEnv("NCCL_COMM_ID")) {
    int rc = setSlurmCommId(env);
    if (rc != kExitOk) return rc;
  }

#ifdef TUTTI_PERF_WITH_MPI
  int mpi_size = 0, mpi_rank = 0;
  if (!slurm_without_pmi && MPI_Init(nullptr, nullptr) == MPI_SUCCESS &&
      MPI_Comm_size(MPI_COMM_WORLD, &mpi_size) == MPI_SUCCESS &&
      MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank) == MPI_SUCCESS && mpi_size == env.size) {
    int ok = 1;
    if (mpi_rank == 0 || haveEnv("NCCL_COMM_ID")) ok = getId(&id, who) ? 1 : 0;
    MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    if (!ok) {
      MPI_Finalize();
      return kExitError;
    }
    if (!haveEnv("NCCL_COMM_ID")) MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, MPI_COMM_WORLD);
    int rc = runRank(opts, mpi_rank, mpi_size, env.local_rank, id);
    MPI_Finalize();
    return rc;
  }
  if (!haveEnv("NCCL_COMM_ID")) {
    std::fprintf(stderr,
                 "tutti-perf: rank %d: launched by %s with %d ranks, but MPI reports %d; set "
                 "NCCL_COMM_ID=<host of rank 0>:<free port> for every rank (or use srun --mpi=pmix "
                 "so that MPI sees the job)\n",
                 env.rank, env.name, env.size, mpi_size);
    return kExitUsage;
  }
#else
  if (!haveEnv("NCCL_COMM_ID")) {
    std::fprintf(stderr,
                 "tutti-perf: rank %d: launched by %s with %d ranks, but this tutti-perf was built "
                 "without MPI, so the ranks cannot exchange the unique id: set NCCL_COMM_ID=<host "
                 "of rank 0>:<free port> in every rank's environment (or launch with torchrun, or "
                 "rebuild with MPI)\n",
                 env.rank, env.name, env.size);
    return kExitUsage;
  }
#endif
  if (!getId(&id, who)) return kExitError;
  return runRank(opts, env.rank, env.size, env.local_rank, id);
}

}  // namespace tutti::perf
