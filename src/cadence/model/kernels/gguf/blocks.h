// GGUF (ggml) weight blocks read as stored: the type ids, block sizes and, per quantized type,
// a codec that decodes one group of 32 weights of a block into 32 bytes in k order plus the
// group's float scale (and minimum), in AVX2 registers. No weight is ever widened to a float
// array: the kernels (int_gemm.h) multiply these bytes with int8-quantized activations.
//
// Every type is decoded from its own block layout (gguf-py's `gguf.quants` dequantize is the
// reference the tests hold these to), so a GGUF tensor is used as the file stores it: a
// memory-mapped tensor is computed on in place, with no copy at all.
//
// A codec C describes w[k] for the 32 k of group j of a block at `blk` as
//   w = a_j * (u[k] - C::OFFSET) + b_j   (C::HALF_SCALES: a per 16 k, a[2j] for k < 16, a[2j + 1] after)
// with u[k] the unsigned bytes C::quants(blk, j) returns (a signed type's values shifted up by
// OFFSET: unsigned x signed bytes is what maddubs and vpdpbusd multiply, and the OFFSET * sum(x)
// term is the same for every column, so a kernel computes it once per row and group).
// C::scales(blk, a, b) fills a[GROUPS] (a[2 * GROUPS] with HALF_SCALES) and, with C::HAS_MIN,
// b[GROUPS]. All groups are 32 k, so one activation scale per 32 k serves every type.
#pragma once

#include <cstdint>
#include <cstring>

#include "../avx2/vec8.h"

namespace cadence_kernels {
namespace gguf {

// ggml_type ids as GGUF files store them (gguf.GGMLQuantizationType).
enum GGMLType : int {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8,
  Q4_K = 12, Q5_K = 13, Q6_K = 14, IQ4_NL = 20, BF16 = 30,
};

// (elements per block, bytes per block) of a supported type; {0, 0} for any other.
struct BlockSize {
  int64_t elements, bytes;
};
inline BlockSize block_size(int type) {
  switch (type) {
    case F32: return {1, 4};
    case F16: return {1, 2};
    case BF16: return {1, 2};
    case Q4_0: return {32, 18};
    case Q4_1: return {32, 20};
    case Q5_0: return {32, 22};
    case Q5_1: return {32, 24};
    case Q8_0: return {32, 34};
    case IQ4_NL: return {32, 18};
    case Q4_K: return {256, 144};
    case Q5_K: return {256, 176};
    case Q6_K: return {256, 210};
    default: return {0, 0};
  }
}

#if CADENCE_HAVE_AVX2

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return _cvtsh_ss(h);
}

// 16 bytes -> 32 nibbles: the low nibbles (k 0..15), then the high ones (k 16..31): the layout
// of every 32-block type (Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL).
// One load into both 128-bit halves, the upper half shifted down 4 bits (64-bit lanes: the bits
// that cross a byte boundary are masked off), one mask.
inline __m256i split_nibbles16(const uint8_t* qs) {
  const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  return _mm256_and_si256(_mm256_srlv_epi64(both, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0F));
}

// Bit i of `bits` -> byte i (0xFF where set, 0 elsewhere), i in [0, 32).
inline __m256i bits_to_bytes(uint32_t bits) {
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                       2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
  return _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
}

inline uint32_t u32_at(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Q8_0: fp16 d, 32 int8: w = d * q.
struct CodecQ8_0 {
  static constexpr int64_t QK = 32, BYTES = 34, GROUPS = 1;
  static constexpr int OFFSET = 128;
  static constexpr bool HAS_MIN = false, HALF_SCALES = false;
  static void scales(const uint8_t* blk, float* a, float*) { a[0] = half_at(blk); }
  static __m256i quants(const uint8_t* blk, int) {  // q + 128 = q with its top bit flipped
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2)), _mm256_set1_epi8(-128));
  }
};

// Q4_0: fp16 d, 16 bytes of nibbles: w = d * (nibble - 8).
struct CodecQ4_0 {
  static constexpr int64_t QK = 32, BYTES = 18, GROUPS = 1;
  static constexpr int OFFSET = 8;
  static constexpr bool HAS_MIN = false, HALF_SCALES = false;
  static void scales(const uint8_t* blk, float* a, float*) { a[0] = half_at(blk); }
  static __m256i quants(const uint8_t* blk, int) { return split_nibbles16(blk + 2); }
};

// Q4_1: fp16 d, fp16 m, 16 bytes of nibbles: w = d * nibble + m.
struct CodecQ4_1 {
  static constexpr int64_t QK = 32, BYTES = 20, GROUPS = 1;
  static constexpr int OFFSET = 0;
  static constexpr bool HAS_MIN = true, HALF_SCALES = false;
  static void scales(const uint8_t* blk, float* a, float* b) { a[0] = half_at(blk), b[0] = half_at(blk + 2); }
  static __m256i quants(const uint8_t* blk, int) { return split_nibbles16(blk + 4); }
};

// Q5_0: fp16 d, 32 high bits (uint32 qh, bit k), 16 bytes of low nibbles: w = d * (q5 - 16).
struct CodecQ5_0 {
  static constexpr int64_t QK = 32, BYTES = 22, GROUPS = 1;
  static constexpr int OFFSET = 16;
  static constexpr bool HAS_MIN = false, HALF_SCALES = false;
  static void scales(const uint8_t* blk, float* a, float*) { a[0] = half_at(blk); }
  static __m256i quants(const uint8_t* blk, int) {
    const __m256i high = _mm256_and_si256(bits_to_bytes(u32_at(blk + 2)), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(split_nibbles16(blk + 6), high);
  }
};

// Q5_1: fp16 d, fp16 m, uint32 qh, 16 bytes of low nibbles: w = d * q5 + m.
struct CodecQ5_1 {
  static constexpr int64_t QK = 32, BYTES = 24, GROUPS = 1;
  static constexpr int OFFSET = 0;
  static constexpr bool HAS_MIN = true, HALF_SCALES = false;
  static void scales(const uint8_t* blk, float* a, float* b) { a[0] = half_at(blk), b[0] = half_at(blk + 2); }
  static __m256i quants(const uint8_t* blk, int) {
    const __m256i high = _mm256_and_si256(bits_to_bytes(u32_at(blk + 4)), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(split_nibbles16(blk + 8), high);
  }
};

// IQ4_NL: fp16 d, 16 bytes of nibbles indexing a fixed non-linear table: w = d * table[nibble].
struct CodecIQ4_NL {
  static constexpr int64_t QK = 32, BYTES = 18, GROUPS = 1;
  static constexpr int OFFSET = 128;
  static constexpr bool HAS_MIN = false, HALF_SCALES = false;
  static void scales(const uint8_t* blk, float* a, float*) { a[0] = half_at(blk); }
  static __m256i quants(const uint8_t* blk, int) {
    // The table {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113} + 128.
    const __m256i table = _mm256_setr_epi8(1, 24, 45, 63, 79, 93, 106, 118, -127, -115, -103, -90, -75, -59, -39, -15,
                                           1, 24, 45, 63, 79, 93, 106, 118, -127, -115, -103, -90, -75, -59, -39, -15);
    return _mm256_shuffle_epi8(table, split_nibbles16(blk + 2));
  }
};

// The 8 6-bit scales and 8 minimums of a Q4_K / Q5_K block's 12 scale bytes s, as floats times
// d and -dmin. Sub-block j < 4: scale s[j] & 63, min s[j + 4] & 63; j >= 4: the low 4 bits of
// s[j + 4] (scale) and its high 4 (min), with 2 more high bits each from the top of s[j - 4]
// (scale) and s[j] (min): unpacked 4 bytes at a time in 32-bit words.
inline void kquant_scales(const uint8_t* s, float d, float dmin, float* a, float* b) {
  const uint32_t w0 = u32_at(s), w1 = u32_at(s + 4), w2 = u32_at(s + 8);
  const uint32_t low6 = 0x3f3f3f3fu, low4 = 0x0f0f0f0fu, low2 = 0x03030303u;
  const uint64_t scales = (w0 & low6) | static_cast<uint64_t>((w2 & low4) | (((w0 >> 6) & low2) << 4)) << 32;
  const uint64_t mins = (w1 & low6) | static_cast<uint64_t>(((w2 >> 4) & low4) | (((w1 >> 6) & low2) << 4)) << 32;
  const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(scales))));
  const __m256 mn = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<long long>(mins))));
  _mm256_storeu_ps(a, _mm256_mul_ps(_mm256_set1_ps(d), sc));
  _mm256_storeu_ps(b, _mm256_mul_ps(_mm256_set1_ps(-dmin), mn));
}

// Q4_K: 256 weights in 8 groups of 32: fp16 d, fp16 dmin, 12 bytes of 6-bit (scale, min) pairs,
// 128 bytes of nibbles (bytes [32i, 32i + 32): group 2i in the low nibbles, 2i + 1 in the high):
// w = (d * scale_j) * q - (dmin * min_j) (b_j = -(dmin * min_j)).
struct CodecQ4_K {
  static constexpr int64_t QK = 256, BYTES = 144, GROUPS = 8;
  static constexpr int OFFSET = 0;
  static constexpr bool HAS_MIN = true, HALF_SCALES = false;
  static void scales(const uint8_t* blk, float* a, float* b) { kquant_scales(blk + 4, half_at(blk), half_at(blk + 2), a, b); }
  static __m256i quants(const uint8_t* blk, int j) {
    const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16 + 32 * (j / 2)));
    return _mm256_and_si256(j % 2 ? _mm256_srli_epi16(bytes, 4) : bytes, _mm256_set1_epi8(0x0F));
  }
};

// Q5_K: as Q4_K plus 32 bytes qh after the scales (bit j of qh[l]: the fifth bit of element l of
// group j), nibbles after them: w = (d * scale_j) * q5 - (dmin * min_j).
struct CodecQ5_K {
  static constexpr int64_t QK = 256, BYTES = 176, GROUPS = 8;
  static constexpr int OFFSET = 0;
  static constexpr bool HAS_MIN = true, HALF_SCALES = false;
  static void scales(const uint8_t* blk, float* a, float* b) { CodecQ4_K::scales(blk, a, b); }
  static __m256i quants(const uint8_t* blk, int j) {
    const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 48 + 32 * (j / 2)));
    const __m256i low = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(bytes, 4) : bytes, _mm256_set1_epi8(0x0F));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 16));
    const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << j));
    const __m256i high = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, bit), bit), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(low, high);
  }
};

// Q6_K: 256 weights: 128 bytes ql (low nibbles), 64 bytes qh (2 high bits each), 16 int8
// scales (one per 16 weights), fp16 d last. Group j = 4h + t (half h of 128, quarter t): low
// nibbles from ql[64h + 32 (t % 2) + l] (high nibble when t >= 2), high bits from
// qh[32h + l] >> 2t; w = (d * scale[2j + (l >= 16)]) * (q6 - 32).
struct CodecQ6_K {
  static constexpr int64_t QK = 256, BYTES = 210, GROUPS = 8;
  static constexpr int OFFSET = 32;
  static constexpr bool HAS_MIN = false, HALF_SCALES = true;
  static void scales(const uint8_t* blk, float* a, float*) {
    const __m256 d = _mm256_set1_ps(half_at(blk + 208));
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192));
    _mm256_storeu_ps(a, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
    _mm256_storeu_ps(a + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)))));
  }
  static __m256i quants(const uint8_t* blk, int j) {
    const int h = j / 4, t = j % 4;
    const __m256i ql = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 64 * h + 32 * (t % 2)));
    const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 128 + 32 * h));
    const __m256i low = _mm256_and_si256(t >= 2 ? _mm256_srli_epi16(ql, 4) : ql, _mm256_set1_epi8(0x0F));
    const __m256i high = _mm256_and_si256(_mm256_slli_epi16(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * t)), 4),
                                          _mm256_set1_epi8(0x30));
    return _mm256_or_si256(low, high);
  }
};

#endif  // CADENCE_HAVE_AVX2

}  // namespace gguf
}  // namespace cadence_kernels
