#include "compress/powersgd.h"

#include "backends/cpu/dense_kernels.h"
#include "backends/cpu/kernels.h"

namespace tutti::compress {

double powerSgdRate(size_t rows, size_t cols, int rank) {
  if (rank < 1 || rows == 0 || cols == 0) return 0;
  return static_cast<double>(rows) * cols / ((static_cast<double>(rows) + cols) * rank);
}

PowerSgdState::PowerSgdState(size_t rows, size_t cols, const PowerSgdConfig& cfg, uint64_t key)
    : rows_(rows),
      cols_(cols),
      r_(static_cast<size_t>(cfg.rank)),
      cfg_(cfg),
      key_(key),
      p_(rows * r_),
      q_(cols * r_) {
  if (cfg_.feedback) err_.assign(rows * cols, 0.0f);
}

Status PowerSgdState::run(const float* in, float* out, bool average, int nranks,
                          const AllReduceSum& sum) {
  // Without warm start every call draws a fresh Q (its own stream per step).
  if (step_ == 0 || !cfg_.warmStart)
    cpu::fillGaussian(q_.data(), q_.size(), cfg_.seed, key_ * 0x9E3779B97F4A7C15ull + step_);
  ++step_;
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
  // Q / n: the approximation of the average, from which each rank's residual
  // is what it contributed beyond it.
  if (nranks > 1)
    cpu::scale(q_.data(), q_.data(), q_.size(), DataType::kFloat32, 1.0 / nranks);
  // A sum is n times the average, scaled in the same pass.
  const float outScale = average ? 1.0f : static_cast<float>(nranks);
  // out only; e keeps M' until the next call (or residual()) subtracts this approximation.
  cpu::powerApprox(p_.data(), q_.data(), rows_, cols_, r_, out, nullptr, outScale);
  if (e != nullptr) {
    pendingP_ = p_;
    pendingQb_.resize(cpu::pendingQFloats(cols_, r_));
    cpu::packPendingQ(q_.data(), cols_, r_, pendingQb_.data());
    pending_ = true;
  }
  return Status::ok();
}

const std::vector<float>& PowerSgdState::residual() {
  if (pending_) {
    cpu::applyPending(err_.data(), rows_, cols_, {pendingP_.data(), pendingQb_.data(), r_});
    pending_ = false;
  }
  return err_;
}

}  // namespace tutti::compress
