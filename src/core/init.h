// Creating a communicator: at once on the caller's thread, together with
// others at the end of a group, or on a thread of its own (a non-blocking
// communicator). ncclCommInit* and the children of ncclCommSplit come here.
//
// Contract
// - A CommInit holds what Comm::create needs and, once the creation has
//   finished, its result: the communicator, or the error (logged at WARN
//   when it happens, naming the rank, so that an error nobody polls for is
//   still seen).
// - state(): Code::kInProgress until the creation has finished, then kOk or
//   the error's code. Once it reads kOk, comm() is the communicator (the
//   store of the state publishes it); status() is the error otherwise.
// - run(): creates on the calling thread. start(): on a thread of its own
//   (base::startThread: what the creation throws becomes its error); when
//   that thread cannot start, the creation has finished with that error.
//   runAll(): several at once, one thread each when there is more than one
//   (one thread may create every rank of a communicator), returning when
//   all have finished.
// - startSplit(parent, color, key): a child of ncclCommSplit created
//   without blocking the caller. The exchange runs on the parent's engine
//   (Comm::splitQueued), in call order with the operations queued there;
//   its plan fills in the id, rank and size, and the creation then starts
//   as with start(). Until then argsKnown() is false (args() has no rank,
//   size or id); an exchange that fails, or a parent that fails or is
//   aborted before it runs, fails the creation. wait() waits for the
//   exchange too (abort() does not end it: the parent's peers, its abort or
//   its init deadline do).
// - abort(): raises the communicator's abort flag: a creation still running
//   ends within one 50 ms slice of the wait it is in, with an error; once
//   created, it is the communicator's flag (Comm::abort raises the same).
// - wait(): returns once the creation has finished (joins its thread).
//   The destructor waits too: a creation ends by success, by error, by
//   abort(), or at TUTTI_INIT_TIMEOUT.
#pragma once

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "base/status.h"
#include "core/bootstrap.h"
#include "core/comm.h"
#include "nccl.h"

namespace tutti::core {

// What ncclConfig_t asks (NULL: the defaults), or kInvalidArgument saying
// why it cannot be read: not initialised with NCCL_CONFIG_INITIALIZER, or
// blocking neither 0 nor 1.
Result<CommConfig> commConfig(const ncclConfig_t* config);

struct InitArgs {
  UniqueIdData id{};
  int rank = -1;
  int nranks = 0;
  CommConfig config;
  Backend* backend = nullptr;  // the process's device backend
  int device = 0;              // the device the communicator is bound to
};

class CommInit {
 public:
  explicit CommInit(InitArgs args) : args_(std::move(args)) {}
  ~CommInit() { wait(); }
  CommInit(const CommInit&) = delete;
  CommInit& operator=(const CommInit&) = delete;

  const InitArgs& args() const { return args_; }
  bool argsKnown() const { return argsKnown_.load(std::memory_order_acquire); }

  void run();
  void start();
  void startSplit(Comm& parent, int color, int key);
  static void runAll(const std::vector<CommInit*>& inits);
  void abort() { abort_.store(true); }
  void wait();

  Code state() const { return static_cast<Code>(state_.load(std::memory_order_acquire)); }
  bool finished() const { return state() != Code::kInProgress; }
  // The error (ok while in progress or after success); call once finished.
  const Status& status() const { return status_; }
  // The communicator, once state() is kOk (null before); it lives as long
  // as the CommInit.
  Comm* comm() const { return comm_.get(); }

 private:
  void finish(Status st);

  InitArgs args_;  // id, rank and size written once, before argsKnown_ (startSplit)
  std::atomic<bool> argsKnown_{true};
  std::atomic<int> state_{static_cast<int>(Code::kInProgress)};
  Status status_;
  std::atomic<bool> abort_{false};  // the communicator's flag: declared before comm_, outlives it
  std::unique_ptr<Comm> comm_;
  std::mutex threadMu_;  // start() and wait() may race (a poll and a destroy)
  std::condition_variable exchanged_;
  bool exchanging_ = false;  // startSplit's exchange is queued or running (under threadMu_)
  std::thread thread_;
};

}  // namespace tutti::core
