// xpu_emu: queues (the emulated device's streams) and events.
//
// Contract:
// - A Queue owns one worker thread that runs submitted commands one at a time
//   in submission order (copies, kernels, event records, event waits). submit()
//   never blocks on the device; it returns the command's sequence number.
//   waitFor(seq) blocks until that command (and so all earlier ones) has run;
//   synchronize() waits for everything submitted so far.
// - retire() asks the worker to exit once the queue is empty (queueDestroy does
//   not wait); join() waits for that. The destructor retires and joins, so
//   destroying a Queue drains it.
// - An Event counts records: record() hands out a new mark, and the command
//   enqueued with it calls complete(mark) when the queue reaches it. The event
//   is done when its newest mark has completed (never recorded: done). wait()
//   targets the newest mark at the time of the call, as cudaStreamWaitEvent
//   does; marks are tracked one by one, so re-recording on another queue that
//   finishes first does not release a wait on the older mark. Events are
//   shared (std::shared_ptr) by the commands that use them, so destroying an
//   event lets pending records complete normally.
// - A host event (Kind::kHost, hostEventCreate) has one mark, outstanding
//   from its creation, that only signal() completes (idempotent); it is never
//   recorded. A wait on it is a command that blocks its queue's worker on the
//   event's condition variable until the signal (no spinning), so later
//   commands of that queue run only after it while the thread that enqueued
//   the wait goes on.
//   emuEventDestroy and emuFinalize signal host events, so no worker waits
//   on one forever.
// - Commands must not throw; everything here is thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <set>
#include <thread>

namespace xpu_emu {

class Queue {
 public:
  explicit Queue(int device);  // starts the worker (may throw std::system_error)
  Queue(const Queue&) = delete;
  Queue& operator=(const Queue&) = delete;
  ~Queue();

  int device() const { return device_; }
  uint64_t submit(std::function<void()> cmd);  // may throw std::bad_alloc
  void waitFor(uint64_t seq);
  void synchronize();
  void retire();
  bool exited();   // the worker has left after retire()
  bool drained();  // everything submitted has completed
  void join();

 private:
  void run();

  const int device_;
  std::mutex mu_;
  std::condition_variable wake_;  // worker: work arrived or retire
  std::condition_variable done_;  // waiters: a command finished
  std::deque<std::function<void()>> pending_;
  uint64_t submitted_ = 0;
  uint64_t completed_ = 0;
  bool retiring_ = false;
  bool exited_ = false;
  std::thread worker_;
};

class Event {
 public:
  enum class Kind { kQueue, kHost };                     // completed by queue records / by the host
  explicit Event(int device, Kind kind = Kind::kQueue);  // may throw std::bad_alloc
  int device() const { return device_; }
  bool isHost() const { return kind_ == Kind::kHost; }
  void signal();                  // host events: completes the one mark; idempotent
  uint64_t newMark();             // record: the mark the queue will complete
  void complete(uint64_t mark);   // run by the queue when it reaches the mark
  uint64_t latestMark();          // what a wait issued now has to wait for
  bool reached(uint64_t mark);    // mark completed (mark 0: always)
  bool done();                    // the newest mark has completed
  void waitUntil(uint64_t mark);  // blocks until reached(mark)

 private:
  const int device_;
  const Kind kind_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t recorded_ = 0;           // newest mark handed out
  std::set<uint64_t> outstanding_;  // marks handed out and not completed yet
};

}  // namespace xpu_emu
