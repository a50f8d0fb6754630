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
//   w = a_j * (u[k] - C::OFFSET) + b_j   (C::HALF_SCALES: a per 16 k, a[2j] for k < 16, a[2j + 1] after;
//                                         C::HALF_MINS: b per 16 k likewise)
// with u[k] the unsigned bytes C::quants(blk, j) returns (a signed type's values shifted up by
// OFFSET: unsigned x signed bytes is what maddubs and vpdpbusd multiply, and the OFFSET * sum(x)
// term is the same for every column, so a kernel computes it once per row and group).
// C::scales(blk, a, b) fills a[GROUPS] (a[2 * GROUPS] with HALF_SCALES) and, with C::HAS_MIN,
// b[GROUPS] (b[2 * GROUPS] with HALF_MINS). All groups are 32 k, so one activation scale per 32 k
// serves every type.
#pragma once

#include <cstdint>
#include <cstring>

#include "../avx2/vec8.h"

namespace cadence_kernels {
namespace gguf {

// ggml_type ids as GGUF files store them (gguf.GGMLQuantizationType).
enum GGMLType : int {
  F32 = 0, F16 = 1, Q4_0 = 2, Q4_1 = 3, Q5_0 = 6, Q5_1 = 7, Q8_0 = 8,
  Q2_K = 10, Q3_K = 11, Q4_K = 12, Q5_K = 13, Q6_K = 14, IQ4_NL = 20, IQ4_XS = 23, BF16 = 30,
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
    case Q2_K: return {256, 84};
    case Q3_K: return {256, 110};
    case Q4_K: return {256, 144};
    case Q5_K: return {256, 176};
    case Q6_K: return {256, 210};
    case IQ4_XS: return {256, 136};
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
  static constexpr bool HAS_MIN = false, HALF_SCALES = false, HALF_MINS = false;
  static void scales(const uint8_t* blk, float* a, float*) { a[0] = half_at(blk); }
  static __m256i quants(const uint8_t* blk, int) {  // q + 128 = q with its top bit flipped
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2)), _mm256_set1_epi8(-128));
  }
};

// Q4_0: fp16 d, 16 bytes of nibbles: w = d * (nibble - 8).
struct CodecQ4_0 {
  static constexpr int64_t QK = 32, BYTES = 18, GROUPS = 1;
  static constexpr int OFFSET = 8;
  static constexpr bool HAS_MIN = false, HALF_SCALES = false, HALF_MINS = false;
  static void scales(const uint8_t* blk, float* a, float*) { a[0] = half_at(blk); }
  static __m256i quants(const uint8_t* blk, int) { return split_nibbles16(blk + 2); }
};

// Q4_1: fp16 d, fp16 m, 16 bytes of nibbles: w = d * nibble + m.
struct CodecQ4_1 {
  static constexpr int64_t QK = 32, BYTES = 20, GROUPS = 1;
  static constexpr int OFFSET = 0;
  static constexpr bool HAS_MIN = true, HALF_SCALES = false, HALF_MINS = false;
  static void scales(const uint8_t* blk, float* a, float* b) { a[0] = half_at(blk), b[0] = half_at(blk + 2); }
  static __m256i quants(const uint8_t* blk, int) { return split_nibbles16(blk + 4); }
};

// Q5_0: fp16 d, 32 high bits (uint32 qh, bit k), 16 bytes of low nibbles: w = d * (q5 - 16).
struct CodecQ5_0 {
  static constexpr int64_t QK = 32, BYTES = 22, GROUPS = 1;
  static constexpr int OFFSET = 16;
  static constexpr bool HAS_MIN = false, HALF_SCALES = false, HALF_MINS = false;
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
  static constexpr bool HAS_MIN = true, HALF_SCALES = false, HALF_MINS = false;
  static void scales(const uint8_t* blk, float* a, float* b) { a[0] = half_at(blk), b[0] = half_at(blk + 2); }
  static __m256i quants(const uint8_t* blk, int) {
    const __m256i high = _mm256_and_si256(bits_to_bytes(u32_at(blk + 4)), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(split_nibbles16(blk + 8), high);
  }
};

// 32 nibbles -> IQ4_NL's (and IQ4_XS's) non-linear values + 128, as unsigned bytes.
inline __m256i iq4_values(__m256i nibbles) {
  // The table {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113} + 128.
  const __m256i table = _mm256_setr_epi8(1, 24, 45, 63, 79, 93, 106, 118, -127, -115, -103, -90, -75, -59, -39, -15,
                                         1, 24, 45, 63, 79, 93, 106, 118, -127, -115, -103, -90, -75, -59, -39, -15);
  return _mm256_shuffle_epi8(table, nibbles);
}

// IQ4_NL: fp16 d, 16 bytes of nibbles indexing a fixed non-linear table: w = d * table[nibble].
struct CodecIQ4_NL {
  static constexpr int64_t QK = 32, BYTES = 18, GROUPS = 1;
  static constexpr int OFFSET = 128;
  static constexpr bool HAS_MIN = false, HALF_SCALES = false, HALF_MINS = false;
  static void scales(const uint8_t* blk, float* a, float*) { a[0] = half_at(blk); }
  static __m256i quants(const uint8_t* blk, int) { return iq4_values(split_nibbles16(blk + 2)); }
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
  static constexpr bool HAS_MIN = true, HALF_SCALES = false, HALF_MINS = false;
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
  static constexpr bool HAS_MIN = true, HALF_SCALES = false, HALF_MINS = false;
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
  static constexpr bool HAS_MIN = false, HALF_SCALES = true, HALF_MINS = false;
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

// Bits [2t, 2t + 2) of each of 32 bytes at p: the 2-bit quants of Q2_K / Q3_K (group j = 4h + t
// reads bytes [32h, 32h + 32) of the block's 64 at its quarter t).
inline __m256i crumbs32(const uint8_t* p, int t) {
  const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm256_and_si256(_mm256_srl_epi16(bytes, _mm_cvtsi32_si128(2 * t)), _mm256_set1_epi8(3));
}

// Q3_K: 256 weights: 32 bytes hmask (bit j of hmask[l]: the third bit of element l of group j),
// 64 bytes of 2-bit quants, 12 bytes of 16 6-bit scales, fp16 d last. Group j = 4h + t: low bits
// from qs[32h + l] >> 2t; w = (d * (scale[2j + (l >= 16)] - 32)) * (q3 - 4), q3 = low | high << 2.
// The scales: the low 4 bits of scale i from byte i % 8 (its high nibble when i >= 8), the top 2
// from byte 8 + i % 4 at bit 2 * (i / 4): unpacked 4 scales per 32-bit word.
struct CodecQ3_K {
  static constexpr int64_t QK = 256, BYTES = 110, GROUPS = 8;
  static constexpr int OFFSET = 4;
  static constexpr bool HAS_MIN = false, HALF_SCALES = true, HALF_MINS = false;
  static void scales(const uint8_t* blk, float* a, float*) {
    const uint32_t w0 = u32_at(blk + 96), w1 = u32_at(blk + 100), w2 = u32_at(blk + 104);
    const uint32_t low4 = 0x0f0f0f0fu, low2 = 0x03030303u;
    const __m128i sc = _mm_setr_epi32(static_cast<int>((w0 & low4) | ((w2 & low2) << 4)),
                                      static_cast<int>((w1 & low4) | (((w2 >> 2) & low2) << 4)),
                                      static_cast<int>(((w0 >> 4) & low4) | (((w2 >> 4) & low2) << 4)),
                                      static_cast<int>(((w1 >> 4) & low4) | (((w2 >> 6) & low2) << 4)));
    const __m128i centred = _mm_sub_epi8(sc, _mm_set1_epi8(32));  // in [-32, 31]
    const __m256 d = _mm256_set1_ps(half_at(blk + 108));
    _mm256_storeu_ps(a, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(centred))));
    _mm256_storeu_ps(a + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(centred, 8)))));
  }
  static __m256i quants(const uint8_t* blk, int j) {
    const __m256i low = crumbs32(blk + 32 + 32 * (j / 4), j % 4);
    const __m256i hm = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk));
    const __m256i bit = _mm256_set1_epi8(static_cast<char>(1 << j));
    const __m256i high = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit), _mm256_set1_epi8(4));
    return _mm256_or_si256(low, high);
  }
};

// Q2_K: 256 weights: 16 bytes of (4-bit scale | 4-bit min << 4), one per 16 weights, 64 bytes of
// 2-bit quants (Q3_K's order), fp16 d, fp16 dmin: w = (d * scale_i) * q - (dmin * min_i) for the
// 16 weights i. The minimum changes every 16 k: HALF_MINS (b_i = -(dmin * min_i)).
struct CodecQ2_K {
  static constexpr int64_t QK = 256, BYTES = 84, GROUPS = 8;
  static constexpr int OFFSET = 0;
  static constexpr bool HAS_MIN = true, HALF_SCALES = true, HALF_MINS = true;
  static void scales(const uint8_t* blk, float* a, float* b) {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk));
    const __m128i sc = _mm_and_si128(packed, _mm_set1_epi8(0x0F));
    const __m128i mn = _mm_and_si128(_mm_srli_epi16(packed, 4), _mm_set1_epi8(0x0F));
    const __m256 d = _mm256_set1_ps(half_at(blk + 80)), neg_dmin = _mm256_set1_ps(-half_at(blk + 82));
    _mm256_storeu_ps(a, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(sc))));
    _mm256_storeu_ps(a + 8, _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(sc, 8)))));
    _mm256_storeu_ps(b, _mm256_mul_ps(neg_dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(mn))));
    _mm256_storeu_ps(b + 8, _mm256_mul_ps(neg_dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(mn, 8)))));
  }
  static __m256i quants(const uint8_t* blk, int j) { return crumbs32(blk + 16 + 32 * (j / 4), j % 4); }
};

// IQ4_XS: 256 weights in 8 groups of 32: fp16 d, uint16 scales_h (2 high bits per group), 4 bytes
// scales_l (a nibble per group, low nibble for even j), 128 bytes of nibbles (16 per group, laid
// out as IQ4_NL's block): w = (d * (ls_j - 32)) * table[nibble], ls_j the 6-bit scale.
struct CodecIQ4_XS {
  static constexpr int64_t QK = 256, BYTES = 136, GROUPS = 8;
  static constexpr int OFFSET = 128;
  static constexpr bool HAS_MIN = false, HALF_SCALES = false, HALF_MINS = false;
  static void scales(const uint8_t* blk, float* a, float*) {
    uint16_t high;
    std::memcpy(&high, blk + 2, sizeof(high));
    // Lane j: nibble j of scales_l (4j bits up) and bits [2j, 2j + 2) of scales_h.
    const __m256i low = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(u32_at(blk + 4))),
                                                           _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                         _mm256_set1_epi32(0x0F));
    const __m256i top = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(high), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                                         _mm256_set1_epi32(3));
    const __m256i ls = _mm256_sub_epi32(_mm256_or_si256(low, _mm256_slli_epi32(top, 4)), _mm256_set1_epi32(32));
    _mm256_storeu_ps(a, _mm256_mul_ps(_mm256_set1_ps(half_at(blk)), _mm256_cvtepi32_ps(ls)));
  }
  static __m256i quants(const uint8_t* blk, int j) { return iq4_values(split_nibbles16(blk + 8 + 16 * j)); }
};

#endif  // CADENCE_HAVE_AVX2

}  // namespace gguf
}  // namespace cadence_kernels
