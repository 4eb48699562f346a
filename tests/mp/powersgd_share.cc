// PowerSGD's node-shared residual (compress/powersgd.h) across real processes:
// node members read each other's inputs with cross-memory attach.
//   powersgd_share <nranks> <rows> <cols>   exit 0 when every rank passed.
// Run with TUTTI_TEST_NODES to split the ranks into nodes. Every rank runs the
// same steps twice, with residuals shared per node and kept per rank
// (TUTTI_POWERSGD_NODE_FEEDBACK), and checks:
// - the outputs of every rank are bit-identical (hashes all-gathered), in both modes;
// - the two modes give the same outputs up to rounding;
// - a first call whose average has rank <= r recovers it;
// - sharing took place: it sends the n input addresses per call on top;
// - node members in other processes read each other's inputs through shared
//   memory (the log says so), with outputs bit-identical to reading them with
//   cross-memory attach (TUTTI_POWERSGD_STAGING=0), also after a larger matrix
//   made every rank grow its stage.
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "nccl.h"
#include "tutti/tutti.h"

namespace {

float unitValue(uint64_t a, uint64_t i) {
  uint64_t h = (a << 40) ^ i;
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return static_cast<float>(static_cast<double>(h >> 11) / 9007199254740992.0 * 2.0 - 1.0);
}

uint64_t hashFloats(const std::vector<float>& v) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (float f : v) {
    uint32_t w;
    memcpy(&w, &f, 4);
    h = (h ^ w) * 0x100000001B3ull;
  }
  return h;
}

struct Mode {
  std::vector<std::vector<float>> outs;  // per step
  uint64_t wireBytes = 0;
};

int runRank(int n, int r, const ncclUniqueId& id, size_t rows, size_t cols) {
  auto fail = [&](const std::string& what) {
    fprintf(stderr, "rank %d: %s\n", r, what.c_str());
    return 1;
  };
  // This rank's log, to see which path its reads took.
  const std::string logPath = "/tmp/tutti_psgd_share_" + std::to_string(getpid()) + ".log";
  setenv("NCCL_DEBUG", "INFO", 1);
  setenv("NCCL_DEBUG_SUBSYS", "COLL", 1);
  setenv("NCCL_DEBUG_FILE", logPath.c_str(), 1);
  auto logSays = [&](const char* what) {
    FILE* f = fopen(logPath.c_str(), "r");
    if (!f) return false;
    std::string text;
    char buf[4096];
    size_t got;
    while ((got = fread(buf, 1, sizeof(buf), f)) > 0) text.append(buf, got);
    fclose(f);
    return text.find(what) != std::string::npos;
  };
  ncclComm_t comm;
  if (ncclCommInitRank(&comm, n, id, r) != ncclSuccess) return fail("init failed");
  const size_t count = rows * cols;
  const int steps = 4;
  // Gathers one hash per rank and checks they agree.
  auto identical = [&](uint64_t h) {
    std::vector<uint64_t> all(n);
    if (ncclAllGather(&h, all.data(), 1, ncclUint64, comm, nullptr) != ncclSuccess) return false;
    return std::all_of(all.begin(), all.end(), [&](uint64_t x) { return x == all[0]; });
  };
  auto runMode = [&](bool shared, bool staged, Mode* m) -> int {
    setenv("TUTTI_POWERSGD_NODE_FEEDBACK", shared ? "1" : "0", 1);
    setenv("TUTTI_POWERSGD_STAGING", staged ? "1" : "0", 1);
    tuttiCompressionConfig_t cfg = TUTTI_COMPRESSION_CONFIG_INITIALIZER;
    cfg.kind = tuttiCompressPowerSGD;
    cfg.powerSgdRank = 4;
    cfg.seed = 11;
    tuttiCompressor_t c = nullptr;
    if (tuttiCompressorCreate(comm, &cfg, &c) != ncclSuccess) return fail("compressor");
    std::vector<float> in(count + 1), out(count + 1);
    for (int t = 0; t < steps; ++t) {
      for (size_t i = 0; i < count; ++i) in[i + 1] = unitValue(r * 16 + t, i);
      float* dst = t % 2 ? in.data() + 1 : out.data() + 1;  // in place on odd steps, unaligned
      if (tuttiAllReduceCompressed(in.data() + 1, dst, count, ncclFloat32, ncclAvg, c, 1, rows,
                                   cols, nullptr) != ncclSuccess)
        return fail(std::string("step failed: ") + ncclGetLastError(comm));
      m->outs.emplace_back(dst, dst + count);
      if (!identical(hashFloats(m->outs.back())))
        return fail("outputs differ across ranks at step " + std::to_string(t) +
                    (shared ? " (shared)" : " (per rank)"));
    }
    // A larger matrix (another key): stages grow; then the first one again.
    const size_t bigRows = rows + 37, bigCount = bigRows * cols;
    std::vector<float> big(bigCount), bigOut(bigCount);
    for (int t = 0; t < 2; ++t) {
      for (size_t i = 0; i < bigCount; ++i) big[i] = unitValue(r * 16 + 8 + t, i);
      if (tuttiAllReduceCompressed(big.data(), bigOut.data(), bigCount, ncclFloat32, ncclAvg, c, 3,
                                   bigRows, cols, nullptr) != ncclSuccess)
        return fail(std::string("larger matrix failed: ") + ncclGetLastError(comm));
      m->outs.push_back(bigOut);
      for (size_t i = 0; i < count; ++i) in[i + 1] = unitValue(r * 16 + 12 + t, i);
      if (tuttiAllReduceCompressed(in.data() + 1, out.data() + 1, count, ncclFloat32, ncclAvg, c,
                                   1, rows, cols, nullptr) != ncclSuccess)
        return fail(std::string("step after the larger matrix failed: ") + ncclGetLastError(comm));
      m->outs.emplace_back(out.data() + 1, out.data() + 1 + count);
    }
    tuttiCompressionStats_t st;
    st.size = sizeof(st);
    if (tuttiCompressorGetStats(c, &st) != ncclSuccess) return fail("stats");
    m->wireBytes = st.wireBytesSent;
    // A first call on an average of rank 2 (M_r = U V_r^T) recovers it.
    std::vector<float> low(count), lowOut(count);
    double err = 0, norm = 0;
    for (size_t i = 0; i < rows; ++i)
      for (size_t j = 0; j < cols; ++j) {
        double mine = 0, avg = 0;
        for (int q = 0; q < n; ++q) {
          double v = 0;
          for (int k = 0; k < 2; ++k) v += unitValue(900 + k, i) * unitValue(1000 + q * 4 + k, j);
          avg += v / n;
          if (q == r) mine = v;
        }
        low[i * cols + j] = static_cast<float>(mine);
        lowOut[i * cols + j] = static_cast<float>(avg);  // the expected value, for now
      }
    std::vector<float> expect = lowOut;
    if (tuttiAllReduceCompressed(low.data(), lowOut.data(), count, ncclFloat32, ncclAvg, c, 2, rows,
                                 cols, nullptr) != ncclSuccess)
      return fail(std::string("low-rank call failed: ") + ncclGetLastError(comm));
    for (size_t i = 0; i < count; ++i) {
      err += std::pow(lowOut[i] - expect[i], 2);
      norm += std::pow(expect[i], 2);
    }
    if (std::sqrt(err / norm) > 2e-5)
      return fail("low-rank average not recovered: relative error " +
                  std::to_string(std::sqrt(err / norm)));
    tuttiCompressorDestroy(c);
    return 0;
  };
  Mode shared, cma, own;
  if (int rc = runMode(true, true, &shared)) return rc;
  if (!logSays("read each other's inputs through shared memory"))
    return fail("node members did not read each other's inputs through shared memory");
  if (int rc = runMode(true, false, &cma)) return rc;
  if (!logSays("cross-memory attach (TUTTI_POWERSGD_STAGING=0)"))
    return fail("TUTTI_POWERSGD_STAGING=0 did not switch to cross-memory attach");
  if (int rc = runMode(false, true, &own)) return rc;
  unlink(logPath.c_str());
  if (shared.outs.size() != cma.outs.size()) return fail("the two shared runs differ in length");
  for (size_t t = 0; t < shared.outs.size(); ++t)
    if (hashFloats(shared.outs[t]) != hashFloats(cma.outs[t]))
      return fail("staged and cross-memory reads give different outputs at call " +
                  std::to_string(t));
  double worst = 0, norm = 1;
  for (int t = 0; t < steps; ++t)
    for (size_t i = 0; i < count; ++i) {
      worst = std::max<double>(worst, std::fabs(shared.outs[t][i] - own.outs[t][i]));
      norm = std::max<double>(norm, std::fabs(own.outs[t][i]));
    }
  // Rounding only (the node sums its inputs before projecting); measured 1e-6 in-process.
  if (worst > 1e-5 * norm)
    return fail("shared and per-rank outputs differ by " + std::to_string(worst));
  if (shared.wireBytes <= own.wireBytes)
    return fail("sharing did not take place (" + std::to_string(shared.wireBytes) +
                " bytes sent, " + std::to_string(own.wireBytes) + " per rank)");
  printf("rank %d: ok, |shared - per rank| <= %.3g, bytes sent %llu shared, %llu per rank\n", r,
         worst, static_cast<unsigned long long>(shared.wireBytes),
         static_cast<unsigned long long>(own.wireBytes));
  ncclCommDestroy(comm);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? atoi(argv[1]) : 5;
  const size_t rows = argc > 2 ? strtoull(argv[2], nullptr, 10) : 301;
  const size_t cols = argc > 3 ? strtoull(argv[3], nullptr, 10) : 203;
  setenv("TUTTI_POWERSGD_SHARE_MIN_BYTES", "0", 1);
  setenv("TUTTI_TIMEOUT", "60", 0);
  std::vector<pid_t> pids;
  std::vector<int> idPipes;
  // Fork before touching tutti (its unique id starts a thread).
  for (int r = 0; r < n; ++r) {
    int idp[2];
    if (pipe(idp) != 0) return 2;
    pid_t pid = fork();
    if (pid == 0) {
      close(idp[1]);
      ncclUniqueId id;
      if (read(idp[0], &id, sizeof(id)) != static_cast<ssize_t>(sizeof(id))) _exit(3);
      const int rc = runRank(n, r, id, rows, cols);
      fflush(stdout);
      _exit(rc);
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
  int failures = 0;
  for (int r = 0; r < n; ++r) {
    int status = 0;
    waitpid(pids[r], &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "rank %d: exit status %d\n", r, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
      failures++;
    }
  }
  printf("%s\n", failures ? "FAILED" : "OK");
  return failures ? 1 : 0;
}
