// int4 weights x int8 activations with integer dot products (the float32 tiers' int4 format, as
// GGUF's Q4_1 x Q8 in llama.cpp): a weight is w = d * q + m with q in [0, 15] and d, m float16
// per column and group of 32 k (asymmetric: m is the group's minimum, d its range / 15; a Q4_1
// GGUF's own groups come back exactly). Activations are quantized as for int8 (q8_gemm.h), so
//   sum_k w x = d * x_scale * sum_k q * x_q + m * (x_scale * sum_k x_q)
// with exact int32 sums of q * x_q: q is unsigned, x_q signed, which is what maddubs (and
// AVX512-VNNI's vpdpbusd) multiply, with no sign trick (pairs stay within int16: 2 * 15 * 127).
//
// Why: a decode step streams every weight once; at 4 bits plus 4 bytes of (d, m) per 32 weights
// it streams 0.625 bytes a weight against int8's 1.125.
//
// Layout (pack_weight_f32, format 3): per block of 16 columns, [K / 8][16][4] bytes, byte
// (column i, j) of k-octet o holding q[8o + j] in its low nibble and q[8o + 4 + j] in its high
// one (a 32-byte load: 8 columns x 8 k); scales [blocks][K / 32][2][16] float16 (d of the 16
// columns, then m).
#pragma once

#include <cstdint>

#include "q8_gemm.h"

namespace cadence_kernels {
namespace avx2 {

#if CADENCE_HAVE_AVX2

// acc + u . s over 4 bytes per 32-bit lane, u unsigned, s signed.
inline __m256i udot4_add(__m256i acc, __m256i u, __m256i s, __m256i ones16) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  (void)ones16;
  return _mm256_dpbusd_epi32(acc, u, s);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), ones16));
#endif
}

inline __m256 load_half8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// acc[r][2 * b + h]: row m0 + r, columns (block b0 + b) * 16 + h * 8 + [0, 8), as gemm_tile_q8.
template <int MR, int NB, int ACC_COLS>
inline void gemm_tile_q4(const QuantizedRows& xq, int64_t m0, const uint8_t* data, const uint16_t* scales,
                         int64_t K, int64_t b0, __m256 acc[][ACC_COLS]) {
  const uint8_t* blocks[NB];
  const uint16_t* block_scales[NB];
  for (int b = 0; b < NB; ++b) {
    blocks[b] = data + (b0 + b) * K * 8;
    block_scales[b] = scales + (b0 + b) * (K / Q8_GROUP) * 32;
  }
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < 2 * NB; ++c) acc[r][c] = _mm256_setzero_ps();
  const __m256i ones16 = _mm256_set1_epi16(1);
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  for (int64_t g = 0; g < K / Q8_GROUP; ++g) {
    __m256i sums[MR][2 * NB];
    for (int r = 0; r < MR; ++r)
      for (int c = 0; c < 2 * NB; ++c) sums[r][c] = _mm256_setzero_si256();
    for (int64_t k = g * Q8_GROUP; k < (g + 1) * Q8_GROUP; k += 8) {
      if constexpr (MR == 1) {
        const __m256i xlo = broadcast4(xq.q_at(m0, k)), xhi = broadcast4(xq.q_at(m0, k + 4));
        for (int b = 0; b < NB; ++b) {
          const __m256i* p = reinterpret_cast<const __m256i*>(blocks[b] + k * 8);
          const __m256i v0 = _mm256_loadu_si256(p), v1 = _mm256_loadu_si256(p + 1);
          sums[0][2 * b] = udot4_add(sums[0][2 * b], _mm256_and_si256(v0, low4), xlo, ones16);
          sums[0][2 * b] = udot4_add(sums[0][2 * b], _mm256_and_si256(_mm256_srli_epi16(v0, 4), low4), xhi, ones16);
          sums[0][2 * b + 1] = udot4_add(sums[0][2 * b + 1], _mm256_and_si256(v1, low4), xlo, ones16);
          sums[0][2 * b + 1] =
              udot4_add(sums[0][2 * b + 1], _mm256_and_si256(_mm256_srli_epi16(v1, 4), low4), xhi, ones16);
        }
      } else {
        static_assert(NB == 1, "int4 tiles of several rows take one block");
        const __m256i* p = reinterpret_cast<const __m256i*>(blocks[0] + k * 8);
        const __m256i v0 = _mm256_loadu_si256(p), v1 = _mm256_loadu_si256(p + 1);
        const __m256i lo0 = _mm256_and_si256(v0, low4), hi0 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), low4);
        const __m256i lo1 = _mm256_and_si256(v1, low4), hi1 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), low4);
        for (int r = 0; r < MR; ++r) {
          const __m256i xlo = broadcast4(xq.q_at(m0 + r, k)), xhi = broadcast4(xq.q_at(m0 + r, k + 4));
          sums[r][0] = udot4_add(udot4_add(sums[r][0], lo0, xlo, ones16), hi0, xhi, ones16);
          sums[r][1] = udot4_add(udot4_add(sums[r][1], lo1, xlo, ones16), hi1, xhi, ones16);
        }
      }
    }
    for (int b = 0; b < NB; ++b) {
      const uint16_t* s = block_scales[b] + g * 32;
      const __m256 d0 = load_half8(s), d1 = load_half8(s + 8), mn0 = load_half8(s + 16), mn1 = load_half8(s + 24);
      for (int r = 0; r < MR; ++r) {
        const __m256 xscale = _mm256_set1_ps(xq.scale_at(m0 + r, g));
        const __m256 xsum = _mm256_set1_ps(xq.sum_at(m0 + r, g));
        __m256& a0 = acc[r][2 * b];
        __m256& a1 = acc[r][2 * b + 1];
        a0 = _mm256_fmadd_ps(mn0, xsum, _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[r][2 * b]), _mm256_mul_ps(d0, xscale), a0));
        a1 = _mm256_fmadd_ps(mn1, xsum, _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[r][2 * b + 1]), _mm256_mul_ps(d1, xscale), a1));
      }
    }
  }
}

#endif  // CADENCE_HAVE_AVX2

}  // namespace avx2
}  // namespace cadence_kernels
