#include "compress/powersgd.h"

#include <fmt/format.h>

#include <algorithm>

#include "backends/cpu/dense_kernels.h"
#include "backends/cpu/kernels.h"

namespace tutti::compress {

double powerSgdRate(size_t rows, size_t cols, int rank) {
  if (rank < 1 || rows == 0 || cols == 0) return 0;
  return static_cast<double>(rows) * cols / ((static_cast<double>(rows) + cols) * rank);
}

namespace {

// Rows of the node sum formed at a time: about kChunkBytes, small enough to stay in L2 while
// the projection reads them, and a multiple of kChunkRows, the block the vector projection
// works on (fewer rows take its scalar code: 4-row chunks of 4096 columns made a call 3x slower).
constexpr size_t kChunkBytes = 256 << 10;
constexpr size_t kChunkRows = 16;

}  // namespace

PowerSgdState::PowerSgdState(size_t rows, size_t cols, const PowerSgdConfig& cfg, uint64_t key,
                             NodeShare share)
    : rows_(rows),
      cols_(cols),
      r_(static_cast<size_t>(cfg.rank)),
      cfg_(cfg),
      share_(cfg.feedback && share.on ? share : NodeShare{}),
      r0_(shareRows(rows, share_.index, share_.count).first),
      r1_(shareRows(rows, share_.index, share_.count).second),
      key_(key),
      p_(rows * r_),
      q_(cols * r_) {
  if (cfg_.feedback) err_.assign((r1_ - r0_) * cols, 0.0f);
}

Status PowerSgdState::run(const float* in, float* out, bool average, int nranks,
                          const AllReduceSum& sum, const ReadInput& read) {
  // Without warm start every call draws a fresh Q (its own stream per step).
  if (step_ == 0 || !cfg_.warmStart)
    cpu::fillGaussian(q_.data(), q_.size(), cfg_.seed, key_ * 0x9E3779B97F4A7C15ull + step_);
  ++step_;
  Status st = share_.on ? runShared(in, out, average, nranks, sum, read)
                        : runOwn(in, out, average, nranks, sum);
  if (!st) {
    // The residual may hold M' (or part of it on some ranks): every rank starts it over.
    std::fill(err_.begin(), err_.end(), 0.0f);
    pending_ = false;
  }
  return st;
}

Status PowerSgdState::runOwn(const float* in, float* out, bool average, int nranks,
                             const AllReduceSum& sum) {
  float* e = cfg_.feedback ? err_.data() : nullptr;
  // e <- M' = M + (e - the last call's approximation, if still pending);  P = M' Q.
  const cpu::PendingApprox pending{pendingP_.data(), pendingQb_.data(), r_};
  cpu::powerProject(in, e, rows_, cols_, q_.data(), r_, p_.data(), pending_ ? &pending : nullptr);
  pending_ = false;
  TUTTI_RETURN_IF_ERROR(sum(p_.data(), p_.size()));
  cpu::orthonormalizeColumns(p_.data(), rows_, r_, cfg_.epsilon);
  const float* mp = e ? e : in;
  cpu::powerBack(mp, rows_, cols_, p_.data(), r_, q_.data());
  TUTTI_RETURN_IF_ERROR(sum(q_.data(), q_.size()));
  finish(out, average, nranks);
  return Status::ok();
}

Status PowerSgdState::runShared(const float* in, float* out, bool average, int nranks,
                                const AllReduceSum& sum, const ReadInput& read) {
  // P has this rank's rows of (node sum of M + E_node) Q and zeros elsewhere;
  // one more float says whether every read succeeded, so a failure fails the
  // call everywhere after the same sums instead of leaving peers waiting.
  std::fill(p_.begin(), p_.end(), 0.0f);
  p_.push_back(0.0f);
  Status readSt;
  const size_t rowBytes = cols_ * sizeof(float);
  const size_t step = std::max(kChunkRows, kChunkBytes / rowBytes / kChunkRows * kChunkRows);
  if (share_.count > 1) chunk_.resize(std::min(step, r1_ - r0_) * cols_);
  if (share_.count > 2) peerChunk_.resize(chunk_.size());
  if (share_.count == 1) {
    // Alone on its node: its own input is the node's sum.
    const cpu::PendingApprox pending{pendingP_.data(), pendingQb_.data(), r_};
    cpu::powerProject(in, err_.data(), rows_, cols_, q_.data(), r_, p_.data(),
                      pending_ ? &pending : nullptr);
  }
  for (size_t i = r0_; i < r1_ && readSt && share_.count > 1; i += step) {
    const size_t n = std::min(step, r1_ - i);
    const size_t bytes = n * rowBytes;
    float* sumRows = chunk_.data();
    // The node's sum of these rows: the other members' in member order, then this rank's own
    // (one rounding per add; only this rank computes these rows, so no other order matters).
    bool first = true;
    for (int m = 0; m < share_.count && readSt; ++m) {
      if (m == share_.index) continue;
      float* dst = first ? sumRows : peerChunk_.data();
      readSt = read ? read(m, i * rowBytes, dst, bytes)
                    : internalError("no reader for the node members' inputs");
      if (readSt && !first)
        cpu::reduce(sumRows, sumRows, dst, n * cols_, DataType::kFloat32, RedOp::kSum);
      first = false;
    }
    if (!readSt) break;
    cpu::reduce(sumRows, sumRows, in + i * cols_, n * cols_, DataType::kFloat32, RedOp::kSum);
    const cpu::PendingApprox pending{pendingP_.data() + i * r_, pendingQb_.data(), r_};
    cpu::powerProject(sumRows, err_.data() + (i - r0_) * cols_, n, cols_, q_.data(), r_,
                      p_.data() + i * r_, pending_ ? &pending : nullptr);
  }
  if (!readSt) {
    // Send no rows of P (run() clears the residual).
    std::fill(p_.begin(), p_.end(), 0.0f);
    p_.back() = 1.0f;
  }
  pending_ = false;
  Status st = sum(p_.data(), p_.size());
  const float failures = p_.back();
  p_.pop_back();
  TUTTI_RETURN_IF_ERROR(st);
  if (!readSt) return readSt.withContext("PowerSGD, reading a node member's input");
  if (failures != 0.0f)
    return remoteError(fmt::format(
        "PowerSGD: {} rank(s) could not read their node members' inputs (see their errors)",
        static_cast<int>(failures)));
  cpu::orthonormalizeColumns(p_.data(), rows_, r_, cfg_.epsilon);
  if (r1_ > r0_)
    cpu::powerBack(err_.data(), r1_ - r0_, cols_, p_.data() + r0_ * r_, r_, q_.data());
  else
    std::fill(q_.begin(), q_.end(), 0.0f);
  TUTTI_RETURN_IF_ERROR(sum(q_.data(), q_.size()));
  finish(out, average, nranks);
  return Status::ok();
}

// Q / n, the output, and the residual update left pending.
void PowerSgdState::finish(float* out, bool average, int nranks) {
  // Q / n: the approximation of the average, from which each rank's residual
  // is what it contributed beyond it.
  if (nranks > 1) cpu::scale(q_.data(), q_.data(), q_.size(), DataType::kFloat32, 1.0 / nranks);
  // A sum is n times the average, scaled in the same pass.
  const float outScale = average ? 1.0f : static_cast<float>(nranks);
  // out only; e keeps M' until the next call (or residual()) subtracts this approximation.
  cpu::powerApprox(p_.data(), q_.data(), rows_, cols_, r_, out, nullptr, outScale);
  if (cfg_.feedback) {
    pendingP_ = p_;
    pendingQb_.resize(cpu::pendingQFloats(cols_, r_));
    cpu::packPendingQ(q_.data(), cols_, r_, pendingQb_.data());
    // A node's residual lost k times the approximation of the average (one per member).
    if (share_.count > 1)
      cpu::scale(pendingQb_.data(), pendingQb_.data(), pendingQb_.size(), DataType::kFloat32,
                 share_.count);
    pending_ = true;
  }
}

const std::vector<float>& PowerSgdState::residual() {
  if (pending_) {
    cpu::applyPending(err_.data(), r1_ - r0_, cols_,
                      {pendingP_.data() + r0_ * r_, pendingQb_.data(), r_});
    pending_ = false;
  }
  if (share_.count == 1 || err_.empty()) return err_;
  fullResidual_.assign(rows_ * cols_, 0.0f);
  std::copy(err_.begin(), err_.end(), fullResidual_.begin() + r0_ * cols_);
  return fullResidual_;
}

}  // namespace tutti::compress
