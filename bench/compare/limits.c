/* Physical limits for bench/compare: what this machine allows at best, to
 * compare the all-reduce figures with. Plain POSIX, built by run.sh with cc -O2.
 *
 *   limits memcpy    [MiB] [runs]           single-core memcpy of a MiB-sized buffer
 *                                            (256), median of runs (7); GB/s = bytes
 *                                            copied / s (each byte: one read + one write)
 *   limits tcp-one   [seconds] [sockbuf]    one TCP stream on 127.0.0.1, one direction,
 *                                            for seconds (1.0); GB/s = bytes received / s
 *   limits tcp-bidir [seconds] [sockbuf]    two processes, two TCP connections on
 *                                            127.0.0.1, one per direction; each process
 *                                            sends on one (a thread) and receives on the
 *                                            other (main thread) at the same time
 *
 * Sockets: TCP_NODELAY, SO_SNDBUF and SO_RCVBUF set to sockbuf bytes (4 MiB;
 * 0 leaves the kernel's autotuning), 1 MiB writes. Senders write for `seconds`
 * and then shut their side down; a receiver's rate is the bytes it read up to
 * end-of-stream over the time from its start to end-of-stream.
 *
 * Output, one CSV line per figure, GB = 1e9 bytes:
 *   memcpy,<GB/s>
 *   tcp_one,<GB/s>
 *   tcp_bidir_per_dir,<GB/s>    mean of the two directions' rates (bytes one side sent / s)
 *   tcp_bidir_aggregate,<GB/s>  sum of the two directions' rates
 * Details (effective socket buffer sizes, each direction) go to stderr. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (1u << 20)

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void die(const char* what) {
  fprintf(stderr, "limits: %s: %s\n", what, strerror(errno));
  exit(1);
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

/* ---- memcpy ---------------------------------------------------------------- */

static int run_memcpy(size_t mib, int runs) {
  size_t bytes = mib << 20;
  char* src = malloc(bytes);
  char* dst = malloc(bytes);
  if (!src || !dst) die("malloc");
  memset(src, 1, bytes);  /* pre-touch: page faults are not part of the figure */
  memset(dst, 2, bytes);
  memcpy(dst, src, bytes);  /* warm-up */
  double* gbs = malloc(sizeof(double) * runs);
  for (int r = 0; r < runs; ++r) {
    double t0 = now();
    memcpy(dst, src, bytes);
    double t = now() - t0;
    gbs[r] = bytes / t / 1e9;
    src[r % bytes] ^= dst[(r * 4099) % bytes];  /* keep the copies observable */
  }
  qsort(gbs, runs, sizeof(double), cmp_double);
  double med = runs % 2 ? gbs[runs / 2] : (gbs[runs / 2 - 1] + gbs[runs / 2]) / 2;
  fprintf(stderr, "limits: memcpy %zu MiB, %d runs: min %.3f median %.3f max %.3f GB/s\n", mib,
          runs, gbs[0], med, gbs[runs - 1]);
  printf("memcpy,%.4f\n", med);
  free(gbs);
  free(src);
  free(dst);
  return 0;
}

/* ---- TCP ------------------------------------------------------------------- */

static int sockbuf = 4 << 20;

static void tune(int fd) {
  int one = 1;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one))) die("TCP_NODELAY");
  if (sockbuf > 0) {
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &sockbuf, sizeof(sockbuf))) die("SO_SNDBUF");
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &sockbuf, sizeof(sockbuf))) die("SO_RCVBUF");
  }
}

static void report_buffers(int fd, const char* who) {
  int snd = 0, rcv = 0;
  socklen_t len = sizeof(int);
  getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &snd, &len);
  len = sizeof(int);
  getsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcv, &len);
  fprintf(stderr, "limits: %s socket buffers (as the kernel reports them): snd %d rcv %d\n", who,
          snd, rcv);
}

/* Listener on 127.0.0.1, ephemeral port; tuned so accepted sockets inherit the
 * buffer sizes (the receive window scale is fixed at the handshake). */
static int listen_lo(int* port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) die("socket");
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  tune(fd);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, (struct sockaddr*)&a, sizeof(a))) die("bind");
  if (listen(fd, 4)) die("listen");
  socklen_t len = sizeof(a);
  if (getsockname(fd, (struct sockaddr*)&a, &len)) die("getsockname");
  *port = ntohs(a.sin_port);
  return fd;
}

static int connect_lo(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) die("socket");
  tune(fd);
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr*)&a, sizeof(a))) die("connect");
  return fd;
}

static int accept_lo(int lfd) {
  int fd = accept(lfd, NULL, NULL);
  if (fd < 0) die("accept");
  tune(fd);
  return fd;
}

static void write_all(int fd, const void* p, size_t n) {
  const char* c = p;
  while (n) {
    ssize_t k = write(fd, c, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) die("write");
    c += k;
    n -= (size_t)k;
  }
}

static void read_all(int fd, void* p, size_t n) {
  char* c = p;
  while (n) {
    ssize_t k = read(fd, c, n);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) die("read");
    c += k;
    n -= (size_t)k;
  }
}

struct sender {
  int fd;
  double t0, seconds;
  uint64_t sent;
};

/* Writes 1 MiB chunks from t0 for `seconds`, then ends the stream. */
static void* send_for(void* arg) {
  struct sender* s = arg;
  char* buf = malloc(CHUNK);
  if (!buf) die("malloc");
  memset(buf, 0x5a, CHUNK);
  do {
    write_all(s->fd, buf, CHUNK);
    s->sent += CHUNK;
  } while (now() - s->t0 < s->seconds);
  if (shutdown(s->fd, SHUT_WR)) die("shutdown");
  free(buf);
  return NULL;
}

struct received {
  uint64_t bytes;
  double seconds;  /* from the receiver's start to end-of-stream */
};

static struct received receive_all(int fd, double t0) {
  char* buf = malloc(CHUNK);
  if (!buf) die("malloc");
  memset(buf, 0, CHUNK);
  struct received r = {0, 0};
  for (;;) {
    ssize_t k = read(fd, buf, CHUNK);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) die("read");
    if (k == 0) break;
    r.bytes += (uint64_t)k;
  }
  r.seconds = now() - t0;
  free(buf);
  return r;
}

/* One process sends on `out` (a thread) while receiving on `in` (this thread). */
static struct received send_and_receive(int out, int in, double t0, double seconds) {
  struct sender s = {out, t0, seconds, 0};
  pthread_t th;
  if (pthread_create(&th, NULL, send_for, &s)) die("pthread_create");
  struct received r = receive_all(in, t0);
  pthread_join(th, NULL);
  return r;
}

static int reap(pid_t pid) {
  int status = 0;
  if (waitpid(pid, &status, 0) < 0) die("waitpid");
  if (!WIFEXITED(status) || WEXITSTATUS(status)) {
    fprintf(stderr, "limits: child failed\n");
    return 1;
  }
  return 0;
}

static int run_tcp_one(double seconds) {
  int port;
  int lfd = listen_lo(&port);
  pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid == 0) {  /* child: sender */
    close(lfd);
    int fd = connect_lo(port);
    char go;
    read_all(fd, &go, 1);
    struct sender s = {fd, now(), seconds, 0};
    send_for(&s);
    _exit(0);
  }
  int fd = accept_lo(lfd);
  close(lfd);
  report_buffers(fd, "tcp-one receiver");
  double t0 = now();
  write_all(fd, "g", 1);
  struct received r = receive_all(fd, t0);
  close(fd);
  if (reap(pid)) return 1;
  double gbs = r.bytes / r.seconds / 1e9;
  fprintf(stderr, "limits: tcp-one %.3f GB in %.3f s\n", r.bytes / 1e9, r.seconds);
  printf("tcp_one,%.4f\n", gbs);
  return 0;
}

/* Connections: `up` carries child -> parent, `down` parent -> child. The child
 * tags each connection with one byte so the parent cannot mix them up; the
 * parent's "go" byte on `down` starts both sides. */
static int run_tcp_bidir(double seconds) {
  int port;
  int lfd = listen_lo(&port);
  int pipefd[2];
  if (pipe(pipefd)) die("pipe");
  pid_t pid = fork();
  if (pid < 0) die("fork");
  if (pid == 0) {
    close(lfd);
    close(pipefd[0]);
    int up = connect_lo(port);
    write_all(up, "u", 1);
    int down = connect_lo(port);
    write_all(down, "d", 1);
    char go;
    read_all(down, &go, 1);
    struct received r = send_and_receive(up, down, now(), seconds);
    write_all(pipefd[1], &r, sizeof(r));
    _exit(0);
  }
  close(pipefd[1]);
  int a = accept_lo(lfd), b = accept_lo(lfd);
  close(lfd);
  char tag_a, tag_b;
  read_all(a, &tag_a, 1);
  read_all(b, &tag_b, 1);
  if (tag_a == tag_b) {
    fprintf(stderr, "limits: bad connection tags\n");
    return 1;
  }
  int up = tag_a == 'u' ? a : b, down = tag_a == 'u' ? b : a;
  report_buffers(up, "tcp-bidir");
  double t0 = now();
  write_all(down, "g", 1);
  struct received mine = send_and_receive(down, up, t0, seconds);  /* child -> parent */
  struct received theirs;                                          /* parent -> child */
  read_all(pipefd[0], &theirs, sizeof(theirs));
  close(a);
  close(b);
  if (reap(pid)) return 1;
  double up_gbs = mine.bytes / mine.seconds / 1e9;
  double down_gbs = theirs.bytes / theirs.seconds / 1e9;
  fprintf(stderr,
          "limits: tcp-bidir child->parent %.3f GB in %.3f s (%.3f GB/s), "
          "parent->child %.3f GB in %.3f s (%.3f GB/s)\n",
          mine.bytes / 1e9, mine.seconds, up_gbs, theirs.bytes / 1e9, theirs.seconds, down_gbs);
  printf("tcp_bidir_per_dir,%.4f\n", (up_gbs + down_gbs) / 2);
  printf("tcp_bidir_aggregate,%.4f\n", up_gbs + down_gbs);
  return 0;
}

int main(int argc, char** argv) {
  const char* mode = argc > 1 ? argv[1] : "";
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (!strcmp(mode, "memcpy")) {
    size_t mib = argc > 2 ? strtoull(argv[2], NULL, 10) : 256;
    int runs = argc > 3 ? atoi(argv[3]) : 7;
    if (mib < 1 || runs < 1) return 2;
    return run_memcpy(mib, runs);
  }
  if (!strcmp(mode, "tcp-one") || !strcmp(mode, "tcp-bidir")) {
    double seconds = argc > 2 ? atof(argv[2]) : 1.0;
    if (argc > 3) sockbuf = atoi(argv[3]);
    if (seconds <= 0) return 2;
    return mode[4] == 'o' ? run_tcp_one(seconds) : run_tcp_bidir(seconds);
  }
  fprintf(stderr,
          "usage: limits memcpy [MiB=256] [runs=7]\n"
          "       limits tcp-one [seconds=1] [sockbuf=4194304]\n"
          "       limits tcp-bidir [seconds=1] [sockbuf=4194304]\n");
  return 2;
}
