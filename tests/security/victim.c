/* The victim of the security harness (issue 29, tests/security/attacks.sh,
 * bench/security/run.sh): a job of N ranks, real processes, that loops
 * all-reduces (checked exactly) and ncclCommSplit (with a checked all-reduce
 * on the child) and reports, per rank, how it went.
 *
 *   victim [options]
 *     -n N         ranks (4)
 *     -t SECONDS   run for this long (5; the ranks agree on when to stop)
 *     -i ITERS     or for this many iterations (0: by time only)
 *     -k K         a split into 2 colours every K iterations (5; 0: never)
 *     -e ELEMS     largest all-reduce, in elements (65536)
 *     -d MS        start delay: the parent gets the unique id, writes the
 *                  pid file, waits MS, then lets the ranks start their init
 *                  (attacks placed on the root listener meanwhile are seen
 *                  by init) (0)
 *     -s MS        stagger: rank r starts its init r*MS after the release (0)
 *     -p FILE      pid file, written (atomically) before the delay:
 *                    port=<root port> (0: unknown)
 *                    parent=<pid>
 *                    pids=<rank 0 pid> <rank 1 pid> ...
 *     -w SECONDS   watchdog: a rank still running after this exits with 4
 *                  (default: duration + 120)
 *     -I R         intruder: run rank R alone (NCCL_COMM_ID must be set),
 *                  contributing poisoned data, after the root listener of
 *                  NCCL_COMM_ID's port is up (read from /proc/net/tcp*)
 *     -U MS        id only: ncclGetUniqueId, print the root's port, hold the
 *                  listener MS milliseconds and exit (no rank, no traffic)
 *
 * With NCCL_COMM_ID set, every rank calls ncclGetUniqueId itself (as NCCL
 * allows; rank 0 hosts the root during its init). Without it the parent calls
 * it and hands the id to its children through pipes.
 *
 * The ranks are forked before ncclGetUniqueId: the id starts the root's
 * thread in the calling process, and forking a process with threads is unsafe.
 *
 * Output (stdout): one line per rank, then one for the job, e.g.
 *   rank=1 pid=.. ok=1 ops=.. splits=.. wrong=0 errors=0 init_ms=.. worst_op_ms=..
 *     worst_split_ms=.. maxrss_kb=.. err=""
 *   job ok=1 ranks=4 reported=4 crashed=0 failed=0 wrong=0 worst_init_ms=..
 *     worst_op_ms=.. worst_split_ms=.. max_rss_kb=.. parent_rss_kb=.. wall_ms=..
 * Exit status: 0 when every rank reported success with exact data, else 1.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "nccl.h"

struct cfg {
  int n, iters, k, delayMs, staggerMs, intruder, idOnlyMs;
  double seconds, watchdog;
  size_t maxElems;
  const char* pidfile;
};

static double nowMs(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static long maxRssKb(int who) {
  struct rusage ru;
  if (getrusage(who, &ru) != 0) return -1;
  return ru.ru_maxrss;
}

static void sleepMs(double ms) {
  if (ms <= 0) return;
  struct timespec ts = {(time_t)(ms / 1000), (long)((ms - 1000.0 * (long)(ms / 1000)) * 1e6)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

/* Port of the root inside the 128-byte id. A copy of the offsets of struct
 * UniqueIdData (src/core/bootstrap.h), which a C program cannot include:
 *   0 uint32 magic, 4 uint16 version, 6 uint16 flags, 8 uint64 rootHostId,
 *   16 uint16 family, 18 uint16 port (host byte order), 20 uint8 ip[16],
 *   36 secret/key... */
static unsigned idPort(const ncclUniqueId* id) {
  uint16_t port;
  memcpy(&port, id->internal + 18, sizeof(port));
  return port;
}

static unsigned commIdPort(void) {
  const char* c = getenv("NCCL_COMM_ID");
  if (!c) return 0;
  const char* colon = strrchr(c, ':');
  return colon ? (unsigned)atoi(colon + 1) : 0;
}

/* True when a socket in LISTEN state on `port` is in /proc/net/tcp{,6}. */
static int listening(unsigned port) {
  const char* files[] = {"/proc/net/tcp", "/proc/net/tcp6"};
  for (int f = 0; f < 2; ++f) {
    FILE* fp = fopen(files[f], "r");
    if (!fp) continue;
    char line[512];
    int found = 0;
    while (fgets(line, sizeof(line), fp)) {
      char local[128];
      unsigned st;
      if (sscanf(line, " %*d: %127s %*s %x", local, &st) != 2) continue;
      char* colon = strrchr(local, ':');
      if (colon && st == 0x0A && strtoul(colon + 1, NULL, 16) == port) found = 1;
    }
    fclose(fp);
    if (found) return 1;
  }
  return 0;
}

/* ---- one rank ---------------------------------------------------------- */

static int gRank = -1;
static volatile const char* gPhase = "start";
static int gOutFd = 1;

/* Writes one result line (a printf format) to where this rank reports (the
 * job's result pipe, or stdout); -1 when it could not. */
static int writeLine(const char* fmt, ...) {
  char line[1024];
  va_list ap;
  va_start(ap, fmt);
  int len = vsnprintf(line, sizeof(line), fmt, ap);
  va_end(ap);
  if (len < 0) return -1;
  if (len >= (int)sizeof(line)) len = (int)sizeof(line) - 1;
  return write(gOutFd, line, (size_t)len) < 0 ? -1 : 0;
}

static void onAlarm(int sig) {
  (void)sig;
  writeLine("rank=%d pid=%d ok=0 hung=1 phase=%s err=\"watchdog: still running\"\n", gRank,
            (int)getpid(), (const char*)gPhase);
  _exit(4);
}

/* What rank r contributes at element j of iteration it; the intruder adds
 * 1000 (integers stay exact in float: all sums are far below 2^24). */
static int contrib(int r, size_t j, int it, int poison) {
  return (r + 1) * (int)(j % 13 + 1) + it % 7 + (poison ? 1000 : 0);
}

struct stats {
  long ops, splits, wrong, errors;
  double initMs, worstOpMs, worstSplitMs;
  char err[512];
};

static void setErr(struct stats* s, const char* what, ncclComm_t comm, ncclResult_t rc) {
  if (s->err[0]) return;
  const char* last = ncclGetLastError(comm);
  snprintf(s->err, sizeof(s->err), "%s: %s (%d): %s", what, ncclGetErrorString(rc), (int)rc,
           last ? last : "");
  for (char* p = s->err; *p; ++p)
    if (*p == '"' || *p == '\n') *p = '\'';
}

/* One all-reduce of `count` elements over comm (whose members are the parent
 * ranks with members[i] the rank of child rank i), checked exactly. */
static int checkedAllReduce(ncclComm_t comm, int myParentRank, const int* members, int nmembers,
                            size_t count, int it, int useFloat, int poison, void* sbuf, void* rbuf,
                            struct stats* s, double* ms) {
  for (size_t j = 0; j < count; ++j) {
    int v = contrib(myParentRank, j, it, poison);
    if (useFloat)
      ((float*)sbuf)[j] = (float)v, ((float*)rbuf)[j] = -1.0f;
    else
      ((int32_t*)sbuf)[j] = v, ((int32_t*)rbuf)[j] = -1;
  }
  double t0 = nowMs();
  ncclResult_t rc =
      ncclAllReduce(sbuf, rbuf, count, useFloat ? ncclFloat32 : ncclInt32, ncclSum, comm, NULL);
  *ms = nowMs() - t0;
  if (rc != ncclSuccess) {
    s->errors++;
    setErr(s, "ncclAllReduce", comm, rc);
    return -1;
  }
  long bad = 0;
  for (size_t j = 0; j < count; ++j) {
    long want = 0;
    for (int m = 0; m < nmembers; ++m) want += contrib(members[m], j, it, 0);
    long got = useFloat ? (long)((float*)rbuf)[j] : ((int32_t*)rbuf)[j];
    if (useFloat && (float)got != ((float*)rbuf)[j]) got = -999999;
    if (got != want) ++bad;
  }
  if (bad) {
    s->wrong++;
    if (!s->err[0])
      snprintf(s->err, sizeof(s->err), "all-reduce %d: %ld of %zu elements wrong", it, bad, count);
  }
  s->ops++;
  return 0;
}

static int runRank(const struct cfg* c, int rank, ncclUniqueId id, int poison) {
  gRank = rank;
  signal(SIGALRM, onAlarm);
  alarm((unsigned)c->watchdog);
  struct stats s;
  memset(&s, 0, sizeof(s));
  ncclComm_t comm = NULL;
  gPhase = "init";
  double t0 = nowMs();
  ncclResult_t rc = ncclCommInitRank(&comm, c->n, id, rank);
  s.initMs = nowMs() - t0;
  size_t cap = c->maxElems < 1 ? 1 : c->maxElems;
  void* sbuf = malloc(cap * 4);
  void* rbuf = malloc(cap * 4);
  int* all = malloc(sizeof(int) * (size_t)c->n);
  int* mine = malloc(sizeof(int) * (size_t)c->n);
  for (int r = 0; r < c->n; ++r) all[r] = r;
  if (rc != ncclSuccess) {
    s.errors++;
    setErr(&s, "ncclCommInitRank", NULL, rc);
  }
  const size_t sizes[] = {1, 17, 1000, 4099, 65536, 262144};
  double deadline = nowMs() + c->seconds * 1e3;
  for (int it = 0; rc == ncclSuccess; ++it) {
    size_t count = sizes[it % (sizeof(sizes) / sizeof(sizes[0]))];
    if (count > cap) count = cap;
    double ms;
    gPhase = "allreduce";
    if (checkedAllReduce(comm, rank, all, c->n, count, it, it % 2, poison, sbuf, rbuf, &s, &ms))
      break;
    if (ms > s.worstOpMs) s.worstOpMs = ms;
    if (c->k > 0 && (it + 1) % c->k == 0) {
      gPhase = "split";
      ncclComm_t child = NULL;
      int color = rank % 2, nm = 0;
      for (int r = 0; r < c->n; ++r)
        if (r % 2 == color) mine[nm++] = r;
      double ts = nowMs();
      ncclResult_t src = ncclCommSplit(comm, color, rank, &child, NULL);
      double sms = nowMs() - ts;
      if (sms > s.worstSplitMs) s.worstSplitMs = sms;
      if (src != ncclSuccess) {
        s.errors++;
        setErr(&s, "ncclCommSplit", comm, src);
        break;
      }
      gPhase = "child allreduce";
      int crc = checkedAllReduce(child, rank, mine, nm, count < 4099 ? count : 4099, it, 0, poison,
                                 sbuf, rbuf, &s, &ms);
      if (ms > s.worstOpMs) s.worstOpMs = ms;
      gPhase = "child destroy";
      if (crc == 0) {
        ncclResult_t drc = ncclCommDestroy(child);
        if (drc != ncclSuccess) {
          s.errors++;
          setErr(&s, "ncclCommDestroy (child)", child, drc);
          break;
        }
      } else {
        ncclCommAbort(child);
        break;
      }
      s.splits++;
    }
    /* The ranks agree on when to stop: any rank past its deadline stops all. */
    gPhase = "stop vote";
    int32_t stop = c->iters > 0 ? it + 1 >= c->iters : nowMs() >= deadline;
    int32_t any = -1;
    double tv = nowMs();
    ncclResult_t vrc = ncclAllReduce(&stop, &any, 1, ncclInt32, ncclMax, comm, NULL);
    ms = nowMs() - tv;
    if (ms > s.worstOpMs) s.worstOpMs = ms;
    if (vrc != ncclSuccess) {
      s.errors++;
      setErr(&s, "ncclAllReduce (stop vote)", comm, vrc);
      break;
    }
    if (any != 0 && any != 1) {
      s.wrong++;
      if (!s.err[0]) snprintf(s.err, sizeof(s.err), "stop vote returned %d", (int)any);
      break;
    }
    if (any) break;
  }
  gPhase = "destroy";
  if (comm) {
    if (s.errors || s.wrong)
      ncclCommAbort(comm);
    else if ((rc = ncclCommDestroy(comm)) != ncclSuccess) {
      s.errors++;
      setErr(&s, "ncclCommDestroy", NULL, rc);
    }
  }
  alarm(0);
  int ok = s.errors == 0 && s.wrong == 0;
  if (writeLine("rank=%d pid=%d ok=%d ops=%ld splits=%ld wrong=%ld errors=%ld init_ms=%.1f "
                "worst_op_ms=%.1f worst_split_ms=%.1f maxrss_kb=%ld%s err=\"%s\"\n",
                rank, (int)getpid(), ok, s.ops, s.splits, s.wrong, s.errors, s.initMs,
                s.worstOpMs, s.worstSplitMs, maxRssKb(RUSAGE_SELF), poison ? " intruder=1" : "",
                s.err) != 0)
    return 5;
  return ok ? 0 : 1;
}

/* ---- the job ------------------------------------------------------------ */

static void usage(void) {
  fprintf(stderr,
          "usage: victim [-n N] [-t SEC] [-i ITERS] [-k K] [-e ELEMS] [-d MS] [-s MS] [-p FILE] "
          "[-w SEC] [-I RANK] [-U MS]\n");
  exit(2);
}

static void writePidfile(const char* path, unsigned port, const pid_t* pids, int n) {
  if (!path) return;
  char tmp[4096];
  snprintf(tmp, sizeof(tmp), "%s.tmp", path);
  FILE* f = fopen(tmp, "w");
  if (!f) {
    perror(tmp);
    return;
  }
  fprintf(f, "port=%u\nparent=%d\npids=", port, (int)getpid());
  for (int r = 0; r < n; ++r) fprintf(f, "%s%d", r ? " " : "", (int)pids[r]);
  fprintf(f, "\n");
  fclose(f);
  if (rename(tmp, path) != 0) perror(path);
}

int main(int argc, char** argv) {
  struct cfg c = {4, 0, 5, 0, 0, -1, -1, 5.0, -1, 65536, NULL};
  int opt;
  while ((opt = getopt(argc, argv, "n:t:i:k:e:d:s:p:w:I:U:")) != -1) {
    switch (opt) {
      case 'n':
        c.n = atoi(optarg);
        break;
      case 't':
        c.seconds = atof(optarg);
        break;
      case 'i':
        c.iters = atoi(optarg);
        break;
      case 'k':
        c.k = atoi(optarg);
        break;
      case 'e':
        c.maxElems = strtoull(optarg, NULL, 10);
        break;
      case 'd':
        c.delayMs = atoi(optarg);
        break;
      case 's':
        c.staggerMs = atoi(optarg);
        break;
      case 'p':
        c.pidfile = optarg;
        break;
      case 'w':
        c.watchdog = atof(optarg);
        break;
      case 'I':
        c.intruder = atoi(optarg);
        break;
      case 'U':
        c.idOnlyMs = atoi(optarg);
        break;
      default:
        usage();
    }
  }
  if (c.n < 1 || optind != argc) usage();
  if (c.watchdog <= 0) c.watchdog = c.seconds + 120;
  setvbuf(stdout, NULL, _IONBF, 0);
  const int commIdMode = getenv("NCCL_COMM_ID") != NULL;

  if (c.idOnlyMs >= 0) {
    ncclUniqueId id;
    ncclResult_t rc = ncclGetUniqueId(&id);
    if (rc != ncclSuccess) {
      printf("id ok=0 err=\"%s\"\n", ncclGetLastError(NULL));
      return 1;
    }
    unsigned port = commIdMode ? commIdPort() : idPort(&id);
    printf("id ok=1 port=%u pid=%d\n", port, (int)getpid());
    pid_t self = getpid();
    writePidfile(c.pidfile, port, &self, 1);
    sleepMs(c.idOnlyMs);
    return 0;
  }

  if (c.intruder >= 0) {
    if (!commIdMode) {
      fprintf(stderr, "victim -I: NCCL_COMM_ID must name the job's root\n");
      return 2;
    }
    unsigned port = commIdPort();
    double until = nowMs() + c.watchdog * 1e3;
    while (!listening(port) && nowMs() < until) sleepMs(2);
    ncclUniqueId id;
    ncclResult_t rc = ncclGetUniqueId(&id);
    if (rc != ncclSuccess) {
      printf("rank=%d ok=0 intruder=1 err=\"ncclGetUniqueId: %s\"\n", c.intruder,
             ncclGetLastError(NULL));
      return 1;
    }
    return runRank(&c, c.intruder, id, 1);
  }

  int results[2];
  if (pipe(results) != 0) return 2;
  /* static: reachable for as long as any process of the job lives (ranks
     return from main with them allocated; LeakSanitizer would call it a leak). */
  static pid_t* pids;
  static int* idPipes;
  pids = calloc((size_t)c.n, sizeof(pid_t));
  idPipes = calloc((size_t)c.n, sizeof(int));
  for (int r = 0; r < c.n; ++r) {
    int p[2];
    if (pipe(p) != 0) return 2;
    pid_t pid = fork();
    if (pid < 0) return 2;
    if (pid == 0) {
      close(results[0]);
      close(p[1]);
      for (int q = 0; q < r; ++q) close(idPipes[q]);
      gOutFd = results[1];
      ncclUniqueId id;
      if (read(p[0], &id, sizeof(id)) != (ssize_t)sizeof(id)) _exit(3);
      close(p[0]);
      sleepMs((double)r * c.staggerMs);
      if (commIdMode && ncclGetUniqueId(&id) != ncclSuccess) {
        if (writeLine("rank=%d pid=%d ok=0 err=\"ncclGetUniqueId: %s\"\n", r, (int)getpid(),
                      ncclGetLastError(NULL)) != 0)
          _exit(5);
        _exit(1);
      }
      _exit(runRank(&c, r, id, 0));
    }
    close(p[0]);
    idPipes[r] = p[1];
    pids[r] = pid;
  }
  close(results[1]);
  ncclUniqueId id;
  memset(&id, 0, sizeof(id));
  unsigned port = 0;
  if (commIdMode) {
    port = commIdPort();
  } else {
    if (ncclGetUniqueId(&id) != ncclSuccess) {
      fprintf(stderr, "victim: ncclGetUniqueId: %s\n", ncclGetLastError(NULL));
      for (int r = 0; r < c.n; ++r) kill(pids[r], SIGKILL);
      return 1;
    }
    port = idPort(&id);
  }
  writePidfile(c.pidfile, port, pids, c.n);
  fprintf(stderr, "victim: root_port=%u parent=%d ranks=%d delay_ms=%d\n", port, (int)getpid(), c.n,
          c.delayMs);
  sleepMs(c.delayMs);
  double t0 = nowMs();
  signal(SIGPIPE, SIG_IGN);
  for (int r = 0; r < c.n; ++r) {
    if (write(idPipes[r], &id, sizeof(id)) != (ssize_t)sizeof(id))
      fprintf(stderr, "victim: rank %d did not take its id\n", r);
    close(idPipes[r]);
  }

  /* Collect the ranks' lines, then their exit statuses. */
  int reported = 0, okRanks = 0;
  long wrong = 0, maxRss = 0;
  double worstInit = 0, worstOp = 0, worstSplit = 0;
  char buf[65536];
  size_t have = 0;
  for (;;) {
    ssize_t got = read(results[0], buf + have, sizeof(buf) - 1 - have);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) break;
    have += (size_t)got;
    buf[have] = 0;
    char* start = buf;
    char* nl;
    while ((nl = strchr(start, '\n')) != NULL) {
      *nl = 0;
      printf("%s\n", start);
      int r, ok;
      long w = 0, rss = 0;
      double im = 0, om = 0, sm = 0;
      if (sscanf(start, "rank=%d pid=%*d ok=%d", &r, &ok) == 2) {
        ++reported;
        okRanks += ok;
        const char* p;
        if ((p = strstr(start, " wrong="))) w = atol(p + 7);
        if ((p = strstr(start, " init_ms="))) im = atof(p + 9);
        if ((p = strstr(start, " worst_op_ms="))) om = atof(p + 13);
        if ((p = strstr(start, " worst_split_ms="))) sm = atof(p + 16);
        if ((p = strstr(start, " maxrss_kb="))) rss = atol(p + 11);
        wrong += w;
        if (im > worstInit) worstInit = im;
        if (om > worstOp) worstOp = om;
        if (sm > worstSplit) worstSplit = sm;
        if (rss > maxRss) maxRss = rss;
      }
      start = nl + 1;
    }
    have = (size_t)(buf + have - start);
    memmove(buf, start, have);
  }
  int crashed = 0, failed = 0;
  for (int r = 0; r < c.n; ++r) {
    int st = 0;
    while (waitpid(pids[r], &st, 0) < 0 && errno == EINTR) {
    }
    if (WIFSIGNALED(st)) {
      ++crashed;
      printf("rank=%d pid=%d ok=0 crashed=1 signal=%d\n", r, (int)pids[r], WTERMSIG(st));
    } else if (WEXITSTATUS(st) != 0) {
      ++failed;
      if (WEXITSTATUS(st) == 4) printf("rank=%d pid=%d hung=1 (watchdog)\n", r, (int)pids[r]);
    }
  }
  int jobOk = reported == c.n && okRanks == c.n && crashed == 0 && failed == 0 && wrong == 0;
  printf(
      "job ok=%d ranks=%d reported=%d crashed=%d failed=%d wrong=%ld worst_init_ms=%.1f "
      "worst_op_ms=%.1f worst_split_ms=%.1f max_rss_kb=%ld parent_rss_kb=%ld wall_ms=%.0f\n",
      jobOk, c.n, reported, crashed, failed, wrong, worstInit, worstOp, worstSplit, maxRss,
      maxRssKb(RUSAGE_SELF), nowMs() - t0);
  return jobOk ? 0 : 1;
}
