// xpu_emu: error reporting shared by the plugin's files.
//
// Contract: every failure path of the plugin calls setError(), which stores a
// readable reason in a thread-local string (what lastError() returns) and hands
// the code back, so a failing call is `return setError(code, "why")`. A
// successful call leaves the previous reason in place. No printing, no throwing.
#pragma once

#include <string>

#include "nccl.h"

namespace xpu_emu {

// Records msg as the calling thread's last error (prefixed "xpu_emu: ") and
// returns code.
ncclResult_t setError(ncclResult_t code, const std::string& msg);

// setError(ncclSystemError, what + ": " + strerror(errno)).
ncclResult_t setSystemError(const std::string& what);

// The calling thread's last error text, "" if none. Valid until the next
// setError() on this thread.
const char* lastErrorText();

}  // namespace xpu_emu
