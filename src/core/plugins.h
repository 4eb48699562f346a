// Where tutti finds its plugins (device backends, optional transports).
//
// Contract: plugins live in <directory of libtutti.so>/tutti first (the
// installed layout puts them in P/lib/tutti; for a program in P/bin linking
// tutti statically, P/lib/tutti too), then in each directory of
// TUTTI_PLUGIN_PATH (colon-separated), in that order. A name is resolved to
// the file "libtutti-<kind>-<name>.so"; a value containing '/' is a path and
// is used as is. Lookups only touch the file system (no dlopen here); the
// error of a failed lookup lists every place searched.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace tutti::core {

std::vector<std::string> pluginSearchDirs();
Result<std::string> findPlugin(const std::string& kind, const std::string& nameOrPath);

}  // namespace tutti::core
