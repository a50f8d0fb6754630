// The activations of a GGUF GEMM, quantized once per call (linear.cpp) and read by every
// thread: int8 per row and group of 32 k, as llama.cpp quantizes what it multiplies its
// quantized types by. The 32-weight types take a scale per 32 (its q8_0: avx2::quantize_row_q8);
// the K-quants one scale per 256 k (its q8_K), shared by the span's 8 groups, so that a file's
// numbers are the numbers llama.cpp computes (Gemma 3 270M Q4_K_M: perplexity next to its).
#pragma once

#include <cstdint>

#include "../avx2/q8_gemm.h"
#include "blocks.h"

namespace cadence_kernels {
namespace gguf {

constexpr int64_t KQUANT_SPAN = 256;

// Whether weights of `type` multiply activations quantized per 256 k (llama.cpp's q8_K: every
// 256-weight type, Q2_K .. Q6_K and IQ4_XS) rather than per 32 (its q8_0).
inline bool shares_scale_per_256(int type) { return block_size(type).elements == KQUANT_SPAN; }

// Whether they also read the rows' exact byte sums per 16 k (GemmArgs::half_sums): repacked Q6_K
// and Q3_K (their q - 32 and q - 4 offsets per 16 k) and Q2_K (its minimums per 16 k).
inline bool reads_half_sums(int type, bool packed) { return ((type == Q6_K || type == Q3_K) && packed) || type == Q2_K; }

#if CADENCE_HAVE_AVX2

// One row of K floats (K a multiple of 256) -> q, |q|, and per group of 32 the span's scale
// (amax of the 256 / 127), scale * sum of the group's q, and that sum itself (group_sum). Round half
// to even (_mm256_cvtps_epi32 in the default rounding mode), |q| <= 127.
inline void quantize_row_q8_per_256(const float* x, int64_t K, int8_t* q, uint8_t* mag, float* scale, float* sum,
                                    int16_t* group_sum) {
  constexpr int64_t G = avx2::Q8_GROUP;
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  for (int64_t s = 0; s < K / KQUANT_SPAN; ++s) {
    const float* xs = x + s * KQUANT_SPAN;
    __m256 amax = _mm256_setzero_ps();
    for (int64_t i = 0; i < KQUANT_SPAN; i += 8) amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_bit, _mm256_loadu_ps(xs + i)));
    const float m = avx2::hmax(amax);
    const __m256 inv = _mm256_set1_ps(m > 0.0f ? 127.0f / m : 0.0f);
    const float span_scale = m / 127.0f;
    for (int64_t j = 0; j < KQUANT_SPAN / G; ++j) {
      const int64_t at = s * KQUANT_SPAN + j * G, group = at / G;
      __m256i r[4];
      for (int i = 0; i < 4; ++i) r[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + at + 8 * i), inv));
      // 32 int32 -> 32 int8 in order (the packs interleave 128-bit lanes; the permute undoes it).
      const __m256i bytes = _mm256_permutevar8x32_epi32(
          _mm256_packs_epi16(_mm256_packs_epi32(r[0], r[1]), _mm256_packs_epi32(r[2], r[3])), order);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + at), bytes);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(mag + at), _mm256_abs_epi8(bytes));
      // The group's sum of q, exact in float32 (|sum| <= 32 * 127).
      const __m256i quads = _mm256_madd_epi16(_mm256_maddubs_epi16(ones8, bytes), ones16);
      const float q_sum = avx2::hsum(_mm256_cvtepi32_ps(quads));
      scale[group] = span_scale;
      sum[group] = span_scale * q_sum;
      group_sum[group] = static_cast<int16_t>(q_sum);
    }
  }
}

// half_sums[i] = the sum of the 16 bytes q[16 i .. 16 i + 15] of xq (rows quantized per 256),
// for i in [first, last): rows [first, last) * (K / 16) of the [M][K / 16] sums.
inline void byte_sums_per_16(const avx2::QuantizedRows& xq, int64_t first, int64_t last, int32_t* half_sums) {
  for (int64_t i = first; i < last; ++i) {
    int32_t s = 0;
    for (int t = 0; t < 16; ++t) s += xq.q[i * 16 + t];
    half_sums[i] = s;
  }
}

#endif  // CADENCE_HAVE_AVX2

}  // namespace gguf
}  // namespace cadence_kernels
