#include "base/log.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>

#include "base/params.h"
#include "base/status.h"

namespace tutti {

Status errnoError(const std::string& what, int err) {
  char buf[128];
  const char* s = strerror_r(err, buf, sizeof(buf));  // GNU variant
  return Status(Code::kSystemError, what + ": " + s);
}

namespace log {
namespace {

struct Config {
  Level level = Level::kNone;
  uint32_t subsys = kInit | kEnv;  // NCCL's default mask
  FILE* file = stderr;
  char host[64] = {};
};

std::mutex g_mu;
std::atomic<bool> g_init{false};
std::atomic<int> g_level{0};
std::atomic<uint32_t> g_subsys{0};
Config g_cfg;
thread_local int t_rank = -1;

uint32_t subsysBit(const std::string& name) {
  static const struct {
    const char* n;
    uint32_t b;
  } kMap[] = {
      {"INIT", kInit},   {"COLL", kColl},   {"P2P", kP2p},       {"SHM", kShm},
      {"NET", kNet},     {"GRAPH", kGraph}, {"TUNING", kTuning}, {"ENV", kEnv},
      {"ALLOC", kAlloc}, {"CALL", kCall},   {"PROXY", kProxy},   {"BOOTSTRAP", kBootstrap},
      {"REG", kReg},     {"ALL", kAll},
  };
  for (auto& m : kMap)
    if (strcasecmp(m.n, name.c_str()) == 0) return m.b;
  return 0;
}

void initLocked() {
  if (g_init.load(std::memory_order_acquire)) return;
  g_cfg = Config();
  gethostname(g_cfg.host, sizeof(g_cfg.host) - 1);
  if (char* dot = strchr(g_cfg.host, '.')) *dot = 0;
  // From params (environment, then config files) like every other setting;
  // lookup() neither logs nor records, so configuring the logger cannot recurse
  // into it. params::reportEnvironment() prints their "set by" lines.
  const auto debug = params::lookup("NCCL_DEBUG");
  const auto subsys = params::lookup("NCCL_DEBUG_SUBSYS");
  const auto file = params::lookup("NCCL_DEBUG_FILE");
  if (debug) {
    const char* d = debug->value.c_str();
    if (!strcasecmp(d, "VERSION"))
      g_cfg.level = Level::kVersion;
    else if (!strcasecmp(d, "WARN"))
      g_cfg.level = Level::kWarn;
    else if (!strcasecmp(d, "INFO"))
      g_cfg.level = Level::kInfo;
    else if (!strcasecmp(d, "ABORT"))
      g_cfg.level = Level::kAbort;
    else if (!strcasecmp(d, "TRACE"))
      g_cfg.level = Level::kTrace;
  }
  if (subsys) {
    std::string spec = subsys->value;
    bool invert = !spec.empty() && spec[0] == '^';
    if (invert) spec.erase(0, 1);
    uint32_t mask = 0;
    std::stringstream ss(spec);
    std::string tok;
    while (std::getline(ss, tok, ',')) mask |= subsysBit(tok);
    g_cfg.subsys = invert ? ~mask : mask;
  }
  if (file && g_cfg.level != Level::kNone) {
    const char* f = file->value.c_str();
    std::string path;
    for (const char* p = f; *p; ++p) {
      if (*p == '%' && p[1] == 'h') {
        path += g_cfg.host;
        ++p;
      } else if (*p == '%' && p[1] == 'p') {
        path += std::to_string(getpid());
        ++p;
      } else if (*p == '%' && p[1] == '%') {
        path += '%';
        ++p;
      } else
        path += *p;
    }
    if (FILE* fp = fopen(path.c_str(), "w")) {
      setvbuf(fp, nullptr, _IOLBF, 0);
      g_cfg.file = fp;
    }
  }
  g_level.store(static_cast<int>(g_cfg.level), std::memory_order_relaxed);
  g_subsys.store(g_cfg.subsys, std::memory_order_relaxed);
  g_init.store(true, std::memory_order_release);
}

}  // namespace

bool enabled(Level level, uint32_t subsys) {
  if (!g_init.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lk(g_mu);
    initLocked();
  }
  if (static_cast<int>(level) > g_level.load(std::memory_order_relaxed)) return false;
  if (level == Level::kInfo || level == Level::kTrace)
    return (g_subsys.load(std::memory_order_relaxed) & subsys) != 0;
  return true;
}

void write(Level level, uint32_t, const std::string& msg) {
  const char* lv = level == Level::kWarn ? "WARN" : level == Level::kTrace ? "TRACE" : "INFO";
  long tid = syscall(SYS_gettid);
  std::lock_guard<std::mutex> lk(g_mu);
  initLocked();
  if (level == Level::kVersion)
    fprintf(g_cfg.file, "%s\n", msg.c_str());
  else if (t_rank >= 0)
    fprintf(g_cfg.file, "%s:%d:%ld [%d] NCCL %s %s\n", g_cfg.host, getpid(), tid, t_rank, lv,
            msg.c_str());
  else
    fprintf(g_cfg.file, "%s:%d:%ld [-] NCCL %s %s\n", g_cfg.host, getpid(), tid, lv, msg.c_str());
  fflush(g_cfg.file);
}

void setThreadRank(int rank) { t_rank = rank; }

void reset() {
  std::lock_guard<std::mutex> lk(g_mu);
  if (g_cfg.file && g_cfg.file != stderr) fclose(g_cfg.file);
  g_cfg.file = stderr;
  g_init.store(false, std::memory_order_release);
  initLocked();
}

}  // namespace log
}  // namespace tutti
