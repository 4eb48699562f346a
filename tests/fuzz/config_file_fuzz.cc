// Fuzz target: the config-file parser of base/params (TUTTI_CONF_FILE,
// NCCL_CONF_FILE, ~/.tutti.conf ...): params::parseConfigText, and
// params::parseInt on every value (how getInt reads them).
//
// Invariants (a violation traps):
// - The settings are those of the line-by-line reading params.cc did before
//   the parser was a function of its own (std::getline, cut at '#', split
//   at the first '=', trimmed, empty names dropped): same names, same
//   values, same order.
// - A name is non-empty and holds no '=', '#' or newline; neither a name
//   nor a value starts or ends with white space or holds '#' or a newline.
// - A value parseInt accepts reads back the same from formatSize's text.
#include <cctype>
#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/params.h"
#include "tests/fuzz/fuzz_input.h"

namespace {

using Settings = std::vector<std::pair<std::string, std::string>>;

std::string trimmed(const std::string& s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return s.substr(b, e - b);
}

// params.cc's loop before parseConfigText existed, over a string stream.
Settings lineByLine(const std::string& text) {
  Settings out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    auto hash = line.find('#');
    if (hash != std::string::npos) line.resize(hash);
    auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string key = trimmed(line.substr(0, eq));
    std::string val = trimmed(line.substr(eq + 1));
    if (key.empty()) continue;
    out.emplace_back(std::move(key), std::move(val));
  }
  return out;
}

void checkClean(const std::string& s) {
  FUZZ_CHECK(s.find('#') == std::string::npos);
  FUZZ_CHECK(s.find('\n') == std::string::npos);
  if (!s.empty()) {
    FUZZ_CHECK(!std::isspace(static_cast<unsigned char>(s.front())));
    FUZZ_CHECK(!std::isspace(static_cast<unsigned char>(s.back())));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const Settings got = tutti::params::parseConfigText(std::string_view(text));
  FUZZ_CHECK(got == lineByLine(text));
  for (const auto& [name, value] : got) {
    FUZZ_CHECK(!name.empty());
    FUZZ_CHECK(name.find('=') == std::string::npos);
    checkClean(name);
    checkClean(value);
    if (auto v = tutti::params::parseInt(value)) {
      auto again = tutti::params::parseInt(tutti::params::formatSize(*v));
      FUZZ_CHECK(again && *again == *v);
    }
  }
  return 0;
}
