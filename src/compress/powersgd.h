// PowerSGD (Vogels et al., 2019): a rank-r approximation of the average of
// every rank's rows x cols gradient matrix M_i, found with one step of power
// iteration per call and two small all-reduces:
//   M'_i = M_i + E_i (error feedback)     P = sum_i M'_i Q      (all-reduce 1)
//   P^ = orthonormal columns of P         Q = sum_i M'_i^T P^  (all-reduce 2)
//   out = P^ Q^T / n (the average)        E_i = M'_i - out
// The residual update E_i = M'_i - out is deferred to the next call's first pass (or to
// residual()), which applies it bit for bit as if it had been done at once: a call then
// reads and writes E once instead of twice (a third less memory traffic).
// Q starts from a Gaussian matrix drawn from a seed every rank shares and,
// with warm start, is kept for the next call. When the average has rank <= r
// the first call returns it exactly (up to rounding). Each call sends
// (rows + cols) * r floats instead of rows * cols.
//
// Node-shared error feedback. P and Q depend on the ranks' M'_i only through
// their sum, so the residuals of the ranks of one node may as well be kept as
// one: E_node = sum over the node's ranks of E_i obeys the same recurrence
// (E_node = sum_i M_i + E_node - k out, for k ranks) and every output is the
// same up to rounding. A state built with a NodeShare keeps rows [r0, r1) of
// its node's residual: each call it sums those rows of every node member's
// input (read straight from their buffers, in chunks that stay in cache),
// adds its part of E_node, and computes P for those rows only (zero
// elsewhere before the sum) and Q's partial product from them. Per rank that
// turns 5 passes over the matrix into 2 + 3/k (read M, write the output; read
// and write E, read M' again only for its k-th share), and the residual's
// memory shrinks by k.
//
// Contract: all ranks call run() with equal shapes and configurations in the
// same order; every rank's output is bit-identical (the math after each
// all-reduce is deterministic). With a NodeShare, every member's input stays
// unchanged until the first sum completes (it does: no member gets past it
// before each has contributed). Not thread-safe; one state per gradient.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "base/status.h"

namespace tutti::compress {

struct PowerSgdConfig {
  int rank = 4;
  uint64_t seed = 0;
  float epsilon = 1e-8f;
  bool warmStart = true;
  bool feedback = true;
};

// Compression rate of a rank-r factorisation: rows*cols / ((rows+cols)*r).
double powerSgdRate(size_t rows, size_t cols, int rank);

// This rank's place among the `count` ranks of its node that share one residual
// (needs error feedback). `on` must be the same on every rank (it adds to what the
// sums carry): a rank alone on its node takes part with count 1.
struct NodeShare {
  int index = 0;
  int count = 1;
  bool on = false;
};

// The rows [first, second) of a rows-row matrix that member `index` of `count` keeps.
inline std::pair<size_t, size_t> shareRows(size_t rows, int index, int count) {
  return {rows * static_cast<size_t>(index) / static_cast<size_t>(count),
          rows * static_cast<size_t>(index + 1) / static_cast<size_t>(count)};
}

class PowerSgdState {
 public:
  // `key` names the gradient: it selects the random stream of the initial Q.
  PowerSgdState(size_t rows, size_t cols, const PowerSgdConfig& cfg, uint64_t key,
                NodeShare share = {});

  // In-place float32 sum over all ranks.
  using AllReduceSum = std::function<Status(float* data, size_t count)>;
  // Copies `bytes` from byte `offset` of node member `member`'s input (this call's `in` of the
  // rank at that index of the NodeShare) to `dst`.
  using ReadInput = std::function<Status(int member, size_t offset, void* dst, size_t bytes)>;
  // out = the rank-r estimate of the sum (average when `average`) of every
  // rank's `in`. in == out is allowed. `read` is used only with a NodeShare of
  // more than one rank. A failed read fails the call on every rank (the sums
  // still run, so nobody waits for this one). A failed call clears the residual
  // (every rank's, when the failure is a read) and keeps Q.
  Status run(const float* in, float* out, bool average, int nranks, const AllReduceSum& sum,
             const ReadInput& read = nullptr);

  size_t rows() const { return rows_; }
  size_t cols() const { return cols_; }
  // Whether residuals are kept per node (NodeShare::on); rows [r0, r1) of the node's are this
  // rank's.
  bool shared() const { return share_.on; }
  size_t shareBegin() const { return r0_; }
  size_t shareEnd() const { return r1_; }
  // The error-feedback residual (rows x cols; empty without feedback): with a
  // NodeShare, this rank's share of its node's residual (zero outside rows
  // [r0, r1)), so the node's residual is the sum over its ranks as without.
  // Applies the deferred update first, so it costs a pass over the matrix once
  // after each run().
  const std::vector<float>& residual();

 private:
  Status runOwn(const float* in, float* out, bool average, int nranks, const AllReduceSum& sum);
  Status runShared(const float* in, float* out, bool average, int nranks, const AllReduceSum& sum,
                   const ReadInput& read);
  void finish(float* out, bool average, int nranks);

  size_t rows_, cols_, r_;
  PowerSgdConfig cfg_;
  NodeShare share_;
  size_t r0_, r1_;  // this rank's rows of the residual (all of them without sharing)
  uint64_t key_;
  uint64_t step_ = 0;
  std::vector<float> p_, q_, err_;
  std::vector<float> chunk_, peerChunk_;  // node sums of a few rows (shared feedback)
  std::vector<float> fullResidual_;       // residual() with a NodeShare
  // The last call's factors (P^ and Q / n, times k with a NodeShare of k; Q in
  // cpu::packPendingQ's layout) while its residual update is pending.
  std::vector<float> pendingP_, pendingQb_;
  bool pending_ = false;
};

}  // namespace tutti::compress
