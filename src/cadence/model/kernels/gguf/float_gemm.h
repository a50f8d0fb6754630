// y[M, N] = x[M, K] @ W[N, K]^T for GGUF's float weight types read as stored (F32, F16, BF16:
// row n of W is K contiguous values), float32 compute: each loaded weight vector is widened in
// registers (F16C for F16, a shift for BF16) and used for R rows. On the avx512bf16 tier BF16
// weights multiply bf16-rounded activations with vdpbf16ps instead (the hardware's bf16 dot
// product, float32 sums: two multiply-adds per lane and instruction, no widening).
//
// K may be any length: the last K % lanes values are summed in scalar code (explicit fma: the
// same instructions for a row whatever the tile, so results do not depend on the batch).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "blocks.h"

namespace cadence_kernels {
namespace gguf {

#if CADENCE_HAVE_AVX2

inline float scalar_weight(int type, const uint8_t* row, int64_t k) {
  if (type == F32) {
    float v;
    std::memcpy(&v, row + 4 * k, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, row + 2 * k, 2);
  if (type == F16) return _cvtsh_ss(h);
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}

#if defined(__AVX512F__)
constexpr int64_t FLOAT_LANES = 16;
using fvec_t = __m512;
// 16 weights of `type` from p (element offset already applied), widened to float32.
template <int TYPE>
inline __m512 load_weights(const uint8_t* p) {
  if constexpr (TYPE == F32) return _mm512_loadu_ps(p);
  else if constexpr (TYPE == F16) return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  else return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
inline __m512 fzero() { return _mm512_setzero_ps(); }
inline __m512 fload(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 ffma(__m512 a, __m512 b, __m512 c) { return _mm512_fmadd_ps(a, b, c); }
inline float fsum(__m512 v) { return _mm512_reduce_add_ps(v); }
#else
constexpr int64_t FLOAT_LANES = 8;
using fvec_t = __m256;
template <int TYPE>
inline __m256 load_weights(const uint8_t* p) {
  if constexpr (TYPE == F32) return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
  else if constexpr (TYPE == F16) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  else return avx2::load_bf16(reinterpret_cast<const uint16_t*>(p));
}
inline __m256 fzero() { return _mm256_setzero_ps(); }
inline __m256 fload(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 ffma(__m256 a, __m256 b, __m256 c) { return _mm256_fmadd_ps(a, b, c); }
inline float fsum(__m256 v) { return avx2::hsum(v); }
#endif

constexpr int64_t type_bytes(int type) { return type == F32 ? 4 : 2; }

// R rows x NC columns: out[(m0 + r) * ldo + n0 + c].
template <int TYPE, int R, int NC>
void float_tile(const float* x, int64_t ldx, int64_t m0, const uint8_t* w, int64_t row_bytes, int64_t K,
                float* out, int64_t ldo, int64_t n0) {
  constexpr int64_t B = type_bytes(TYPE);
  fvec_t acc[R][NC];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NC; ++c) acc[r][c] = fzero();
  const int64_t k_vec = K / FLOAT_LANES * FLOAT_LANES;
  for (int64_t k = 0; k < k_vec; k += FLOAT_LANES) {
    fvec_t wv[NC];
    for (int c = 0; c < NC; ++c) wv[c] = load_weights<TYPE>(w + c * row_bytes + k * B);
    for (int r = 0; r < R; ++r) {
      const fvec_t xv = fload(x + (m0 + r) * ldx + k);
      for (int c = 0; c < NC; ++c) acc[r][c] = ffma(xv, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NC; ++c) {
      float s = fsum(acc[r][c]);
      for (int64_t k = k_vec; k < K; ++k) s = std::fma(x[(m0 + r) * ldx + k], scalar_weight(TYPE, w + c * row_bytes, k), s);
      out[(m0 + r) * ldo + n0 + c] = s;
    }
}

#if defined(__AVX512BF16__) && defined(__AVX512F__)
// BF16 weights x bf16-rounded activations (xb: [M][K] bf16 bits), vdpbf16ps over 32 k a step.
template <int R, int NC>
void bf16_dot_tile(const uint16_t* xb, int64_t m0, const uint8_t* w, int64_t row_bytes, int64_t K,
                   float* out, int64_t ldo, int64_t n0) {
  __m512 acc[R][NC];
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_setzero_ps();
  const int64_t k_vec = K / 32 * 32;
  for (int64_t k = 0; k < k_vec; k += 32) {
    __m512bh wv[NC];
    for (int c = 0; c < NC; ++c) wv[c] = (__m512bh)_mm512_loadu_si512(w + c * row_bytes + k * 2);
    for (int r = 0; r < R; ++r) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(xb + (m0 + r) * K + k);
      for (int c = 0; c < NC; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], xv, wv[c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NC; ++c) {
      float s = _mm512_reduce_add_ps(acc[r][c]);
      for (int64_t k = k_vec; k < K; ++k) {
        const uint32_t bits = static_cast<uint32_t>(xb[(m0 + r) * K + k]) << 16;
        float xv;
        std::memcpy(&xv, &bits, 4);
        s = std::fma(xv, scalar_weight(BF16, w + c * row_bytes, k), s);
      }
      out[(m0 + r) * ldo + n0 + c] = s;
    }
}
#endif

// Tiles of up to R rows over [m0, m0 + rows) (one instantiation per row count).
template <int TYPE, int R, int NC>
inline void float_rows(const float* x, int64_t ldx, const uint16_t* xb, int64_t m0, int64_t rows, const uint8_t* w,
                       int64_t row_bytes, int64_t K, float* out, int64_t ldo, int64_t n0) {
  int64_t m = m0;
  for (; m + R <= m0 + rows; m += R) {
#if defined(__AVX512BF16__) && defined(__AVX512F__)
    if constexpr (TYPE == BF16) {
      bf16_dot_tile<R, NC>(xb, m, w, row_bytes, K, out, ldo, n0);
      continue;
    }
#endif
    (void)xb;
    float_tile<TYPE, R, NC>(x, ldx, m, w, row_bytes, K, out, ldo, n0);
  }
  if constexpr (R > 1) {
    if (m < m0 + rows) float_rows<TYPE, R - 1, NC>(x, ldx, xb, m, m0 + rows - m, w, row_bytes, K, out, ldo, n0);
  }
}

// Columns [n_begin, n_end) of y for every row, as int_gemm_columns: row blocks that stay in L2,
// column tiles, row tiles. xb: x rounded to bf16 (the avx512bf16 tier's BF16 weights), else null.
template <int TYPE>
void float_gemm_columns(const float* x, int64_t ldx, const uint16_t* xb, int64_t M, const uint8_t* w,
                        int64_t row_bytes, int64_t K, float* out, int64_t ldo, int64_t n_begin, int64_t n_end) {
  constexpr int64_t ROW_BLOCK_BYTES = 256 << 10;
  constexpr int ROWS = 4, COLS = 2, DECODE = 4;
  const int64_t row_block = std::max<int64_t>(ROWS, ROW_BLOCK_BYTES / (4 * K) / ROWS * ROWS);
  for (int64_t mb = 0; mb < M; mb += row_block) {
    const int64_t rows = std::min(row_block, M - mb);
    int64_t n = n_begin;
    if (M == 1) {
      for (; n + DECODE <= n_end; n += DECODE)
        float_rows<TYPE, 1, DECODE>(x, ldx, xb, 0, 1, w + n * row_bytes, row_bytes, K, out, ldo, n);
    } else {
      for (; n + COLS <= n_end; n += COLS)
        float_rows<TYPE, ROWS, COLS>(x, ldx, xb, mb, rows, w + n * row_bytes, row_bytes, K, out, ldo, n);
    }
    for (; n < n_end; ++n) float_rows<TYPE, ROWS, 1>(x, ldx, xb, mb, rows, w + n * row_bytes, row_bytes, K, out, ldo, n);
  }
}

#endif  // CADENCE_HAVE_AVX2

}  // namespace gguf
}  // namespace cadence_kernels
