// A rank killed (SIGKILL) at a random moment of a loop of collectives of
// random kind and size; the survivors must each see an error naming it within
// 5 s of the kill, drop it with ncclCommShrink(..., NCCL_SHRINK_ABORT) and go
// on with exact results on the new communicator (issue 28). Real processes:
// run once over shared memory, once over TCP (NCCL_SHM_DISABLE=1).
//
//   mp_death_shrink [--ranks N] [--trials T] [--seed S] [--label NAME]
//
// Each trial forks N ranks (8 by default; the parent never touches tutti);
// rank 0 makes the unique id. The seed picks the victim, the moment (0 to
// 500 ms after every rank finished two collectives) and the sequence of
// collectives every rank runs alike (tests/mp/random_calls.h): all-reduce,
// reduce, reduce-scatter (sum, max or min), broadcast (a random root) and
// all-gather, float32, float64, int32, int64 or uint8, 1 element to 16 MiB
// per buffer. Every result that returns success is checked exactly
// (small integers), before the kill and after it. TUTTI_TIMEOUT is 20 s
// unless set: detection within 5 s must not come from the timeout.
//
// Per trial, a line; at the end the row of the table
//   case | trials | errored in time | hung | crashed | wrong data | worst detection
// and exit status 0 when every survivor of every trial errored in time naming
// the victim, shrank, and computed exactly; 1 otherwise.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "nccl.h"
#include "tests/mp/random_calls.h"

namespace {

using namespace tutti::test;

// Per buffer of a collective (smaller under a sanitizer: kDetectLimitS).
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr size_t kMaxBytes = 1 << 20;
#else
constexpr size_t kMaxBytes = 16 << 20;
#endif
constexpr double kTrialLimitS = 90.0;  // a survivor still running then is hung

// What a survivor tells the parent (one write, below PIPE_BUF: atomic).
struct Report {
  int rank = -1;
  int iterations = 0;  // collectives that returned success
  int wrong = 0;       // of those, results that were not exact
  int named = 0;       // the error named the victim
  int shrinkRc = -1;   // ncclCommShrink's result
  int newOk = 0;       // the new communicator: size, rank and results right
  double errorAt = 0;  // CLOCK_MONOTONIC when the failing call returned
  char message[320] = {};
};
static_assert(sizeof(Report) < PIPE_BUF, "one atomic write");

// Runs call `c` (number `it`) on `comm` as rank r of n: true when it
// succeeded, with *exact whether its result was right (*why where not).
bool runCall(ncclComm_t comm, int r, int n, int it, const Call& c, bool* exact, std::string* why) {
  Buffers b;
  if (issue(comm, r, n, it, c, &b) != ncclSuccess) return false;
  *exact = check(r, n, it, c, b, why);
  return true;
}

// The new communicator: n-1 ranks, this rank renumbered densely, exact
// results for a few calls (zero, one and odd counts among them).
bool checkShrunk(ncclComm_t nc, int oldRank, int victim, int n, uint64_t seed, std::string* why) {
  int count = -1, rank = -1;
  ncclCommCount(nc, &count);
  ncclCommUserRank(nc, &rank);
  const int wantRank = oldRank - (oldRank > victim ? 1 : 0);
  if (count != n - 1 || rank != wantRank) {
    *why = "new communicator has " + std::to_string(count) + " ranks, this rank " +
           std::to_string(rank) + " (want " + std::to_string(n - 1) + ", " +
           std::to_string(wantRank) + ")";
    return false;
  }
  // A zero-count all-reduce, then six calls of the shared sequence's kinds.
  ncclResult_t rc = ncclAllReduce(nullptr, nullptr, 0, ncclFloat, ncclSum, nc, nullptr);
  if (rc != ncclSuccess) {
    *why = std::string("zero-count all-reduce: ") + ncclGetErrorString(rc);
    return false;
  }
  for (int it = 0; it < 6; ++it) {
    Call c = callOf(seed ^ 0x5eed, it, n - 1, kMaxBytes, true);
    if (it == 0) c.count = 1;
    if (it == 1) c.count = 100003;  // odd, not a multiple of anything
    bool exact = false;
    std::string wrong;
    if (!runCall(nc, rank, n - 1, 1000 + it, c, &exact, &wrong)) {
      *why = std::string("after the shrink, ") + kindName(c.kind) + ": " + ncclGetLastError(nc);
      return false;
    }
    if (!exact) {
      *why = "after the shrink, " + wrong;
      return false;
    }
  }
  return true;
}

[[noreturn]] void rankMain(int r, int n, int victim, uint64_t seed, int idRead, int idWrite,
                           int readyFd, int reportFd) {
  ncclUniqueId id;
  if (r == 0) {
    if (ncclGetUniqueId(&id) != ncclSuccess) _exit(3);
    for (int q = 1; q < n; ++q)
      if (write(idWrite, &id, sizeof(id)) != static_cast<ssize_t>(sizeof(id))) _exit(3);
  } else if (read(idRead, &id, sizeof(id)) != static_cast<ssize_t>(sizeof(id))) {
    _exit(3);
  }
  close(idRead);
  close(idWrite);
  ncclComm_t comm;
  if (ncclCommInitRank(&comm, n, id, r) != ncclSuccess) _exit(3);
  Report rep;
  rep.rank = r;
  const double start = now();
  for (int it = 0;; ++it) {
    if (it == 2) {
      char c = 'r';
      if (write(readyFd, &c, 1) != 1) _exit(5);
    }
    const Call call = callOf(seed, it, n, kMaxBytes, true);
    bool exact = false;
    std::string wrong;
    if (runCall(comm, r, n, it, call, &exact, &wrong)) {
      ++rep.iterations;
      if (!exact) {
        ++rep.wrong;
        snprintf(rep.message, sizeof(rep.message), "%s", wrong.c_str());
      }
      if (now() - start > kTrialLimitS) {  // the victim should be long dead
        snprintf(rep.message, sizeof(rep.message), "no error in %.0f s", kTrialLimitS);
        break;
      }
      continue;
    }
    rep.errorAt = now();
    const std::string err = ncclGetLastError(comm);
    rep.named = err.find("rank " + std::to_string(victim)) != std::string::npos;
    if (!rep.wrong) snprintf(rep.message, sizeof(rep.message), "%s", err.c_str());
    int exclude = victim;
    ncclComm_t nc = nullptr;
    rep.shrinkRc = ncclCommShrink(comm, &exclude, 1, &nc, nullptr, NCCL_SHRINK_ABORT);
    if (rep.shrinkRc == ncclSuccess) {
      std::string why;
      rep.newOk = checkShrunk(nc, r, victim, n, seed, &why);
      if (!rep.newOk) snprintf(rep.message, sizeof(rep.message), "%s", why.c_str());
      ncclCommDestroy(nc);
    } else {
      snprintf(rep.message, sizeof(rep.message), "shrink: %s", ncclGetLastError(comm));
    }
    break;
  }
  ncclCommAbort(comm);
  if (write(reportFd, &rep, sizeof(rep)) != static_cast<ssize_t>(sizeof(rep))) _exit(5);
  _exit(0);
}

struct Tally {
  int trials = 0, inTime = 0, hung = 0, crashed = 0, wrong = 0, failed = 0;
  double worst = 0;
};

// One trial; true when every survivor behaved.
bool trial(int n, uint64_t seed, Tally* t) {
  std::mt19937_64 rng(seed);
  const int victim = static_cast<int>(rng() % static_cast<uint64_t>(n));
  const int delayMs = static_cast<int>(rng() % 500);
  int idp[2], ready[2], reports[2];
  if (pipe(idp) != 0 || pipe(ready) != 0 || pipe(reports) != 0) return false;
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    pid_t pid = fork();
    if (pid < 0) return false;
    if (pid == 0) {
      close(ready[0]);
      close(reports[0]);
      rankMain(r, n, victim, seed, idp[0], idp[1], ready[1], reports[1]);
    }
    pids.push_back(pid);
  }
  close(idp[0]);
  close(idp[1]);
  close(ready[1]);
  close(reports[1]);
  // Every rank through two collectives, then the kill.
  int readyCount = 0;
  const double readyBy = now() + 60;
  while (readyCount < n && now() < readyBy) {
    pollfd p{ready[0], POLLIN, 0};
    if (poll(&p, 1, 100) > 0) {
      char c;
      if (read(ready[0], &c, 1) != 1) break;
      ++readyCount;
    }
  }
  double killAt = 0;
  if (readyCount == n) {
    usleep(static_cast<useconds_t>(delayMs) * 1000);
    killAt = now();
    kill(pids[victim], SIGKILL);
  } else {
    kill(pids[victim], SIGKILL);
  }
  int st = 0;
  waitpid(pids[victim], &st, 0);  // reaped at once: shared memory sees a dead pid
  // Survivors: their reports, and how they ended.
  std::vector<Report> reps;
  std::vector<int> ended(n, 0), status(n, 0);
  ended[victim] = 1;
  const double limit = now() + kTrialLimitS + 30;
  int left = n - 1;
  int flags = fcntl(reports[0], F_GETFL);
  fcntl(reports[0], F_SETFL, flags | O_NONBLOCK);
  while (left > 0 && now() < limit) {
    Report rep;
    while (read(reports[0], &rep, sizeof(rep)) == static_cast<ssize_t>(sizeof(rep)))
      reps.push_back(rep);
    for (int r = 0; r < n; ++r)
      if (!ended[r] && waitpid(pids[r], &status[r], WNOHANG) == pids[r]) {
        ended[r] = 1;
        --left;
      }
    usleep(5000);
  }
  Report rep;
  while (read(reports[0], &rep, sizeof(rep)) == static_cast<ssize_t>(sizeof(rep)))
    reps.push_back(rep);
  close(reports[0]);
  close(ready[0]);
  bool ok = readyCount == n;
  bool inTime = readyCount == n;  // every survivor errored within the bound, naming the victim
  int hung = 0, crashed = 0, wrong = 0;
  double worst = 0;
  std::string notes;
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    if (!ended[r]) {
      // Where it hangs, for the one who has to find out: every thread's
      // stack, with gdb, into DEATH_SHRINK_STACKS_DIR (bench/fault/death_shrink.sh -g).
      if (const char* dir = getenv("DEATH_SHRINK_STACKS_DIR")) {
        const std::string cmd = "gdb -p " + std::to_string(pids[r]) +
                                " -batch -ex 'thread apply all bt' > " + dir + "/seed" +
                                std::to_string(seed) + "-rank" + std::to_string(r) +
                                ".txt 2>&1";
        if (system(cmd.c_str()) != 0) fprintf(stderr, "death_shrink: gdb failed (%s)\n", cmd.c_str());
      }
      kill(pids[r], SIGKILL);
      waitpid(pids[r], &status[r], 0);
      ++hung;
      inTime = false;
      ok = false;
      notes += " rank " + std::to_string(r) + " hung;";
      continue;
    }
    if (WIFSIGNALED(status[r]) || !WIFEXITED(status[r]) || WEXITSTATUS(status[r]) != 0) {
      ++crashed;
      inTime = false;
      notes +=
          " rank " + std::to_string(r) + " ended with status " +
          std::to_string(WIFEXITED(status[r]) ? WEXITSTATUS(status[r]) : -WTERMSIG(status[r])) +
          ";";
      continue;
    }
    auto it = std::find_if(reps.begin(), reps.end(), [r](const Report& x) { return x.rank == r; });
    if (it == reps.end()) {
      ++crashed;
      inTime = false;
      ok = false;
      notes += " rank " + std::to_string(r) + " sent no report;";
      continue;
    }
    if (it->wrong) ++wrong;
    const double detect = it->errorAt > 0 && killAt > 0 ? it->errorAt - killAt : -1;
    worst = std::max(worst, detect);
    const bool good = !it->wrong && it->errorAt > 0 && detect <= kDetectLimitS && it->named &&
                      it->shrinkRc == ncclSuccess && it->newOk;
    inTime = inTime && it->errorAt > 0 && detect <= kDetectLimitS && it->named;
    if (getenv("DEATH_SHRINK_VERBOSE"))
      printf("  rank %d: %d calls, error after %.2f s: %s\n", r, it->iterations, detect,
             it->message);
    if (!good)
      notes += " rank " + std::to_string(r) + ": " + (it->named ? "" : "(victim not named) ") +
               (detect > kDetectLimitS ? "(late: " + std::to_string(detect) + " s) " : "") +
               it->message + ";";
    ok = ok && good;
  }
  t->trials++;
  t->hung += hung > 0;
  t->crashed += crashed > 0;
  t->wrong += wrong > 0;
  t->failed += !ok;
  t->inTime += inTime;
  t->worst = std::max(t->worst, worst);
  printf("trial seed %" PRIu64 ": victim %d killed %d ms in: %s, worst detection %.2f s%s%s\n",
         seed, victim, delayMs, ok ? "ok" : "FAILED", worst, notes.empty() ? "" : " --",
         notes.c_str());
  if (readyCount != n) printf("  only %d of %d ranks started\n", readyCount, n);
  fflush(stdout);
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  int n = 8, trials = 5;
  uint64_t seed = static_cast<uint64_t>(time(nullptr));
  std::string label =
      getenv("NCCL_SHM_DISABLE") ? "rank death + shrink, tcp" : "rank death + shrink, shm";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--ranks")
      n = atoi(argv[i + 1]);
    else if (a == "--trials")
      trials = atoi(argv[i + 1]);
    else if (a == "--seed")
      seed = strtoull(argv[i + 1], nullptr, 10);
    else if (a == "--label")
      label = argv[i + 1];
    else {
      fprintf(stderr,
              "usage: mp_death_shrink [--ranks N] [--trials T] [--seed S] [--label NAME]\n");
      return 2;
    }
  }
  if (n < 2 || trials < 1) {
    fprintf(stderr, "mp_death_shrink: need at least 2 ranks and 1 trial\n");
    return 2;
  }
  setenv("TUTTI_TIMEOUT", "20", 0);
  signal(SIGPIPE, SIG_IGN);
  printf("%d ranks, %d trials from seed %" PRIu64 " (TUTTI_TIMEOUT=%s)\n", n, trials, seed,
         getenv("TUTTI_TIMEOUT"));
  Tally t;
  for (int i = 0; i < trials; ++i) trial(n, seed + static_cast<uint64_t>(i), &t);
  printf("case | trials | errored in time | hung | crashed | wrong data | worst detection\n");
  printf("%s | %d | %d | %d | %d | %d | %.2f s\n", label.c_str(), t.trials, t.inTime, t.hung,
         t.crashed, t.wrong, t.worst);
  return t.failed ? 1 : 0;
}
