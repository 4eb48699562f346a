// The little JSON tutti writes by hand (tutti-topo --json, the flight
// recorder's dumps): a string quoted and escaped, an array of what `each`
// makes of every element. Output only; nothing here parses.
#pragma once

#include <string>
#include <vector>

namespace tutti::base {

// `s` as a JSON string: quoted, with ", \ and control characters escaped
// (bytes from 0x80 pass through: UTF-8 stays UTF-8).
std::string jsonString(const std::string& s);

template <typename T, typename F>
std::string jsonArray(const std::vector<T>& v, F each) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + each(v[i]);
  return out + "]";
}

}  // namespace tutti::base
