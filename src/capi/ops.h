// What the files of the C API layer share beyond errors.h: the checks every
// entry point on a communicator makes, and the calling thread's group state.
#pragma once

#include <vector>

#include "nccl.h"

struct tuttiCompressor;

namespace tutti::capi {

// The communicator is a live handle (and, with needReady, initialised, not
// finalized, not in error state, not aborted); else the error, recorded.
ncclResult_t checkComm(ncclComm_t comm, const char* fn, bool needReady = true);

// Whether the calling thread is inside ncclGroupStart/End.
bool inGroup();

// Tests: the error-feedback residuals a compressor keeps for `key`
// (core::Compressor::residual), or null when it keeps none.
const std::vector<float>* compressorResidual(tuttiCompressor* c, unsigned long long key);

}  // namespace tutti::capi
