// The CPU backend as a plugin table (include/tutti/backend_plugin.h): host
// memory only, built into libtutti.so, and the reference every other backend
// is checked against (tests/device/conformance_test.cc).
//
// Contract: every pointer is host memory (queryPointer answers UNKNOWN);
// memAlloc/hostAlloc are page-aligned heap memory; "queues" run nothing
// asynchronously: every async call has completed when it returns, so queues
// and events are tokens and synchronising is free. Host events
// (hostEventCreate) are flags: eventQuery answers 0 until hostEventSignal,
// eventSynchronize blocks until then (it must be signalled by another thread),
// eventRecord on one is ncclInvalidArgument. Later work on a queue here is
// the caller's own next call, which completes before it returns, so it could
// wait for a host event only by blocking that caller (a deadlock when the
// caller is the one to signal): eventWait on a host event that is not
// signalled is refused with ncclInvalidArgument and enqueues nothing, and on
// a signalled one does nothing. tutti never uses host events with this
// backend (host memory is complete on return). launchHostFunc calls fn
// before it returns (everything enqueued before has completed). setDevice
// accepts device 0 only. IPC is not offered (the
// shared-memory transport moves host memory between processes). The kernels
// are the reference kernels of kernels.h, codec_kernels.h and dense_kernels.h;
// gemm accumulates each dot product in double over k in order and rounds once.
#pragma once

#include "tutti/backend_plugin.h"

namespace tutti::cpu {

// The table; static, valid for the life of the process.
const tuttiBackendPlugin_v1* backendPlugin();

// One element of datatype dt (an ncclDataType_t value) at p as a double: how
// PreMulSum scalars are read (0 for an unknown datatype).
double scalarValue(const void* p, int32_t dt);

}  // namespace tutti::cpu
