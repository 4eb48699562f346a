// xpu_emu: queue worker threads and events. See emu_queue.h for the contract.
#include "emu_queue.h"

#include <utility>

namespace xpu_emu {

Queue::Queue(int device) : device_(device) {
  worker_ = std::thread([this] { run(); });
}

Queue::~Queue() {
  retire();
  join();
}

uint64_t Queue::submit(std::function<void()> cmd) {
  std::lock_guard<std::mutex> lock(mu_);
  pending_.push_back(std::move(cmd));
  const uint64_t seq = ++submitted_;
  wake_.notify_one();
  return seq;
}

void Queue::waitFor(uint64_t seq) {
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return completed_ >= seq || exited_; });
}

void Queue::synchronize() {
  uint64_t target;
  {
    std::lock_guard<std::mutex> lock(mu_);
    target = submitted_;
  }
  waitFor(target);
}

void Queue::retire() {
  std::lock_guard<std::mutex> lock(mu_);
  retiring_ = true;
  wake_.notify_one();
}

bool Queue::drained() {
  std::lock_guard<std::mutex> lock(mu_);
  return completed_ == submitted_;
}

bool Queue::exited() {
  std::lock_guard<std::mutex> lock(mu_);
  return exited_;
}

void Queue::join() {
  if (worker_.joinable()) worker_.join();
}

void Queue::run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    wake_.wait(lock, [&] { return !pending_.empty() || retiring_; });
    if (pending_.empty()) break;  // retiring and drained
    std::function<void()> cmd = std::move(pending_.front());
    pending_.pop_front();
    lock.unlock();
    cmd();
    cmd = nullptr;  // release captured buffers/events before reporting completion
    lock.lock();
    ++completed_;
    done_.notify_all();
  }
  exited_ = true;
  done_.notify_all();
}

Event::Event(int device, Kind kind) : device_(device), kind_(kind) {
  if (kind_ == Kind::kHost) outstanding_.insert(++recorded_);  // mark 1, until signal()
}

void Event::signal() {
  if (kind_ == Kind::kHost) complete(1);
}

uint64_t Event::newMark() {
  std::lock_guard<std::mutex> lock(mu_);
  outstanding_.insert(++recorded_);  // may throw std::bad_alloc before anything is enqueued
  return recorded_;
}

void Event::complete(uint64_t mark) {
  std::lock_guard<std::mutex> lock(mu_);
  outstanding_.erase(mark);
  cv_.notify_all();
}

uint64_t Event::latestMark() {
  std::lock_guard<std::mutex> lock(mu_);
  return recorded_;
}

bool Event::reached(uint64_t mark) {
  std::lock_guard<std::mutex> lock(mu_);
  return outstanding_.count(mark) == 0;
}

bool Event::done() {
  std::lock_guard<std::mutex> lock(mu_);
  return outstanding_.count(recorded_) == 0;
}

void Event::waitUntil(uint64_t mark) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return outstanding_.count(mark) == 0; });
}

}  // namespace xpu_emu
