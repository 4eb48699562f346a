#include "core/engine.h"

#include <new>

#include "base/backoff.h"
#include "base/log.h"
#include "base/thread.h"
#include "core/comm.h"
#include "topology/topology.h"

namespace tutti::core {

// Shared by a task and the host functions queued for it: one may run after
// the task has ended (an abort does not wait for the streams), so each holds
// a reference of its own.
struct Engine::Arrival {
  std::mutex mu;
  std::condition_variable cv;
  int left = 0;  // host functions still to run; guarded by mu

  // The host function: arg is a heap reference to the Arrival, released here.
  static void reached(void* arg) noexcept {
    auto* ref = static_cast<std::shared_ptr<Arrival>*>(arg);
    std::shared_ptr<Arrival> a = std::move(*ref);
    delete ref;
    {
      std::lock_guard<std::mutex> lk(a->mu);
      --a->left;
    }
    a->cv.notify_all();
  }
};

Engine::Engine(Comm* comm) : comm_(comm), be_(comm->backend()) {}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
    wake_.notify_one();
  }
  if (thread_.joinable()) thread_.join();
}

Status Engine::submit(const std::vector<Queue>& streams, Job job, bool hold) {
  Task t;
  t.job = std::move(job);
  // Undoes what is set up so far: the streams already held are released.
  auto undo = [&](Status st) {
    finish(t);
    return st;
  };
  const int device = comm_->device();
  bool announced = be_.hasHostFuncs();  // every stream has its host function
  for (Queue s : streams) {
    auto ready = be_.eventCreate(device);
    if (!ready) return undo(ready.status());
    t.ready.push_back(ready.value());
    if (Status st = be_.eventRecord(ready.value(), s); !st) return undo(st);
    if (announced) announced = announceArrival(t, s);
    if (!hold) continue;
    auto release = be_.hostEventCreate(device);
    if (!release) return undo(release.status());
    t.release.push_back(release.value());
    if (Status st = be_.eventWait(s, release.value()); !st) return undo(st);
  }
  if (!announced) t.arrival.reset();  // polled (queued host functions hold their own reference)
  std::unique_lock<std::mutex> lk(mu_);
  if (!dead_.isOk()) {
    lk.unlock();
    return undo(dead_);
  }
  if (!thread_.joinable()) {
    auto started = base::startThread(
        "engine", "communicator engine thread",
        [this] {
          run();
          return Status::ok();
        },
        [this](Status st) {
          if (!st) abandon(st);
        });
    if (!started) {
      lk.unlock();
      return undo(started.status());
    }
    thread_ = std::move(started.value());
  }
  tasks_.push_back(std::move(t));
  ++submitted_;
  wake_.notify_one();
  return Status::ok();
}

void Engine::abandon(const Status& why) {
  comm_->setError(why);
  std::deque<Task> left;
  {
    std::lock_guard<std::mutex> lk(mu_);
    dead_ = why;
    left.swap(tasks_);
  }
  for (Task& t : left) finish(t);  // their streams are released
  std::lock_guard<std::mutex> lk(mu_);
  finished_ = submitted_;
  done_.notify_all();
}

void Engine::drain() {
  std::unique_lock<std::mutex> lk(mu_);
  done_.wait(lk, [&] { return finished_ == submitted_; });
}

bool Engine::idle() const {
  std::lock_guard<std::mutex> lk(mu_);
  return finished_ == submitted_;
}

uint64_t Engine::jobsRun() const {
  std::lock_guard<std::mutex> lk(mu_);
  return finished_;
}

Status Engine::start() {
  // Near the device when the topology knows where it is, else, on host
  // memory over TCP, near the NIC (else the mask inherited from the thread
  // that submitted first); never fatal.
  const int near = comm_->deviceNuma() >= 0 ? comm_->deviceNuma() : comm_->nicNuma();
  if (near >= 0) {
    Status bound = topo::bindThisThreadNear(comm_->topology(), near);
    if (!bound)
      TUTTI_WARN("engine thread: cannot bind near NUMA node {} (left as it is): {}", near,
                 bound.message());
  }
  // The thread works on the communicator's device, on a queue of its own.
  TUTTI_RETURN_IF_ERROR(be_.setDevice(comm_->device()).withContext("engine thread"));
  auto q = be_.queueCreate(comm_->device());
  if (!q) return q.status().withContext("the engine's queue");
  queue_ = q.value();
  return Status::ok();
}

bool Engine::announceArrival(Task& t, Queue s) {
  if (!t.arrival) t.arrival = std::make_shared<Arrival>();
  auto* ref = new std::shared_ptr<Arrival>(t.arrival);
  {
    std::lock_guard<std::mutex> lk(t.arrival->mu);
    ++t.arrival->left;  // before the launch: a synchronous queue runs it inside
  }
  Status st = be_.launchHostFunc(s, &Arrival::reached, ref);
  if (st) return true;
  {
    std::lock_guard<std::mutex> lk(t.arrival->mu);
    --t.arrival->left;
  }
  delete ref;
  if (!hostFuncRefused_.exchange(true))
    TUTTI_INFO(log::kInit,
               "engine: the backend queues no host function here, so waits for a stream poll: {}",
               st.message());
  return false;
}

void Engine::interrupt() {
  std::shared_ptr<Arrival> a;
  {
    std::lock_guard<std::mutex> lk(mu_);
    a = waiting_;
  }
  if (!a) return;  // not asleep: the thread reads the flag before it sleeps
  {
    // The thread is asleep or reads the flag (set before this call) under
    // this lock before it sleeps: the notification cannot fall between.
    std::lock_guard<std::mutex> lk(a->mu);
  }
  a->cv.notify_all();
}

Status Engine::waitReady(const Task& t) {
  if (t.ready.empty()) return Status::ok();
  return t.arrival ? sleepUntilArrived(t) : pollUntilReady(t);
}

static Status abortedWhileWaiting() {
  return invalidUsage("communicator aborted while an operation waited for its stream");
}

Status Engine::sleepUntilArrived(const Task& t) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    waiting_ = t.arrival;
  }
  struct Awake {
    Engine* e;
    ~Awake() {
      std::lock_guard<std::mutex> lk(e->mu_);
      e->waiting_.reset();
    }
  } awake{this};
  Arrival& a = *t.arrival;
  std::unique_lock<std::mutex> lk(a.mu);
  for (;;) {
    if (a.left == 0) return Status::ok();
    if (comm_->aborted()) return abortedWhileWaiting();
    if (a.cv.wait_for(lk, kRecheck) == std::cv_status::no_timeout) continue;
    // Now and then the events themselves: they report a device that failed
    // (and may have dropped a host function).
    lk.unlock();
    bool all = true;
    for (Event e : t.ready) {
      auto done = be_.eventDone(e);
      if (!done) return done.status().withContext("waiting for the work queued before the call");
      if (!done.value()) {
        all = false;
        break;
      }
    }
    if (all) return Status::ok();
    lk.lock();
  }
}

Status Engine::pollUntilReady(const Task& t) {
  base::Backoff backoff(comm_->oversubscribed());
  for (Event e : t.ready) {
    for (;;) {
      auto done = be_.eventDone(e);
      if (!done) return done.status().withContext("waiting for the work queued before the call");
      if (done.value()) break;
      if (comm_->aborted()) return abortedWhileWaiting();
      backoff.idle();
    }
    backoff.progress();
  }
  return Status::ok();
}

void Engine::finish(Task& t) {
  for (Event e : t.release) {
    Status st = be_.hostEventSignal(e);
    if (!st) TUTTI_WARN("releasing a stream after a collective: {}", st.message());
    (void)be_.eventDestroy(e);
  }
  for (Event e : t.ready) (void)be_.eventDestroy(e);
  t.release.clear();
  t.ready.clear();
}

void Engine::run() {
  log::setThreadRank(comm_->rank());
  Status started;
  try {
    started = start();
  } catch (const std::exception& e) {
    started = internalError(std::string("engine thread start: ") + e.what());
  }
  for (;;) {
    Task t;
    {
      std::unique_lock<std::mutex> lk(mu_);
      wake_.wait(lk, [&] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) break;  // stopping, nothing left
      t = std::move(tasks_.front());
      tasks_.pop_front();
    }
    Status st = started;
    bool ran = false;  // else it failed fast: the communicator was broken already
    try {
      if (st) st = comm_->usable();
      ran = st.isOk();
      if (st) st = waitReady(t);
      if (st) st = t.job(queue_);
    } catch (const std::bad_alloc&) {
      st = systemError("out of host memory in the communicator's engine");
    } catch (const std::exception& e) {
      st = internalError(std::string("communicator engine: ") + e.what());
    } catch (...) {
      st = internalError("communicator engine: unknown exception");
    }
    if (!st) {
      // Its call has returned: the log is where the error is seen first.
      if (ran) TUTTI_WARN("an operation queued on the communicator failed: {}", st.message());
      comm_->setError(st);  // the first error sticks; later jobs fail at once
    }
    finish(t);
    std::lock_guard<std::mutex> lk(mu_);
    ++finished_;
    done_.notify_all();
  }
  if (queue_) (void)be_.queueDestroy(queue_);
}

}  // namespace tutti::core
