#include "slurm.h"

#include <cctype>
#include <cstdlib>

namespace tutti::perf {

std::string firstSlurmHost(const std::string& nodelist) {
  std::string host;
  size_t i = 0;
  while (i < nodelist.size() && nodelist[i] != ',') {
    char c = nodelist[i];
    if (c == ']') return "";
    if (c != '[') {
      host += c;
      ++i;
      continue;
    }
    // A range set such as [007-010,012]: its first number, as written.
    size_t close = nodelist.find(']', i);
    if (close == std::string::npos) return "";
    size_t j = i + 1;
    size_t start = j;
    while (j < close && std::isdigit(static_cast<unsigned char>(nodelist[j]))) ++j;
    if (j == start) return "";
    host += nodelist.substr(start, j - start);
    i = close + 1;
  }
  return host;
}

int slurmRootPort(const std::string& job_id, const std::string& step_id) {
  auto parse = [](const std::string& s, unsigned long long* out) {
    if (s.empty()) return false;
    for (char c : s)
      if (!std::isdigit(static_cast<unsigned char>(c))) return false;
    *out = std::strtoull(s.c_str(), nullptr, 10);
    return true;
  };
  unsigned long long job = 0, step = 0;
  if (!parse(job_id, &job) || !parse(step_id, &step)) return -1;
  return static_cast<int>(20000 + (job * 64 + step) % 12000);
}

}  // namespace tutti::perf
