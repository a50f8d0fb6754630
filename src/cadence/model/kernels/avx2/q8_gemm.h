// int8 weights x int8 activations with integer dot products (the AVX2 tier's int8 format, as
// llama.cpp's Q8_0 x Q8_0): an activation row is quantized per group of 32 k (symmetric, scale
// amax / 127, round to nearest even), and each group's dot products are exact int32 sums of
// x_q * w_q (maddubs on |x_q| and w_q carrying x_q's sign, then madd into 32 bits), scaled once
// per group by x_scale * w_scale into the float32 result.
//
// Why: widening int8 weights to float32 costs a widen, a convert and an FMA per 8 weights, and
// made the M = 1 GEMM compute-bound at about a third of memory speed; the integer path does 32
// multiply-adds in 4 instructions (2 with AVX512-VNNI's vpdpbusd). Integer sums are exact, so any tiling, batch or thread split
// gives the same bits (greedy decoding stays batch-invariant). The torch paths of an int8 model
// quantize their GEMM inputs with the same function (quantize_rows_q8 through
// `quantize_activations_q8`), so prefill and decode compute the same products up to float
// summation order.
//
// Weight layout (pack_weight_f32, format 2): per block of 16 columns, [K / 4][16][4] int8 (each
// column's 4 consecutive k side by side, so a 32-byte load holds 8 columns x 4 k, one maddubs
// operand); scales [blocks][K / 32][16] float32.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "vec8.h"

namespace cadence_kernels {
namespace avx2 {

#if CADENCE_HAVE_AVX2

constexpr int64_t Q8_GROUP = 32;

// M rows of activations quantized per group of 32: q (int8), |q| (uint8), scale per group, and
// scale * sum(q) per group (the int4 format's min term, q4_gemm.h).
struct QuantizedRows {
  std::vector<int8_t> q;
  std::vector<uint8_t> mag;
  std::vector<float> scale;
  std::vector<float> sum;
  // Per group of 32 k the exact sum of q (|sum| <= 32 * 127), where the quantizer writes it (the
  // K-quants' per-256 rows, gguf/quantize.h): the Q4_K octet tiles (every tier) take their
  // minimums' terms in integers from it.
  std::vector<int16_t> group_sum;
  int64_t K = 0;

  const int8_t* q_at(int64_t row, int64_t k) const { return q.data() + row * K + k; }
  const uint8_t* mag_at(int64_t row, int64_t k) const { return mag.data() + row * K + k; }
  float scale_at(int64_t row, int64_t g) const { return scale[row * (K / Q8_GROUP) + g]; }
  float sum_at(int64_t row, int64_t g) const { return sum[row * (K / Q8_GROUP) + g]; }
};

// One row of K floats (K a multiple of 32) -> q, |q| and K / 32 scales (and, when `sum` is given,
// scale * sum of q per group).
inline void quantize_row_q8(const float* x, int64_t K, int8_t* q, uint8_t* mag, float* scale,
                            float* sum = nullptr) {
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t g = 0; g < K / Q8_GROUP; ++g) {
    const float* xg = x + g * Q8_GROUP;
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int i = 0; i < 4; ++i) {
      v[i] = _mm256_loadu_ps(xg + 8 * i);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_bit, v[i]));
    }
    const float m = hmax(amax);
    scale[g] = m / 127.0f;
    const __m256 inv = _mm256_set1_ps(m > 0.0f ? 127.0f / m : 0.0f);
    __m256i r[4];
    for (int i = 0; i < 4; ++i) r[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));  // |r| <= 127
    // 32 int32 -> 32 int8 in order (the packs interleave 128-bit lanes; the permute undoes it).
    const __m256i w01 = _mm256_packs_epi32(r[0], r[1]);
    const __m256i w23 = _mm256_packs_epi32(r[2], r[3]);
    const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(w01, w23), order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + g * Q8_GROUP), bytes);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(mag + g * Q8_GROUP), _mm256_abs_epi8(bytes));
    if (sum != nullptr) {
      // sum of 32 int8: maddubs with ones (u8 x s8 pairs) then madd into int32 lanes.
      const __m256i pairs = _mm256_maddubs_epi16(_mm256_set1_epi8(1), bytes);
      const __m256i quads = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
      sum[g] = scale[g] * hsum(_mm256_cvtepi32_ps(quads));
    }
  }
}

inline void quantize_rows_q8(const float* x, int64_t ldx, int64_t M, int64_t K, QuantizedRows& out) {
  out.K = K;
  out.q.resize(static_cast<size_t>(M * K));
  out.mag.resize(static_cast<size_t>(M * K));
  out.scale.resize(static_cast<size_t>(M * (K / Q8_GROUP)));
  out.sum.resize(static_cast<size_t>(M * (K / Q8_GROUP)));
  for (int64_t m = 0; m < M; ++m)
    quantize_row_q8(x + m * ldx, K, out.q.data() + m * K, out.mag.data() + m * K,
                    out.scale.data() + m * (K / Q8_GROUP), out.sum.data() + m * (K / Q8_GROUP));
}

inline __m256i broadcast4(const void* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return _mm256_set1_epi32(v);
}

// acc + x_q . w_q over 4 k for 8 columns: w8 holds the 8 columns' 4 k each, xq / xmag the row's
// 4 k repeated in every 32-bit lane. |x_q| * (w_q with x_q's sign) is x_q * w_q; a pair of them
// stays within int16 (2 * 127 * 127 < 32767), so maddubs never saturates and both forms below
// give the same exact sums (the AVX-512 tiers with VNNI build the second: one instruction).
inline __m256i dot4_add(__m256i acc, __m256i xmag, __m256i xq, __m256i w8, __m256i ones16) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  (void)ones16;
  return _mm256_dpbusd_epi32(acc, xmag, _mm256_sign_epi8(w8, xq));
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(xmag, _mm256_sign_epi8(w8, xq)), ones16));
#endif
}

// acc[r][2 * b + h]: row m0 + r, columns (block b0 + b) * 16 + h * 8 + [0, 8), as gemm_tile.
// blocks: the packed int8 data of block 0; scales: its scales (block stride K * 16 / (K / 32) * 16).
template <int MR, int NB, int ACC_COLS>
inline void gemm_tile_q8(const QuantizedRows& xq, int64_t m0, const int8_t* data, const float* scales, int64_t K,
                         int64_t b0, __m256 acc[][ACC_COLS]) {
  const int8_t* blocks[NB];
  const float* block_scales[NB];
  for (int b = 0; b < NB; ++b) {
    blocks[b] = data + (b0 + b) * K * 16;
    block_scales[b] = scales + (b0 + b) * (K / Q8_GROUP) * 16;
  }
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < 2 * NB; ++c) acc[r][c] = _mm256_setzero_ps();
  const __m256i ones16 = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < K / Q8_GROUP; ++g) {
    __m256i sums[MR][2 * NB];
    for (int r = 0; r < MR; ++r)
      for (int c = 0; c < 2 * NB; ++c) sums[r][c] = _mm256_setzero_si256();
    for (int64_t k = g * Q8_GROUP; k < (g + 1) * Q8_GROUP; k += 4) {
      if constexpr (MR == 1) {
        // Each block's pair used at once (few registers left beside 2 * NB sums).
        const __m256i xm = broadcast4(xq.mag_at(m0, k)), xs = broadcast4(xq.q_at(m0, k));
        for (int b = 0; b < NB; ++b) {
          const __m256i* p = reinterpret_cast<const __m256i*>(blocks[b] + k * 16);
          sums[0][2 * b] = dot4_add(sums[0][2 * b], xm, xs, _mm256_loadu_si256(p), ones16);
          sums[0][2 * b + 1] = dot4_add(sums[0][2 * b + 1], xm, xs, _mm256_loadu_si256(p + 1), ones16);
        }
      } else {
        __m256i wv[2 * NB];
        for (int b = 0; b < NB; ++b) {
          const __m256i* p = reinterpret_cast<const __m256i*>(blocks[b] + k * 16);
          wv[2 * b] = _mm256_loadu_si256(p);
          wv[2 * b + 1] = _mm256_loadu_si256(p + 1);
        }
        for (int r = 0; r < MR; ++r) {
          const __m256i xm = broadcast4(xq.mag_at(m0 + r, k)), xs = broadcast4(xq.q_at(m0 + r, k));
          for (int c = 0; c < 2 * NB; ++c) sums[r][c] = dot4_add(sums[r][c], xm, xs, wv[c], ones16);
        }
      }
    }
    for (int b = 0; b < NB; ++b) {
      const float* s = block_scales[b] + g * 16;
      const __m256 s0 = _mm256_loadu_ps(s), s1 = _mm256_loadu_ps(s + 8);
      for (int r = 0; r < MR; ++r) {
        const __m256 xscale = _mm256_set1_ps(xq.scale_at(m0 + r, g));
        acc[r][2 * b] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[r][2 * b]), _mm256_mul_ps(s0, xscale), acc[r][2 * b]);
        acc[r][2 * b + 1] =
            _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[r][2 * b + 1]), _mm256_mul_ps(s1, xscale), acc[r][2 * b + 1]);
      }
    }
  }
}

#endif  // CADENCE_HAVE_AVX2

}  // namespace avx2
}  // namespace cadence_kernels
