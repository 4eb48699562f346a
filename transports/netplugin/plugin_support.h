// What tutti's own net plugins (transports/ucx, transports/ofi) share: the
// logger NCCL's init hands over, clocks, connection ids, and the choice of
// network interface from NCCL_SOCKET_IFNAME's syntax. Header-only, included
// by one translation unit per plugin: each plugin is a module of its own with
// its own copy of the state below (the logger), and exports nothing of it
// (the plugins build with hidden visibility and a version script).
//
// No std containers, std::mutex or std::atomic: plugins keep to plain C
// types, so that nothing of the C++ library's templates is instantiated with
// default visibility.
#pragma once

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "transports/ncclnet/net_abi.h"

namespace tutti::transport::netplugin {

using ncclnet::NetLogger;
using ncclnet::NetResult;

// The logger init() received (read and written with __atomic builtins).
inline NetLogger g_logger = nullptr;

// Logs through the loader's logger; a WARN before init goes to stderr.
#define TUTTI_NETPLUGIN_LOG(level, ...)                                                            \
  do {                                                                                             \
    ::tutti::transport::ncclnet::NetLogger np_l =                                                  \
        __atomic_load_n(&::tutti::transport::netplugin::g_logger, __ATOMIC_ACQUIRE);               \
    if (np_l != nullptr) {                                                                         \
      np_l(level, ::tutti::transport::ncclnet::kNetLogSubsysNet, __FILE__, __LINE__, __VA_ARGS__); \
    } else if (level == ::tutti::transport::ncclnet::kNetLogWarn) {                                \
      std::fprintf(stderr, "tutti net plugin (no logger): " __VA_ARGS__);                          \
      std::fputc('\n', stderr);                                                                    \
    }                                                                                              \
  } while (0)

inline void setLogger(NetLogger logger) { __atomic_store_n(&g_logger, logger, __ATOMIC_RELEASE); }

inline double nowSec() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

inline void sleepMicros(long us) {
  timespec ts{us / 1000000, (us % 1000000) * 1000};
  nanosleep(&ts, nullptr);
}

// A random, non-zero 64-bit id (distinct within a process even without
// getrandom).
inline uint64_t randomId() {
  static uint64_t counter = 0;
  uint64_t id = 0;
  if (getrandom(&id, sizeof(id), GRND_NONBLOCK) != static_cast<ssize_t>(sizeof(id))) {
    timespec ts{};
    clock_gettime(CLOCK_MONOTONIC, &ts);
    id = (static_cast<uint64_t>(ts.tv_sec) << 32) ^ static_cast<uint64_t>(ts.tv_nsec) ^
         (static_cast<uint64_t>(getpid()) << 16);
  }
  id ^= __atomic_fetch_add(&counter, 1, __ATOMIC_RELAXED) * 0x9e3779b97f4a7c15ull;
  return id == 0 ? 1 : id;
}

// ---- interfaces (NCCL_SOCKET_IFNAME) ---------------------------------------------

// NCCL's interface list syntax: "a,b" prefixes, "^a,b" all but those prefixes,
// "=a,b" exact names ("^=a" all but exactly a); an ":port" suffix is ignored.
inline bool matchIfName(const char* name, const char* spec) {
  bool exclude = false;
  bool exact = false;
  if (*spec == '^') {
    exclude = true;
    ++spec;
  }
  if (*spec == '=') {
    exact = true;
    ++spec;
  }
  bool matched = false;
  const char* p = spec;
  const size_t nameLen = std::strlen(name);
  for (;;) {
    const char* end = std::strchr(p, ',');
    size_t n = end != nullptr ? static_cast<size_t>(end - p) : std::strlen(p);
    const char* colon = static_cast<const char*>(std::memchr(p, ':', n));
    if (colon != nullptr) n = static_cast<size_t>(colon - p);
    if (n > 0 && std::strncmp(name, p, n) == 0 && (!exact || nameLen == n)) matched = true;
    if (end == nullptr) break;
    p = end + 1;
  }
  return exclude ? !matched : matched;
}

inline bool usableIpv4(const ifaddrs* ifa) {
  if (ifa->ifa_addr == nullptr || ifa->ifa_addr->sa_family != AF_INET) return false;
  if ((ifa->ifa_flags & IFF_UP) == 0) return false;
  const sockaddr_in* sin = reinterpret_cast<const sockaddr_in*>(ifa->ifa_addr);
  return sin->sin_addr.s_addr != htonl(INADDR_ANY);
}

// An interface a plugin uses: its name and IPv4 address.
struct Interface {
  sockaddr_in addr;
  char name[IF_NAMESIZE + 1];
  char addrStr[INET_ADDRSTRLEN];
};

// The first UP IPv4 interface spec (NCCL_SOCKET_IFNAME's syntax) matches;
// without a spec the first non-loopback one, else loopback (named
// "loopback"). `who` prefixes the WARNs ("ucx", "ofi").
inline NetResult chooseInterface(const char* who, const char* spec, Interface* out) {
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) {
    if (spec != nullptr) {
      TUTTI_NETPLUGIN_LOG(ncclnet::kNetLogWarn,
                          "%s: getifaddrs failed (%s); cannot apply NCCL_SOCKET_IFNAME=%s", who,
                          std::strerror(errno), spec);
      return ncclnet::kNetSystemError;
    }
    list = nullptr;
  }
  const ifaddrs* pick = nullptr;
  for (const ifaddrs* ifa = list; ifa != nullptr && pick == nullptr; ifa = ifa->ifa_next) {
    if (!usableIpv4(ifa)) continue;
    if (spec != nullptr ? matchIfName(ifa->ifa_name, spec) : (ifa->ifa_flags & IFF_LOOPBACK) == 0)
      pick = ifa;
  }
  std::memset(out, 0, sizeof(*out));
  out->addr.sin_family = AF_INET;
  if (pick != nullptr) {
    out->addr.sin_addr = reinterpret_cast<const sockaddr_in*>(pick->ifa_addr)->sin_addr;
    std::snprintf(out->name, sizeof(out->name), "%s", pick->ifa_name);
  } else if (spec != nullptr) {
    TUTTI_NETPLUGIN_LOG(ncclnet::kNetLogWarn,
                        "%s: no UP IPv4 interface matches NCCL_SOCKET_IFNAME=%s", who, spec);
    if (list != nullptr) freeifaddrs(list);
    return ncclnet::kNetSystemError;
  } else {
    out->addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::snprintf(out->name, sizeof(out->name), "%s", "loopback");
  }
  if (list != nullptr) freeifaddrs(list);
  inet_ntop(AF_INET, &out->addr.sin_addr, out->addrStr, sizeof(out->addrStr));
  return ncclnet::kNetSuccess;
}

// The names of the UP IPv4 interfaces spec matches, comma-separated, each once.
inline void matchingIfNames(const char* spec, char* out, size_t outSize) {
  out[0] = '\0';
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return;
  size_t len = 0;
  for (const ifaddrs* ifa = list; ifa != nullptr; ifa = ifa->ifa_next) {
    if (!usableIpv4(ifa) || !matchIfName(ifa->ifa_name, spec)) continue;
    bool seen = false;
    for (const ifaddrs* prev = list; prev != ifa; prev = prev->ifa_next)
      if (usableIpv4(prev) && std::strcmp(prev->ifa_name, ifa->ifa_name) == 0) seen = true;
    if (seen) continue;
    size_t n = std::strlen(ifa->ifa_name);
    if (len + n + 2 > outSize) break;
    if (len > 0) out[len++] = ',';
    std::memcpy(out + len, ifa->ifa_name, n);
    len += n;
    out[len] = '\0';
  }
  freeifaddrs(list);
}

// tutti's "ifname" option (ncclnet::TuttiNetSetOption), stored until init:
// the interfaces to use, in NCCL_SOCKET_IFNAME's syntax.
inline char g_ifOption[256] = "";

inline NetResult setOption(const char* key, const char* value) {
  if (key == nullptr || value == nullptr) return ncclnet::kNetInvalidArgument;
  if (std::strcmp(key, "ifname") != 0) return ncclnet::kNetInvalidArgument;  // unknown
  if (std::strlen(value) >= sizeof(g_ifOption)) return ncclnet::kNetInvalidArgument;
  std::strcpy(g_ifOption, value);
  return ncclnet::kNetSuccess;
}

// The interface spec in force: tutti's option, else NCCL_SOCKET_IFNAME, else
// nullptr; *source says which, for the log ("tutti's ifname option ",
// "NCCL_SOCKET_IFNAME=").
inline const char* ifSpec(const char** source) {
  const char* spec = std::getenv("NCCL_SOCKET_IFNAME");
  *source = "NCCL_SOCKET_IFNAME=";
  if (g_ifOption[0] != '\0') {
    spec = g_ifOption;
    *source = "tutti's ifname option ";
  }
  if (spec != nullptr && *spec == '\0') spec = nullptr;
  return spec;
}

}  // namespace tutti::transport::netplugin
