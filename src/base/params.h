// Parameters: NCCL_* and TUTTI_* settings from the environment and config files.
//
// Contract: a value comes from, in order of precedence, the environment, then
// the config file named by TUTTI_CONF_FILE or NCCL_CONF_FILE, then ~/.tutti.conf,
// ~/.nccl.conf, /etc/tutti.conf, /etc/nccl.conf (lines "NAME=VALUE", '#' starts
// a comment). Files are read once, at first use. Lookups are thread-safe and
// cheap enough for init paths (not for per-chunk hot loops: cache the value).
// docs/env.md lists every parameter tutti reads, with its default.
//
// Every lookup through get/getInt/getStr/getBool/getIntAtLeast records the
// name; the first lookup of a name that is set logs, once per process, at INFO
// (subsystem ENV), NCCL's line "NAME set by environment to VALUE." (or "NAME
// set by config file PATH to VALUE."). Names the registry below classes as
// having no effect get no such line: reportEnvironment() names them at WARN.
// Nothing here logs while holding its lock, so the logger may call lookup().
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tutti::params {

// A value and where it came from.
struct Setting {
  std::string value;
  std::string file;  // the config file it came from; empty: the environment
};

// Raw lookup; nullopt when unset everywhere.
std::optional<std::string> get(const char* name);
// Integer with suffixes K/M/G (powers of 1024). Malformed values are warned
// about once and the default is used.
int64_t getInt(const char* name, int64_t dflt);
// getInt, raised to `min` when below it, with one WARN per process naming the
// value set and the value used (NCCL_BUFFSIZE=1K, say).
int64_t getIntAtLeast(const char* name, int64_t dflt, int64_t min);
std::string getStr(const char* name, const std::string& dflt);
bool getBool(const char* name, bool dflt);
// Parses "123", "4K", "2M", "1G"; nullopt when malformed. Exposed for tests.
std::optional<int64_t> parseInt(const std::string& s);
// The settings of a config file's text, in file order: one per line
// "NAME=VALUE" ('#' starts a comment; NAME and VALUE trimmed of white space;
// lines without '=' or with an empty NAME ignored). Pure; exposed for tests
// and tests/fuzz/config_file_fuzz.cc.
std::vector<std::pair<std::string, std::string>> parseConfigText(std::string_view text);
// The value and its origin, without recording the lookup or logging: for the
// logger's own settings (NCCL_DEBUG*), which it reads while configuring itself.
std::optional<Setting> lookup(const char* name);
// "64K", "4M", "1G" when the value is a whole number of those, else the number.
std::string formatSize(int64_t bytes);

// ---- the registry: every NCCL_* and TUTTI_* name tutti knows ---------------------------
//
// A first step towards one typed registry (issue 25): today it classifies
// names; the lookups still name their parameter at the use site.
enum class Effect {
  kHonoured,    // does what NCCL's (or, for TUTTI_*, docs/env.md) says
  kDifferent,   // honoured, with a meaning adapted to tutti (note says how)
  kNoEffect,    // accepted and ignored: does not apply to tutti (note says why); WARNed
  kNotLibrary,  // read by another program (nccl-tests, PyTorch, build tools); skipped
};

struct Known {
  const char* name;  // a full name, or a prefix ending in '_' when `prefix`
  bool prefix;
  Effect effect;
  const char* note;  // what it does in tutti, or why it has no effect
};

// The whole table, and the entry for `name` (an exact entry before the longest
// matching prefix); nullptr when tutti does not know the name.
const std::vector<Known>& registry();
const Known* findKnown(const std::string& name);

// One message per NCCL_* name set in the environment or a config file that has
// no effect in tutti (known as such, or unknown), sorted by name:
// "NCCL_IB_HCA=mlx5_0 has no effect: tutti has no InfiniBand transport ...".
// Pure apart from reading the environment and config files; for tests.
std::vector<std::string> ineffectiveSettings();
// Once per process, at communicator init: the "set by" INFO lines of the
// logger's and config files' own variables, a WARN for each config file named
// by TUTTI_CONF_FILE / NCCL_CONF_FILE that cannot be read, and one WARN per
// message of ineffectiveSettings().
void reportEnvironment();

// Tests: drop cached config-file contents, the names already reported and the
// once-per-process state, so the next lookup re-reads and re-reports them.
void resetForTesting();

}  // namespace tutti::params
