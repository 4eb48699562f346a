// NCCL network plugins (libnccl-net*.so) as a tutti message transport.
//
// Which plugin: NCCL_NET_PLUGIN as NCCL reads it. Unset: "libnccl-net.so"
// through the dynamic loader's search (LD_LIBRARY_PATH, the cache); absent is
// not an error. "none": no plugin. Any other value X: "libnccl-net-X.so",
// then X itself (a file name or a path). The table is the newest of
// ncclNetPlugin_v10, _v9 and _v8 the library exports.
//
// A plugin is loaded and initialised once per process (NCCL's rule, which
// plugins rely on) and never unloaded; every communicator shares it. Its log
// callback writes into tutti's log (subsystem NET). Device `d` of a
// connection is its channel modulo the plugin's device count.
#pragma once

#include <string>

#include "transports/net.h"

namespace tutti::transport::ncclnet {

// The NCCL_NET_PLUGIN value in effect ("" when unset).
std::string pluginSetting();

// What tutti tells a plugin that exports tuttiNetSetOption (net_abi.h)
// before its init; empty fields are not passed. A plugin is initialised once
// per process: the first load's options stay.
struct PluginOptions {
  std::string ifname;
};

// The plugin `setting` names (pluginSetting()'s syntax), loaded on the first
// call and the same object afterwards. nullptr with an ok status: no plugin
// (unset and no libnccl-net.so, or "none"). An error says what was tried and
// why it failed (not found, no table of a supported version, init failed, no
// devices); it is cached too.
Result<NetTransport*> loadPlugin(const std::string& setting, const PluginOptions& options = {});

}  // namespace tutti::transport::ncclnet
