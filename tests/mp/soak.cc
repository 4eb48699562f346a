// A bounded randomized soak (issue 28): rounds of forked ranks (1 to 8 by
// default, odd and non-powers of two among them) that run a random program
// of lone collectives, groups of collectives, point-to-point rings and
// communicators split and destroyed, with every result checked exactly
// (tests/mp/random_calls.h); every K-th round one rank is killed (SIGKILL)
// in the middle, and every other rank must then fail within 5 s naming it
// (or have finished, when what was left of its program did not need the
// killed rank), never return wrong data, never hang. An error names the
// killed rank, or a rank that failed because of it and then aborted or
// ended (a truthful cause: that rank is what this one waited for). The victim is killed
// at most 20 ms after it starts a random step of the first half of its
// program (at its end if it gets there first).
//
//   mp_soak [--rounds R] [--seconds S] [--seed S] [--ranks 1,2,3,...]
//           [--kill-every K] [--steps M] [--max-bytes B] [--label NAME]
//
// Stops after R rounds or S seconds, whichever comes first (defaults: 6
// rounds, no time limit). The suite runs a short soak over shared memory
// and over TCP (ctest mp.soak.*); bench/fault/soak.sh a long one. Prints a
// line per round and the table row
//   case | rounds | ranks | calls checked | kills (met) | errored in time | hung | crashed |
//   wrong data | worst detection
// (met: kills some survivor met, the others having finished; errored in
// time: of those, every survivor that failed did within 5 s naming it)
// Exit status 0 when nothing was wrong, hung or crashed and every kill was
// seen in time.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cinttypes>
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

constexpr double kRoundLimitS = 120.0;  // a rank still running then is hung

struct Options {
  int rounds = 6;
  double seconds = 0;
  uint64_t seed = 0;
  std::vector<int> ranks = {1, 2, 3, 4, 5, 7, 8};
  int killEvery = 3;
  int steps = 12;
  size_t maxBytes = 1 << 20;
  std::string label;
};

// A rank's account of its round (one atomic write to the parent's pipe).
struct Report {
  int rank = -1;
  int checked = 0;       // calls whose result was checked, and right
  int wrong = 0;         // calls whose result was not right
  int failedStep = -1;   // the step whose call failed (-1: none)
  double errorAt = 0;    // CLOCK_MONOTONIC when it failed
  char message[1024] = {};
};
static_assert(sizeof(Report) < PIPE_BUF, "one atomic write");

struct Round {
  uint64_t seed;
  int n;
  int victim;      // -1: no kill
  int killStep;    // the victim says so as it starts this step ...
  int killDelayMs;  // ... and dies this long after
};

// The program of step `s`: what every rank does alike.
enum StepKind { kLone, kGroup, kRing, kSplit, kStepKinds };

struct Rank {
  const Options& o;
  const Round& round;
  int r;
  Report rep;
  int callNo = 0;  // the parent communicator's call numbers, for the values

  bool fail(ncclComm_t comm, int step, const char* what) {
    rep.failedStep = step;
    rep.errorAt = now();
    const std::string err = comm ? ncclGetLastError(comm) : "";
    snprintf(rep.message, sizeof(rep.message), "step %d (%s): %s", step, what, err.c_str());
    return false;
  }

  bool checked(int n, int rank, int it, const Call& c, const Buffers& b) {
    std::string why;
    if (check(rank, n, it, c, b, &why)) {
      ++rep.checked;
      return true;
    }
    ++rep.wrong;
    snprintf(rep.message, sizeof(rep.message), "wrong result: %s", why.c_str());
    return false;
  }

  // One lone call, or a group of them, on `comm` (n ranks, this one `rank`).
  bool calls(ncclComm_t comm, int n, int rank, uint64_t seed, int count, int step) {
    std::vector<Call> cs;
    std::vector<Buffers> bufs(count);
    std::vector<int> its;
    for (int k = 0; k < count; ++k) {
      its.push_back(callNo++);
      cs.push_back(callOf(seed, its.back(), n, o.maxBytes, true));
    }
    if (count > 1 && ncclGroupStart() != ncclSuccess) return fail(comm, step, "group start");
    for (int k = 0; k < count; ++k)
      if (issue(comm, rank, n, its[k], cs[k], &bufs[k]) != ncclSuccess) {
        if (count > 1) ncclGroupEnd();
        return fail(comm, step, kindName(cs[k].kind));
      }
    if (count > 1 && ncclGroupEnd() != ncclSuccess) return fail(comm, step, "group");
    for (int k = 0; k < count; ++k)
      if (!checked(n, rank, its[k], cs[k], bufs[k])) return false;
    return true;
  }

  // Each rank sends to its successor and receives from its predecessor.
  bool ring(ncclComm_t comm, int n, int step, std::mt19937_64& rng) {
    const size_t count = 1 + rng() % (o.maxBytes / 4);
    const int it = callNo++;
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    std::vector<int32_t> out(count), in(count, -1);
    for (size_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(valueOf(r, it, i));
    if (ncclGroupStart() != ncclSuccess) return fail(comm, step, "group start");
    if (ncclSend(out.data(), count, ncclInt32, next, comm, nullptr) != ncclSuccess ||
        ncclRecv(in.data(), count, ncclInt32, prev, comm, nullptr) != ncclSuccess) {
      ncclGroupEnd();
      return fail(comm, step, "send/recv");
    }
    if (ncclGroupEnd() != ncclSuccess) return fail(comm, step, "send/recv group");
    for (size_t i = 0; i < count; ++i)
      if (in[i] != valueOf(prev, it, i)) {
        ++rep.wrong;
        snprintf(rep.message, sizeof(rep.message),
                 "wrong result: receive of %zu from rank %d: element %zu is %d", count, prev, i,
                 in[i]);
        return false;
      }
    ++rep.checked;
    return true;
  }

  // Split by parity, ranks reversed by key; a call on the child; destroy it.
  bool split(ncclComm_t comm, int n, int step) {
    ncclComm_t child = nullptr;
    const int color = r % 2;
    if (ncclCommSplit(comm, color, n - r, &child, nullptr) != ncclSuccess)
      return fail(comm, step, "split");
    int cn = 0, cr = -1;
    ncclCommCount(child, &cn);
    ncclCommUserRank(child, &cr);
    const int wantN = (n - color + 1) / 2;  // ranks of this parity
    const int wantR = (n - 1 - r) / 2;      // reversed: the highest rank is child rank 0
    if (cn != wantN || cr != wantR) {
      ++rep.wrong;
      snprintf(rep.message, sizeof(rep.message),
               "split: child of %d ranks, this rank %d (want %d, %d)", cn, cr, wantN, wantR);
      ncclCommDestroy(child);
      return false;
    }
    Rank sub{o, round, cr, {}, 0};
    const bool ok = sub.calls(child, cn, cr, round.seed ^ (0x517 + static_cast<uint64_t>(step)), 1,
                              step);
    rep.checked += sub.rep.checked;
    rep.wrong += sub.rep.wrong;
    if (!ok) {
      rep.failedStep = step;
      rep.errorAt = sub.rep.errorAt;
      memcpy(rep.message, sub.rep.message, sizeof(rep.message));
    }
    ncclCommDestroy(child);
    return ok;
  }

  void run(ncclComm_t comm, int readyFd) {
    const int n = round.n;
    for (int step = 0; step < o.steps; ++step) {
      if (step == round.killStep && r == round.victim) {
        char c = 'k';
        if (write(readyFd, &c, 1) != 1) _exit(5);
      }
      std::mt19937_64 rng(round.seed * 7919u + static_cast<uint64_t>(step));
      bool ok = true;
      switch (static_cast<int>(rng() % kStepKinds)) {
        case kLone:
          ok = calls(comm, n, r, round.seed, 1, step);
          break;
        case kGroup:
          ok = calls(comm, n, r, round.seed, 2 + static_cast<int>(rng() % 3), step);
          break;
        case kRing:
          ok = ring(comm, n, step, rng);
          break;
        default:
          ok = split(comm, n, step);
          break;
      }
      if (!ok) return;
    }
  }
};

[[noreturn]] void rankMain(const Options& o, const Round& round, int r, int idp[2], int readyFd,
                           int reportFd) {
  ncclUniqueId id;
  if (r == 0) {
    if (ncclGetUniqueId(&id) != ncclSuccess) _exit(3);
    for (int q = 1; q < round.n; ++q)
      if (write(idp[1], &id, sizeof(id)) != static_cast<ssize_t>(sizeof(id))) _exit(3);
  } else if (read(idp[0], &id, sizeof(id)) != static_cast<ssize_t>(sizeof(id))) {
    _exit(3);
  }
  close(idp[0]);
  close(idp[1]);
  ncclComm_t comm;
  if (ncclCommInitRank(&comm, round.n, id, r) != ncclSuccess) _exit(3);
  Rank me{o, round, r, {}, 0};
  me.rep.rank = r;
  me.run(comm, readyFd);
  if (r == round.victim)
    for (;;) pause();  // ended before the kill: it dies as a live rank all the same
  if (me.rep.failedStep >= 0)
    ncclCommAbort(comm);
  else
    ncclCommDestroy(comm);
  if (write(reportFd, &me.rep, sizeof(me.rep)) != static_cast<ssize_t>(sizeof(me.rep))) _exit(5);
  _exit(0);
}

struct Tally {
  int rounds = 0, ranks = 0, checked = 0, kills = 0, met = 0, inTime = 0, hung = 0, crashed = 0,
      wrong = 0;
  int bad = 0;
  double worst = 0;
};

void runRound(const Options& o, const Round& round, Tally* t) {
  int idp[2], ready[2], reports[2];
  if (pipe(idp) != 0 || pipe(ready) != 0 || pipe(reports) != 0) {
    perror("pipe");
    exit(2);
  }
  std::vector<pid_t> pids;
  for (int r = 0; r < round.n; ++r) {
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      exit(2);
    }
    if (pid == 0) {
      close(ready[0]);
      close(reports[0]);
      rankMain(o, round, r, idp, round.victim >= 0 ? ready[1] : -1, reports[1]);
    }
    pids.push_back(pid);
  }
  close(idp[0]);
  close(idp[1]);
  close(ready[1]);
  close(reports[1]);
  double killAt = 0;
  if (round.victim >= 0) {
    // The victim's word as it starts its kill step (or its end: EOF).
    pollfd p{ready[0], POLLIN, 0};
    if (poll(&p, 1, 60000) > 0) {
      char c;
      const ssize_t got = read(ready[0], &c, 1);
      (void)got;  // a byte, or EOF when the victim ended first: either way, now
    }
    usleep(static_cast<useconds_t>(round.killDelayMs) * 1000);
    killAt = now();
    kill(pids[round.victim], SIGKILL);
    int st;
    waitpid(pids[round.victim], &st, 0);  // reaped at once: shared memory sees a dead pid
  }
  fcntl(reports[0], F_SETFL, fcntl(reports[0], F_GETFL) | O_NONBLOCK);
  std::vector<Report> reps;
  std::vector<int> ended(round.n, 0), status(round.n, 0);
  if (round.victim >= 0) ended[round.victim] = 1;
  int left = round.n - (round.victim >= 0 ? 1 : 0);
  const double limit = now() + kRoundLimitS;
  Report rep;
  while (left > 0 && now() < limit) {
    while (read(reports[0], &rep, sizeof(rep)) == static_cast<ssize_t>(sizeof(rep)))
      reps.push_back(rep);
    for (int r = 0; r < round.n; ++r)
      if (!ended[r] && waitpid(pids[r], &status[r], WNOHANG) == pids[r]) {
        ended[r] = 1;
        --left;
      }
    usleep(5000);
  }
  while (read(reports[0], &rep, sizeof(rep)) == static_cast<ssize_t>(sizeof(rep)))
    reps.push_back(rep);
  close(reports[0]);
  close(ready[0]);
  bool hung = false, crashed = false, wrong = false, late = false;
  int failedRanks = 0;
  auto failedRank = [&](int q) {
    for (const auto& x : reps)
      if (x.rank == q) return x.failedStep >= 0;
    return false;
  };
  double worst = 0;
  int checked = 0;
  std::string notes;
  for (int r = 0; r < round.n; ++r) {
    if (r == round.victim) continue;
    if (!ended[r]) {
      kill(pids[r], SIGKILL);
      waitpid(pids[r], &status[r], 0);
      hung = true;
      notes += " rank " + std::to_string(r) + " hung;";
      continue;
    }
    const Report* mine = nullptr;
    for (const auto& x : reps)
      if (x.rank == r) mine = &x;
    if (!WIFEXITED(status[r]) || WEXITSTATUS(status[r]) != 0 || !mine) {
      crashed = true;
      notes += " rank " + std::to_string(r) + " ended with status " +
               std::to_string(WIFEXITED(status[r]) ? WEXITSTATUS(status[r]) : -WTERMSIG(status[r])) +
               ";";
      continue;
    }
    if (getenv("SOAK_VERBOSE"))
      printf("  rank %d: %d checked, failed at step %d %.2f s after the kill: %s\n", r,
             mine->checked, mine->failedStep, killAt > 0 ? mine->errorAt - killAt : 0.0,
             mine->message);
    checked += mine->checked;
    if (mine->wrong) {
      wrong = true;
      notes += " rank " + std::to_string(r) + ": " + mine->message + ";";
      continue;
    }
    if (mine->failedStep >= 0) {
      ++failedRanks;
      const double detect = killAt > 0 ? mine->errorAt - killAt : -1;
      worst = std::max(worst, detect);
      // Without a kill nothing may fail; with one, within the bound, and
      // the error names a rank that failed: the victim, or a survivor that
      // failed because of it and then aborted or ended (its rank, or its
      // pid: in a communicator split off, ranks are numbered anew).
      const std::string msg = mine->message;
      bool named = false;
      for (int q = 0; q < round.n && round.victim >= 0; ++q) {
        if (q != round.victim && !failedRank(q)) continue;
        named |= msg.find("rank " + std::to_string(q) + " ") != std::string::npos ||
                 msg.find("pid " + std::to_string(pids[q])) != std::string::npos;
      }
      if (round.victim < 0 || !named || detect > kDetectLimitS) {
        late = true;
        notes += " rank " + std::to_string(r) + ": " +
                 (round.victim >= 0 ? "after " + std::to_string(detect) + " s: " : "") +
                 mine->message + ";";
      }
    }
  }
  // A kill that no survivor met (their programs ended first) is no error.
  if (round.victim >= 0 && failedRanks == 0) notes += " (the survivors had finished);";
  const bool ok = !hung && !crashed && !wrong && !late;
  t->rounds++;
  t->ranks += round.n;
  t->checked += checked;
  t->hung += hung;
  t->crashed += crashed;
  t->wrong += wrong;
  t->bad += !ok;
  if (round.victim >= 0) {
    t->kills++;
    t->met += failedRanks > 0;
    t->inTime += failedRanks > 0 && !hung && !crashed && !late;
    t->worst = std::max(t->worst, worst);
  }
  printf("round seed %" PRIu64 ": %d ranks, %s%d calls checked: %s%s\n", round.seed, round.n,
         round.victim >= 0
             ? ("rank " + std::to_string(round.victim) + " killed " +
                std::to_string(round.killDelayMs) + " ms into step " +
                std::to_string(round.killStep) + ", ")
                   .c_str()
             : "",
         checked, ok ? "ok" : "FAILED --", notes.c_str());
  fflush(stdout);
}

std::vector<int> parseList(const char* s) {
  std::vector<int> v;
  for (const char* p = s; *p;) {
    char* end = nullptr;
    long x = strtol(p, &end, 10);
    if (end == p || x < 1 || x > 64) return {};
    v.push_back(static_cast<int>(x));
    p = *end == ',' ? end + 1 : end;
    if (*end && *end != ',') return {};
  }
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  o.seed = static_cast<uint64_t>(time(nullptr));
  o.label = getenv("NCCL_SHM_DISABLE") ? "soak, tcp" : "soak, shm";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const char* v = argv[i + 1];
    if (a == "--rounds")
      o.rounds = atoi(v);
    else if (a == "--seconds")
      o.seconds = atof(v);
    else if (a == "--seed")
      o.seed = strtoull(v, nullptr, 10);
    else if (a == "--ranks")
      o.ranks = parseList(v);
    else if (a == "--kill-every")
      o.killEvery = atoi(v);
    else if (a == "--steps")
      o.steps = atoi(v);
    else if (a == "--max-bytes")
      o.maxBytes = strtoull(v, nullptr, 10);
    else if (a == "--label")
      o.label = v;
    else {
      fprintf(stderr,
              "usage: mp_soak [--rounds R] [--seconds S] [--seed S] [--ranks 1,2,3] "
              "[--kill-every K] [--steps M] [--max-bytes B] [--label NAME]\n");
      return 2;
    }
  }
  if (o.ranks.empty() || o.rounds < 1 || o.steps < 1 || o.maxBytes < 4) {
    fprintf(stderr, "mp_soak: bad arguments (--ranks takes numbers 1 to 64, comma-separated)\n");
    return 2;
  }
  setenv("TUTTI_TIMEOUT", "20", 0);
  signal(SIGPIPE, SIG_IGN);
  printf("soak: %d rounds%s from seed %" PRIu64 ", %d steps, up to %zu bytes, a kill every %d\n",
         o.rounds, o.seconds > 0 ? " (or the time limit)" : "", o.seed, o.steps, o.maxBytes,
         o.killEvery);
  Tally t;
  const double start = now();
  for (int i = 0; i < o.rounds; ++i) {
    if (o.seconds > 0 && now() - start > o.seconds) break;
    Round round;
    round.seed = o.seed + static_cast<uint64_t>(i);
    std::mt19937_64 rng(round.seed);
    round.n = o.ranks[rng() % o.ranks.size()];
    const bool kill = o.killEvery > 0 && i % o.killEvery == o.killEvery - 1 && round.n >= 2;
    round.victim = kill ? static_cast<int>(rng() % static_cast<uint64_t>(round.n)) : -1;
    round.killStep = static_cast<int>(rng() % static_cast<uint64_t>(std::max(1, o.steps / 2)));
    round.killDelayMs = static_cast<int>(rng() % 20);
    runRound(o, round, &t);
  }
  printf(
      "case | rounds | ranks | calls checked | kills (met) | errored in time | hung | crashed | "
      "wrong data | worst detection\n");
  printf("%s | %d | %d | %d | %d (%d) | %d | %d | %d | %d | %.2f s\n", o.label.c_str(), t.rounds,
         t.ranks, t.checked, t.kills, t.met, t.inTime, t.hung, t.crashed, t.wrong, t.worst);
  return t.bad ? 1 : 0;
}
