#include "core/init.h"

#include "base/log.h"
#include "base/thread.h"

namespace tutti::core {

void CommInit::finish(Status st) {
  if (!st) {
    status_ = st.withContext(fmt::format("rank {} of {}", args_.rank, args_.nranks));
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

void CommInit::runAll(const std::vector<CommInit*>& inits) {
  if (inits.size() == 1) return inits[0]->run();
  for (CommInit* i : inits) i->start();
  for (CommInit* i : inits) i->wait();
}

void CommInit::wait() {
  std::lock_guard<std::mutex> lk(threadMu_);
  if (thread_.joinable()) thread_.join();
}

}  // namespace tutti::core
