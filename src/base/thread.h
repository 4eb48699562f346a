// Threads that never terminate the process.
//
// startThread(site, what, body, done) starts a thread that runs body() (which
// returns Status) and hands its Status to done(Status) on that thread. What
// body throws (std::bad_alloc, std::system_error, anything) becomes the error
// Status "<what> failed: ..." instead, logged at WARN; what done throws is
// logged and dropped. Nothing thrown on the thread reaches std::terminate.
// Returns the (joinable) thread, or, when it cannot be created
// (std::system_error: no resources), the error "cannot start the <what>: ..."
// and nothing runs. The thread is named "tutti-<site>" (ps, gdb,
// /proc/<pid>/task/*/comm; site: at most 9 characters). Every thread tutti
// starts goes through it: site "root" (a unique id's root), "service" (a
// rank's bootstrap service), "connect" (the executor's connect threads),
// "engine" (a communicator's engine, core/engine.h); src/capi's init threads
// too ("init").
//
// Tests: setThreadFaultForTesting("<site>") makes the body of every later
// thread of that site throw a std::runtime_error before it runs;
// "<site>@start" makes creating them fail as std::thread does without
// resources; nullptr ends it. `fault` must outlive its use (a literal). Not
// exported from libtutti.so: programs cannot reach it.
#pragma once

#include <sys/types.h>

#include <string>
#include <thread>

#include "base/status.h"

namespace tutti::base {

void setThreadFaultForTesting(const char* fault);

// The threads of this process now (/proc/self/status), or 0 when that
// cannot be read. 1 means a fork() child runs without the risk of a lock
// another thread held (topology/xml_guard.h's child reader).
int threadCount();

// True when `pid` (a process of this host) no longer runs: gone, or a zombie
// its parent has not reaped yet (a launcher that reaps late must not hide a
// dead rank).
bool processDead(pid_t pid);

namespace thread_detail {
// Throws when setThreadFaultForTesting named `site` (at `start`, or in the body).
void testHook(const char* site, bool start);
// The Status of the exception being handled, "<prefix>: <what it says>",
// logged at WARN. Call inside a catch block only; never throws.
Status currentException(const std::string& prefix) noexcept;
void nameThisThread(const char* site) noexcept;
}  // namespace thread_detail

template <typename Body, typename Done>
Result<std::thread> startThread(const char* site, const std::string& what, Body body, Done done) {
  try {
    thread_detail::testHook(site, true);
    return std::thread([site, failed = what + " failed", body = std::move(body),
                        done = std::move(done)]() mutable noexcept {
      thread_detail::nameThisThread(site);
      Status st;
      try {
        thread_detail::testHook(site, false);
        st = body();
      } catch (...) {
        st = thread_detail::currentException(failed);
      }
      try {
        done(std::move(st));
      } catch (...) {
        (void)thread_detail::currentException(failed);
      }
    });
  } catch (...) {
    return thread_detail::currentException("cannot start the " + what);
  }
}

}  // namespace tutti::base
