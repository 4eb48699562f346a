// Internal entry points of the C API layer for tutti's extensions
// (compress_api.cc) that run collectives through nccl_api.cc's machinery.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "algo/schedule.h"
#include "nccl.h"

struct tuttiCompressor;

namespace tutti::capi {

// A compressed all-reduce's wire format (kHalf: the scale exponent is agreed
// at run time), its residuals (algo::Buf::kState) and its byte counter.
struct Compressed {
  algo::WireSpec wire;
  float* state = nullptr;
  uint64_t* wireBytes = nullptr;
};

// ncclAllReduce with compression `c` (null: exact, counted into *wireBytes
// when given), in the order of `stream` as ncclAllReduce. Validates like
// ncclAllReduce; `fn` names the caller in errors.
ncclResult_t allReduce(const char* fn, const void* send, void* recv, size_t count, int dt, int op,
                       ncclComm_t comm, const Compressed* c, cudaStream_t stream);

// Whether the calling thread is inside ncclGroupStart/End.
bool inGroup();

// Tests: the error-feedback residuals a compressor keeps for `key` (1-bit:
// the worker's for all count elements, then the server's for this rank's
// segment; PowerSGD: rows x cols, its deferred update applied first), or null
// when it keeps none.
const std::vector<float>* compressorResidual(tuttiCompressor* c, unsigned long long key);

}  // namespace tutti::capi
