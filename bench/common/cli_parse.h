// Command-line value parsing shared by the bench tools (tutti-perf,
// tutti-sim). Header-only: the tools link different libraries (tutti-perf
// only the public C API), so there is no common library to put it in.
// Every function returns false on bad input and never throws.
#pragma once

#include <getopt.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <string>

namespace tutti::bench {

inline bool endsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// A byte count: a non-negative number with an optional K, M, G or T (binary
// multiples) and an optional trailing "B" or "iB", e.g. 8, 1K, 256M, 1.5GB.
inline bool parseSize(const char* text, size_t* out) {
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(text, &end);
  if (end == text || errno != 0 || !(v >= 0) || std::isinf(v)) return false;
  std::string suffix(end);
  for (char& c : suffix) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (endsWith(suffix, "IB")) {
    suffix.resize(suffix.size() - 2);
  } else if (!suffix.empty() && suffix.back() == 'B') {
    suffix.pop_back();
  }
  double mult = 1;
  if (suffix == "K") {
    mult = 1024.0;
  } else if (suffix == "M") {
    mult = 1024.0 * 1024;
  } else if (suffix == "G") {
    mult = 1024.0 * 1024 * 1024;
  } else if (suffix == "T") {
    mult = 1024.0 * 1024 * 1024 * 1024;
  } else if (!suffix.empty()) {
    return false;
  }
  double bytes = std::floor(v * mult);
  if (bytes > static_cast<double>(size_t{1} << 50)) return false;
  *out = static_cast<size_t>(bytes);
  return true;
}

// A decimal integer in [lo, hi], nothing after it.
inline bool parseLong(const char* text, long lo, long hi, long* out) {
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || errno != 0 || v < lo || v > hi) return false;
  *out = v;
  return true;
}

// How a flag is spelled in messages: "-b/--minbytes", or "--np" for a
// long-only flag (key >= 256).
inline std::string flagName(int key, const option* longopts) {
  for (const option* o = longopts; o->name != nullptr; ++o)
    if (o->val == key)
      return key < 256 ? std::string("-") + static_cast<char>(key) + "/--" + o->name
                       : std::string("--") + o->name;
  return std::string("-") + static_cast<char>(key);
}

}  // namespace tutti::bench
