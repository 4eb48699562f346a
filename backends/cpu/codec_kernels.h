// Reference wire-codec kernels on host memory: what compressed collectives
// (src/compress) run to put float32 payload on the wire as scaled binary16 /
// bfloat16 or as 1-bit signs with a scale per block, with error feedback.
// Other backends implement the same operations and are checked against these.
//
// Contract (all functions):
// - n is in elements; n == 0 does nothing and touches no memory.
// - Pointers need no alignment. Float outputs may alias a float input exactly
//   (in place); no other overlap. Synchronous, thread-safe, never allocate.
// - Results are bit-identical whatever instruction set runs them (AVX2 paths
//   compute exactly what the scalar code does).
//
// Scaled narrow floats (kHalf, kBf16): a value v travels as narrow(v * 2^exp)
// (round to nearest even, float_formats.h rules: gradual underflow, overflow
// to inf, NaN kept) and is decoded as float(narrow) * 2^-exp. Scaling by a
// power of two is exact, so decode(encode(decode(w))) == decode(w): a decoded
// value re-encodes to the same bits. exp must lie in [-100, 100].
//
// Signs (kSign): elements are grouped in blocks of kSignBlock (the last one may
// be shorter), each encoded as [float32 scale][ceil(len/8) bytes of bits].
// scale = mean |c| over the block (accumulated in double, rounded once to
// float); bit i (LSB first within a byte) is 1 when c[i] < 0. Decoding gives
// -scale or +scale. Re-encoding decoded values gives the same bytes. A block
// holding a NaN or inf yields a non-finite scale (the block decodes non-finite).
//
// Error feedback (`err` non-null, n floats): the encoded value is c = src + err
// (float add), and afterwards err = c - decode(encode(c)) (float subtract), so
// what was not sent is added next time.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tutti::cpu {

enum class WireFormat : uint8_t { kHalf = 1, kBf16 = 2, kSign = 3 };

inline constexpr size_t kSignBlock = 512;

// Bytes on the wire for n float32 elements.
size_t wireBytes(WireFormat f, size_t n);

// Largest |x[i]| (0 for n == 0); NaN if any element is NaN, inf if any is inf.
float maxAbs(const float* x, size_t n);

// wire <- encode(src [+ err]); updates err when non-null. `exp` is ignored for kSign.
void encode(WireFormat f, int exp, const float* src, float* err, size_t n, void* wire);

// dst = decode(wire).
void decode(WireFormat f, int exp, const void* wire, size_t n, float* dst);

// dst = decode(wire) + localScale * local  (float ops: one multiply unless
// localScale == 1, then one add). dst may alias local.
void decodeAdd(WireFormat f, int exp, const void* wire, size_t n, const float* local,
               float localScale, float* dst);

// Rounds through the codec without producing wire bytes:
// c = src * srcScale (+ err); dst = decode(encode(c)); err = c - dst when
// non-null. srcScale == 1 multiplies nothing. dst may alias src.
void quantize(WireFormat f, int exp, const float* src, float srcScale, float* err, size_t n,
              float* dst);

}  // namespace tutti::cpu
