#include "base/thread.h"

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <stdexcept>
#include <string>
#include <system_error>

#include "base/log.h"

namespace tutti::base {

int threadCount() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line))
    if (line.rfind("Threads:", 0) == 0) return std::atoi(line.c_str() + 8);
  return 0;
}

bool processDead(pid_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return true;
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  FILE* f = fopen(path, "r");
  if (!f) return false;  // no procfs: rely on kill() alone
  char buf[512];
  size_t n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = 0;
  const char* paren = strrchr(buf, ')');  // the command name may contain spaces
  return paren && (paren[1] == ' ') && (paren[2] == 'Z' || paren[2] == 'X');
}
namespace {

// What setThreadFaultForTesting named; a constant-initialised atomic, so a
// thread that starts while the process exits finds it intact.
std::atomic<const char*> g_threadFault{nullptr};

}  // namespace

void setThreadFaultForTesting(const char* fault) { g_threadFault.store(fault); }

namespace thread_detail {

void testHook(const char* site, bool start) {
  const char* fault = g_threadFault.load(std::memory_order_relaxed);
  if (!fault) return;
  const size_t n = strlen(site);
  if (strncmp(fault, site, n) != 0 || strcmp(fault + n, start ? "@start" : "") != 0) return;
  const std::string what =
      std::string("injected failure (setThreadFaultForTesting(\"") + fault + "\"))";
  if (start) throw std::system_error(EAGAIN, std::generic_category(), what);
  throw std::runtime_error(what);
}

Status currentException(const std::string& prefix) noexcept {
  try {
    Status st;
    try {
      throw;
    } catch (const std::bad_alloc&) {
      st = systemError(prefix + ": out of host memory");
    } catch (const std::system_error& e) {
      st = systemError(prefix + ": " + e.what());
    } catch (const std::exception& e) {
      st = internalError(prefix + ": internal error: " + e.what());
    } catch (...) {
      st = internalError(prefix + ": unknown internal error");
    }
    TUTTI_WARN("{}", st.message());
    return st;
  } catch (...) {
    return Status(Code::kSystemError, "out of memory");  // short enough not to allocate
  }
}

void nameThisThread(const char* site) noexcept {
  char name[16];
  snprintf(name, sizeof(name), "tutti-%s", site);
  pthread_setname_np(pthread_self(), name);
}

}  // namespace thread_detail

}  // namespace tutti::base
