#include "core/params.h"

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <set>

#include "core/log.h"

namespace tutti::params {
namespace {

std::mutex g_mu;
bool g_loaded = false;
std::map<std::string, std::string> g_file;  // values from config files
std::set<std::string> g_warned;

std::string trim(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

void loadFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return;
  std::string line;
  while (std::getline(in, line)) {
    auto hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string key = trim(line.substr(0, eq));
    std::string val = trim(line.substr(eq + 1));
    if (key.empty()) continue;
    g_file.emplace(key, val);  // first file read wins (highest precedence first)
  }
}

void ensureLoaded() {
  if (g_loaded) return;
  g_loaded = true;
  if (const char* p = std::getenv("TUTTI_CONF_FILE")) loadFile(p);
  if (const char* p = std::getenv("NCCL_CONF_FILE")) loadFile(p);
  if (const char* home = std::getenv("HOME")) {
    loadFile(std::string(home) + "/.tutti.conf");
    loadFile(std::string(home) + "/.nccl.conf");
  }
  loadFile("/etc/tutti.conf");
  loadFile("/etc/nccl.conf");
}

}  // namespace

std::optional<std::string> get(const char* name) {
  if (const char* v = std::getenv(name)) return std::string(v);
  std::lock_guard<std::mutex> lk(g_mu);
  ensureLoaded();
  auto it = g_file.find(name);
  if (it == g_file.end()) return std::nullopt;
  return it->second;
}

std::optional<int64_t> parseInt(const std::string& raw) {
  std::string s = trim(raw);
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  long long v = std::strtoll(s.c_str(), &end, 0);
  if (end == s.c_str() || errno == ERANGE) return std::nullopt;
  int64_t mult = 1;
  if (*end) {
    switch (std::toupper(static_cast<unsigned char>(*end))) {
      case 'K':
        mult = 1LL << 10;
        break;
      case 'M':
        mult = 1LL << 20;
        break;
      case 'G':
        mult = 1LL << 30;
        break;
      default:
        return std::nullopt;
    }
    ++end;
    if (*end == 'B' || *end == 'b') ++end;
    if (*end) return std::nullopt;
  }
  return static_cast<int64_t>(v) * mult;
}

int64_t getInt(const char* name, int64_t dflt) {
  auto v = get(name);
  if (!v) return dflt;
  auto parsed = parseInt(*v);
  if (!parsed) {
    bool first;
    {
      std::lock_guard<std::mutex> lk(g_mu);
      first = g_warned.insert(name).second;
    }
    if (first) TUTTI_WARN("Invalid value '{}' for {}, using default {}", *v, name, dflt);
    return dflt;
  }
  return *parsed;
}

std::string getStr(const char* name, const std::string& dflt) {
  auto v = get(name);
  return v ? *v : dflt;
}

bool getBool(const char* name, bool dflt) {
  auto v = get(name);
  if (!v) return dflt;
  std::string s = trim(*v);
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (s == "1" || s == "true" || s == "yes" || s == "on") return true;
  if (s == "0" || s == "false" || s == "no" || s == "off" || s.empty()) return false;
  return getInt(name, dflt ? 1 : 0) != 0;
}

void resetForTesting() {
  std::lock_guard<std::mutex> lk(g_mu);
  g_loaded = false;
  g_file.clear();
  g_warned.clear();
}

}  // namespace tutti::params
