#include "core/init.h"

#include <cstddef>

#include "base/log.h"
#include "base/thread.h"

namespace tutti::core {

Result<CommConfig> commConfig(const ncclConfig_t* config) {
  CommConfig out;
  if (!config) return out;
  if (config->magic != 0xcafebeef || config->size < offsetof(ncclConfig_t, cgaClusterSize))
    return invalidArgument("config was not initialised with NCCL_CONFIG_INITIALIZER");
  if (config->blocking != NCCL_CONFIG_UNDEF_INT) {
    if (config->blocking != 0 && config->blocking != 1)
      return invalidArgument(fmt::format("config blocking={} (must be 0 or 1)", config->blocking));
    out.blocking = config->blocking == 1;
  }
  if (config->commName) out.name = config->commName;
  if (config->minCTAs != NCCL_CONFIG_UNDEF_INT) out.minChannels = config->minCTAs;
  if (config->maxCTAs != NCCL_CONFIG_UNDEF_INT) out.maxChannels = config->maxCTAs;
  return out;
}

void CommInit::finish(Status st) {
  if (!st) {
    status_ =
        st.withContext(args_.nranks > 0 ? fmt::format("rank {} of {}", args_.rank, args_.nranks)
                                        : std::string("ncclCommSplit's exchange"));
    TUTTI_WARN("communicator initialisation: {}", status_.message());
  }
  // Publishes comm_ and status_ to whoever reads the state.
  state_.store(static_cast<int>(st.code()), std::memory_order_release);
}

void CommInit::run() {
  log::setThreadRank(args_.rank);
  auto res = Comm::create(args_.id, args_.rank, args_.nranks, args_.config, args_.backend,
                          args_.device, &abort_);
  if (!res) return finish(res.status());
  comm_ = std::move(res.value());
  finish(Status::ok());
}

void CommInit::start() {
  auto t = base::startThread(
      "init", fmt::format("init thread of rank {}", args_.rank),
      [this] {
        run();
        return Status::ok();
      },
      [this](Status st) {
        if (!st) finish(st);  // what run() threw (it records its own errors otherwise)
      });
  if (!t) return finish(t.status());
  std::lock_guard<std::mutex> lk(threadMu_);
  thread_ = std::move(t.value());
}

void CommInit::startSplit(Comm& parent, int color, int key) {
  argsKnown_.store(false, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lk(threadMu_);
    exchanging_ = true;
  }
  // Runs on the parent's engine thread (or where the parent drops the job).
  auto then = [this](Result<Comm::SplitPlan> plan) {
    auto id = plan ? parseUniqueId(plan->id) : Result<UniqueIdData>(plan.status());
    if (id) {
      args_.id = id.value();
      args_.rank = plan->rank;
      args_.nranks = plan->nranks;
      argsKnown_.store(true, std::memory_order_release);
      start();
    } else {
      finish(id.status());
    }
    std::lock_guard<std::mutex> lk(threadMu_);
    exchanging_ = false;
    exchanged_.notify_all();
  };
  parent.splitQueued(color, key, then);
}

void CommInit::runAll(const std::vector<CommInit*>& inits) {
  if (inits.size() == 1) return inits[0]->run();
  for (CommInit* i : inits) i->start();
  for (CommInit* i : inits) i->wait();
}

void CommInit::wait() {
  std::unique_lock<std::mutex> lk(threadMu_);
  exchanged_.wait(lk, [this] { return !exchanging_; });
  if (thread_.joinable()) thread_.join();
}

}  // namespace tutti::core
