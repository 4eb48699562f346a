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
// Contract: all ranks call run() with equal shapes and configurations in the
// same order; every rank's output is bit-identical (the math after each
// all-reduce is deterministic). Not thread-safe; one state per gradient.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "core/status.h"

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

class PowerSgdState {
 public:
  // `key` names the gradient: it selects the random stream of the initial Q.
  PowerSgdState(size_t rows, size_t cols, const PowerSgdConfig& cfg, uint64_t key);

  // In-place float32 sum over all ranks.
  using AllReduceSum = std::function<Status(float* data, size_t count)>;
  // out = the rank-r estimate of the sum (average when `average`) of every
  // rank's `in`. in == out is allowed.
  Status run(const float* in, float* out, bool average, int nranks, const AllReduceSum& sum);

  size_t rows() const { return rows_; }
  size_t cols() const { return cols_; }
  // The error-feedback residual (rows x cols; empty without feedback). Applies the deferred
  // update first, so it costs a pass over the matrix once after each run().
  const std::vector<float>& residual();

 private:
  size_t rows_, cols_, r_;
  PowerSgdConfig cfg_;
  uint64_t key_;
  uint64_t step_ = 0;
  std::vector<float> p_, q_, err_;
  // The last call's factors (P^ and Q / n, Q in cpu::packPendingQ's layout) while its residual
  // update is pending.
  std::vector<float> pendingP_, pendingQb_;
  bool pending_ = false;
};

}  // namespace tutti::compress
