// The progress engine of a communicator: operations on device streams run on
// its thread, in call order, and the caller returns as soon as they are
// queued.
//
// Contract
// - submit(streams, job, hold): the job starts once the work queued on each
//   of `streams` before the call has completed (see "Waiting for a stream").
//   With `hold`, later work on those streams
//   waits until the job has finished (a host event each stream waits on,
//   signalled by the engine thread whether the job succeeded or not): no
//   host thread blocks in between; this requires Backend::hasHostEvents().
//   Without it, nothing holds the streams: the caller learns of the end
//   through busy() (a non-blocking communicator's ncclInProgress). The job
//   runs on the engine thread, with the engine's own queue on the
//   communicator's device for its copies and kernels (never the caller's
//   streams: they may be held until the job ends). submit() returns once the
//   job is queued, or with the error of setting up its events (nothing is
//   queued then).
// - Jobs run one at a time, in submission order. A job that fails breaks the
//   communicator (Comm::setError): later jobs fail at once, their streams are
//   still released, and ncclCommGetAsyncError reports the error. So does an
//   abort (Comm::abort), which also ends the wait for a stream at once
//   (interrupt()).
// - Waiting for a stream: a backend event is recorded on each stream. Where
//   the backend offers host functions (Backend::hasHostFuncs) one is queued
//   behind it too: it wakes the engine, which sleeps on a condition variable
//   meanwhile and checks the events only every kRecheck (a device that fails
//   may drop the call, its events then report the error), so a kernel that
//   runs for seconds costs the engine a handful of wake-ups. Without them (or
//   when the backend refuses one for a stream) the engine polls the events,
//   spinning, yielding, then napping (base::Backoff).
// - drain(): returns once every job submitted so far has finished. idle():
//   nothing is queued or running (what it reads, the jobs' effects included,
//   happened before it returned true).
// - The thread runs near the communicator's device: when Comm::deviceNuma()
//   is known (the device's PCI bus id found in the topology) it binds itself
//   to that NUMA node's CPUs the process may use (topo::bindThisThreadNear)
//   before its first job; a host-memory communicator whose traffic goes over
//   TCP binds near its NIC instead (Comm::nicNuma(): the interface's PCI
//   device in the topology); otherwise it keeps the mask it inherited from
//   the thread of the first submit. A failed bind is a WARN, never an error.
// - One thread per communicator, started by the first submit (a communicator
//   that never has an operation on a device stream has none); it catches
//   everything; the destructor drains (or, once the communicator is aborted,
//   fails what is left) and joins it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "base/status.h"
#include "core/backend.h"

namespace tutti::core {

class Comm;

class Engine {
 public:
  using Job = std::function<Status(Queue)>;

  explicit Engine(Comm* comm);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  Status submit(const std::vector<Queue>& streams, Job job, bool hold = true);
  void drain();
  bool idle() const;
  // Jobs run so far (tests: the thread count stays one however many run).
  uint64_t jobsRun() const;
  // Ends a wait for a stream now (Comm::abort, after setting the flag).
  void interrupt();

  // How often a wait woken by host functions checks the events anyway.
  static constexpr std::chrono::milliseconds kRecheck{100};

 private:
  struct Arrival;  // the host functions' count of streams still to arrive
  struct Task {
    Job job;
    std::vector<Event> ready;          // recorded on the caller's streams
    std::vector<Event> release;        // host events the caller's streams wait on
    std::shared_ptr<Arrival> arrival;  // with host functions on every stream; else polled
  };
  void run();
  Status start();
  // Waits until t's streams reached the call (see "Waiting for a stream").
  Status waitReady(const Task& t);
  Status sleepUntilArrived(const Task& t);
  Status pollUntilReady(const Task& t);
  // Queues a host function behind t's ready event on s; false (t polls) when
  // the backend refuses it for that stream.
  bool announceArrival(Task& t, Queue s);
  // Signals and destroys t's events.
  void finish(Task& t);
  // The thread ended on an exception: the communicator is broken, what is
  // queued is released, later submits fail.
  void abandon(const Status& why);

  Comm* comm_;
  Backend& be_;
  mutable std::mutex mu_;
  std::condition_variable wake_, done_;
  std::deque<Task> tasks_;
  bool stopping_ = false;
  Status dead_;  // why the thread ended early (ok while it runs)
  uint64_t submitted_ = 0, finished_ = 0;
  std::thread thread_;
  Queue queue_ = nullptr;             // the engine's own (created by the thread's first job)
  std::shared_ptr<Arrival> waiting_;  // guarded by mu_: what the thread sleeps on now
  std::atomic<bool> hostFuncRefused_{false};  // logged once
};

}  // namespace tutti::core
