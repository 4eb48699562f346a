// A peer that dies mid-collective (SIGKILL): every surviving rank returns an
// error naming the dead rank within the configured time, and nothing hangs.
// Real processes; run once over shared memory and once over TCP.
//   peer_death <nranks> <victim> [count [hold]]   exit 0 when every survivor behaved.
// count (float elements, default 32 MiB worth) chooses the path: a large one
// makes the victim die while data is in flight on the rings; a small one
// (the one-shot arena) makes it die before it contributes, while the
// survivors wait for it in the arena.
// hold: a survivor keeps its failed communicator for 6 s before aborting it
// (as a program that does not call ncclCommAbort at once), and must have
// seen its error within 5 s: ranks that are not the dead rank's neighbours
// learn it from the survivors' failure notices, not from their closing
// connections.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "nccl.h"

int main(int argc, char** argv) {
  const int n = argc > 1 ? atoi(argv[1]) : 3;
  const int victim = argc > 2 ? atoi(argv[2]) : n - 1;
  const size_t count = argc > 3 ? strtoull(argv[3], nullptr, 10) : size_t{8} << 20;
  const bool small = count < 4096;
  const bool hold = argc > 4 && strcmp(argv[4], "hold") == 0;
  setenv("TUTTI_TIMEOUT", "30", 0);  // upper bound; death must be seen much sooner
  int pipes[2], ready[2];
  if (pipe(pipes) != 0 || pipe(ready) != 0) return 2;
  std::vector<pid_t> pids;
  std::vector<int> idPipes;
  // Fork before touching tutti: the unique id starts a listener thread, and a
  // process must not fork while other threads may hold locks.
  for (int r = 0; r < n; ++r) {
    int idp[2];
    if (pipe(idp) != 0) return 2;
    pid_t pid = fork();
    if (pid == 0) {
      close(pipes[0]);
      close(idp[1]);
      ncclUniqueId id;
      if (read(idp[0], &id, sizeof(id)) != static_cast<ssize_t>(sizeof(id))) _exit(3);
      ncclComm_t comm;
      if (ncclCommInitRank(&comm, n, id, r) != ncclSuccess) _exit(3);
      std::vector<float> buf(count, 1.0f);
      for (int it = 0;; ++it) {
        if (r == victim && it == 2) {
          // Tell the harness to kill us 20 ms into the next collective.
          char c = 'k';
          if (write(ready[1], &c, 1) != 1) _exit(5);
          if (small)
            for (;;) pause();  // the survivors wait for this rank in the arena
        }
        auto t0 = std::chrono::steady_clock::now();
        ncclResult_t rc =
            ncclAllReduce(buf.data(), buf.data(), count, ncclFloat, ncclSum, comm, nullptr);
        if (rc != ncclSuccess) {
          double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          std::string err = ncclGetLastError(comm);
          std::string want = "rank " + std::to_string(victim);
          bool named = err.find(want) != std::string::npos;
          char line[1024];
          snprintf(line, sizeof(line), "rank %d: error %d after %.2f s: %s%s\n", r, rc, s,
                   err.c_str(), named ? "" : "  <-- does not name the dead rank");
          if (write(pipes[1], line, strlen(line)) < 0) _exit(5);
          if (hold) sleep(6);
          ncclCommAbort(comm);
          _exit(named && s < (hold ? 5 : 20) ? 0 : 4);
        }
        if (it > 1000) _exit(6);  // the victim should be dead long before
      }
    }
    close(idp[0]);
    idPipes.push_back(idp[1]);
    pids.push_back(pid);
  }
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) return 2;
  for (int fd : idPipes) {
    if (write(fd, &id, sizeof(id)) != static_cast<ssize_t>(sizeof(id))) return 2;
    close(fd);
  }
  close(pipes[1]);
  close(ready[1]);
  char c;
  if (read(ready[0], &c, 1) == 1) {
    usleep(20000);
    kill(pids[victim], SIGKILL);
  }
  int failures = 0;
  for (int r = 0; r < n; ++r) {
    int status = 0;
    waitpid(pids[r], &status, 0);  // reaping at once lets shm see the death
    if (r == victim) {
      if (!WIFSIGNALED(status)) {
        fprintf(stderr, "victim was not killed\n");
        failures++;
      }
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "rank %d: exit status %d\n", r, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
      failures++;
    }
  }
  char buf[4096];
  ssize_t got;
  while ((got = read(pipes[0], buf, sizeof(buf))) > 0) fwrite(buf, 1, got, stdout);
  printf("%s\n", failures ? "FAILED" : "OK: every survivor named the dead rank");
  return failures ? 1 : 0;
}
