#include "topology/xml_guard.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <vector>

namespace tutti::topo {
namespace {

struct Attribute {
  std::string name;
  std::string value;  // as written, entities not decoded
};

// The attributes of the start tag that begins at `tag` ("<object ...>").
std::vector<Attribute> attributesOf(const std::string& text, size_t tag) {
  std::vector<Attribute> attrs;
  size_t i = tag + 1;
  while (i < text.size() && !std::isspace(static_cast<unsigned char>(text[i])) && text[i] != '>')
    ++i;  // the element's name
  while (i < text.size() && text[i] != '>') {
    if (text[i] == '"' || text[i] == '\'') {  // a value: skip to its end
      const size_t close = text.find(text[i], i + 1);
      if (close == std::string::npos) break;
      if (!attrs.empty()) attrs.back().value = text.substr(i + 1, close - i - 1);
      i = close + 1;
      continue;
    }
    if (text[i] == '=' || std::isspace(static_cast<unsigned char>(text[i]))) {
      ++i;
      continue;
    }
    size_t end = i;
    while (end < text.size() && text[end] != '=' && text[end] != '>' &&
           !std::isspace(static_cast<unsigned char>(text[end])))
      ++end;
    attrs.push_back({text.substr(i, end - i), ""});
    i = end == i ? i + 1 : end;
  }
  return attrs;
}

// A set as hwloc writes it: empty, or "0x" and hex digits (or "0xf...f",
// an infinite set), then ",0x" and 8 hex digits per further word.
bool plainSet(const std::string& v) {
  size_t i = 0;
  if (v.compare(0, 7, "0xf...f") == 0) {
    i = 7;
    if (i == v.size()) return true;
  }
  for (bool first = i == 0; i < v.size(); first = false) {
    if (!first && v[i++] != ',') return false;
    if (v.compare(i, 2, "0x") != 0) return false;
    i += 2;
    size_t digits = 0;
    while (i < v.size() && std::isxdigit(static_cast<unsigned char>(v[i]))) ++i, ++digits;
    if (digits == 0 || digits > 16 || (!first && digits != 8)) return false;
  }
  return true;
}

bool endsWith(const std::string& s, const char* tail) {
  const size_t n = std::strlen(tail);
  return s.size() >= n && s.compare(s.size() - n, n, tail) == 0;
}

}  // namespace

std::optional<std::string> hwlocCrashReason(const std::string& text) {
  for (size_t at = text.find("<!DOCTYPE"); at != std::string::npos;
       at = text.find("<!DOCTYPE", at + 1)) {
    const size_t end = text.find('>', at);
    if (text.substr(at, end == std::string::npos ? std::string::npos : end - at).find("SYSTEM") ==
        std::string::npos)
      return std::string("a DOCTYPE without a SYSTEM id");
  }
  static const char* const kSets[] = {"cpuset", "complete_cpuset", "nodeset", "complete_nodeset"};
  for (size_t at = text.find('<'); at != std::string::npos; at = text.find('<', at + 1)) {
    const auto attrs = attributesOf(text, at);
    int sets = 0;
    for (const char* set : kSets)
      sets += std::count_if(attrs.begin(), attrs.end(),
                            [&](const Attribute& a) { return a.name == set; }) > 0;
    // Only objects carry the four sets (a cpukind, say, has a cpuset alone).
    const bool object = text.compare(at, 7, "<object") == 0 && at + 7 < text.size() &&
                        std::isspace(static_cast<unsigned char>(text[at + 7]));
    if (object && sets != 0 && sets != 4)
      return "an object (at byte " + std::to_string(at) +
             ") with some but not all of cpuset, complete_cpuset, nodeset and complete_nodeset";
    for (const auto& a : attrs)
      if ((endsWith(a.name, "cpuset") || endsWith(a.name, "nodeset")) && !plainSet(a.value))
        return a.name + "=\"" + a.value.substr(0, 40) + "\" (at byte " + std::to_string(at) +
               ") is not a set as hwloc writes it (0x and hex digits, then ,0x and 8 for each "
               "further word)";
  }
  return std::nullopt;
}

}  // namespace tutti::topo
