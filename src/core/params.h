// Parameters: NCCL_* and TUTTI_* settings from the environment and config files.
//
// Contract: a value comes from, in order of precedence, the environment, then
// the config file named by TUTTI_CONF_FILE or NCCL_CONF_FILE, then ~/.tutti.conf,
// ~/.nccl.conf, /etc/tutti.conf, /etc/nccl.conf (lines "NAME=VALUE", '#' starts
// a comment). Files are read once, at first use. Lookups are thread-safe and
// cheap enough for init paths (not for per-chunk hot loops: cache the value).
// docs/env.md lists every parameter tutti reads, with its default.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace tutti::params {

// Raw lookup; nullopt when unset everywhere.
std::optional<std::string> get(const char* name);
// Integer with suffixes K/M/G (powers of 1024). Malformed values are warned
// about once and the default is used.
int64_t getInt(const char* name, int64_t dflt);
std::string getStr(const char* name, const std::string& dflt);
bool getBool(const char* name, bool dflt);
// Parses "123", "4K", "2M", "1G"; nullopt when malformed. Exposed for tests.
std::optional<int64_t> parseInt(const std::string& s);
// Tests: drop cached config-file contents so the next lookup re-reads them.
void resetForTesting();

}  // namespace tutti::params
