// y[M, N] = x[M, K] @ W[N, K]^T for a quantized GGUF weight read as stored (blocks.h codecs),
// with integer dot products on activations quantized per row and group of 32 k (q8_gemm.h's
// quantize_rows_q8: symmetric int8, scale amax / 127), as llama.cpp multiplies its quantized
// types by q8 activations. Per group of 32 k, column n and row m:
//   sum_k w x = (a * xs) * sum_k q x_q  [+ b * (xs * sum_k x_q)]
// the integer sum exact (maddubs + madd, or AVX512-VNNI's vpdpbusd), the rest in float32.
//
// Tiles are R rows x NC columns: each column's group is decoded once per tile and multiplied
// by the R rows' activations, so a prefill decodes each weight block once per R rows, not once
// per row. Weights are read row by row of W (the file's layout); each (row, column) pair keeps a
// vector of partial sums, reduced once at the end.
//
// Signed types are stored shifted to unsigned bytes with the shift's term subtracted per row
// (blocks.h: OFFSET); K-quants' minimum terms are added 8 groups at a time as vectors, Q2_K's
// (a minimum per 16 k: HALF_MINS) 8 halves at a time against the activations' exact sums per
// 16 k (half_sums) times the row's scale, which K-quants share over each 256 k.
//
// Every (row, column) pair runs the same instructions in the same order whatever the tile, the
// batch or the thread split (the minimum term with an explicit fma: no contraction left to the
// compiler), so a row's result does not depend on the rows or columns beside it.
//
// Width: Lanes256 holds one column's 32 bytes per register (the AVX2 tier); Lanes512 two
// columns side by side in a 512-bit register with the activations broadcast to both halves
// (the AVX-512 tiers: half the multiply, convert and FMA instructions per weight).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "../avx2/q8_gemm.h"
#include "blocks.h"

namespace cadence_kernels {
namespace gguf {

#if CADENCE_HAVE_AVX2

using avx2::QuantizedRows;

// One column per 256-bit register.
struct Lanes256 {
  static constexpr int COLS = 1;
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  static constexpr bool WIDE_U8 = true;  // vpdpbusd: unsigned bytes up to 255, no int16 step
#else
  static constexpr bool WIDE_U8 = false;
#endif
  using ivec = __m256i;
  using fvec = __m256;
  static ivec join(const __m256i* w) { return w[0]; }
  static fvec join(const __m256* s) { return s[0]; }
  static ivec row(__m256i x) { return x; }
  static fvec row(__m256 x) { return x; }
  static ivec set1_8(int v) { return _mm256_set1_epi8(static_cast<char>(v)); }
  static fvec set1(float v) { return _mm256_set1_ps(v); }
  static fvec zero() { return _mm256_setzero_ps(); }
  static ivec sub8(ivec a, ivec b) { return _mm256_sub_epi8(a, b); }
  static ivec sub32(ivec a, ivec b) { return _mm256_sub_epi32(a, b); }
  static ivec abs8(ivec w) { return _mm256_abs_epi8(w); }
  // x with the sign of w (0 where w is 0): |w| * sign(x, w) = w * x.
  static ivec sign8(ivec x, ivec w) { return _mm256_sign_epi8(x, w); }
  // Exact int32 sums of u * s over each 4 bytes (u unsigned, s signed; without VNNI each pair's
  // sum must fit int16: u <= 128 with |s| <= 127).
  static ivec dot4(ivec u, ivec s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
#endif
  }
  static fvec fma_int(ivec isum, fvec scale, fvec acc) { return _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), scale, acc); }
  static fvec fma(fvec a, fvec b, fvec acc) { return _mm256_fmadd_ps(a, b, acc); }
  static fvec mul(fvec a, fvec b) { return _mm256_mul_ps(a, b); }
  static float hsum(fvec v, int) { return avx2::hsum(v); }
};

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
// Two columns per 512-bit register (column 2v in the low half, 2v + 1 in the high one).
struct Lanes512 {
  static constexpr int COLS = 2;
#if defined(__AVX512VNNI__)
  static constexpr bool WIDE_U8 = true;
#else
  static constexpr bool WIDE_U8 = false;
#endif
  using ivec = __m512i;
  using fvec = __m512;
  static ivec join(const __m256i* w) { return _mm512_inserti64x4(_mm512_castsi256_si512(w[0]), w[1], 1); }
  static fvec join(const __m256* s) { return _mm512_insertf32x8(_mm512_castps256_ps512(s[0]), s[1], 1); }
  static ivec row(__m256i x) { return _mm512_broadcast_i64x4(x); }
  static fvec row(__m256 x) { return _mm512_broadcast_f32x8(x); }
  static ivec set1_8(int v) { return _mm512_set1_epi8(static_cast<char>(v)); }
  static fvec set1(float v) { return _mm512_set1_ps(v); }
  static fvec zero() { return _mm512_setzero_ps(); }
  static ivec sub8(ivec a, ivec b) { return _mm512_sub_epi8(a, b); }
  static ivec sub32(ivec a, ivec b) { return _mm512_sub_epi32(a, b); }
  static ivec abs8(ivec w) { return _mm512_abs_epi8(w); }
  static ivec sign8(ivec x, ivec w) {  // no vpsignb at 512 bits: negate x where w < 0, zero where w == 0
    const __mmask64 negative = _mm512_movepi8_mask(w);
    const __mmask64 nonzero = _mm512_test_epi8_mask(w, w);
    return _mm512_maskz_mov_epi8(nonzero, _mm512_mask_sub_epi8(x, negative, _mm512_setzero_si512(), x));
  }
  static ivec dot4(ivec u, ivec s) {
#if defined(__AVX512VNNI__)
    return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s);
#else
    return _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1));
#endif
  }
  static fvec fma_int(ivec isum, fvec scale, fvec acc) { return _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), scale, acc); }
  static fvec fma(fvec a, fvec b, fvec acc) { return _mm512_fmadd_ps(a, b, acc); }
  static fvec mul(fvec a, fvec b) { return _mm512_mul_ps(a, b); }
  static float hsum(fvec v, int half) {
    return avx2::hsum(half == 0 ? _mm512_castps512_ps256(v) : _mm512_extractf32x8_ps(v, 1));
  }
};
#endif

// The 8 lane scales of a group's int32 sums (lane i covers k 4i .. 4i + 3): a[j] everywhere, or
// with HALF_SCALES a[2j] on k 0..15 (lanes 0-3) and a[2j + 1] on k 16..31.
template <class C>
inline __m256 group_scale(const float* a, int j) {
  if constexpr (C::HALF_SCALES) return _mm256_setr_m128(_mm_set1_ps(a[2 * j]), _mm_set1_ps(a[2 * j + 1]));
  else return _mm256_set1_ps(a[j]);
}

constexpr int64_t PREFETCH_BYTES = 2048;

// How a codec's bytes u (= q + OFFSET) meet the activations x:
//   unsigned:  sum u x exactly (maddubs, or vpdpbusd), then - OFFSET * sum x, one integer
//              subtraction of a per-row term shared by every column (no OFFSET: nothing);
//   sign:      u up to 255 overflows maddubs' int16 pairs without VNNI: q = u - OFFSET signed,
//              |q| times x with q's sign (Q8_0, IQ4_NL on the tiers without VNNI).
template <class C, class L>
constexpr bool unsigned_dot() { return C::OFFSET <= 64 || L::WIDE_U8; }

// out[(m0 + r) * ldo + n0 + c] = row m0 + r of x . column n0 + c of W, r < R, c < NC.
// w: column n0's first block; row_bytes: bytes per column (K / C::QK blocks); half_sums: with
// C::HALF_MINS, [M][K / 16] exact sums of xq's bytes per 16 k (else unused).
template <class C, class L, int R, int NC>
void int_tile(const QuantizedRows& xq, const int32_t* half_sums, int64_t m0, const uint8_t* w, int64_t row_bytes,
              int64_t K, float* out, int64_t ldo, int64_t n0) {
  static_assert(NC % L::COLS == 0, "whole registers of columns");
  static_assert(!C::HALF_MINS || (C::HAS_MIN && C::GROUPS == 8), "minimums per 16 k: 256-blocks of 8 groups");
  constexpr int NV = NC / L::COLS;
  constexpr int NA = C::HALF_SCALES ? 2 * C::GROUPS : C::GROUPS;
  constexpr int NB = C::HALF_MINS ? 2 * C::GROUPS : C::GROUPS;
  constexpr bool UNSIGNED = unsigned_dot<C, L>();
  // The minimum terms b_j * (xs * sum x_q): 8 groups (or halves) at a time in vectors (K-quants),
  // else scalars.
  constexpr bool VECTOR_MIN = C::HAS_MIN && C::GROUPS == 8;
  typename L::fvec acc[R][NV];
  float min_acc[R][NC];
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < NV; ++v) acc[r][v] = L::zero();
    for (int c = 0; c < NC; ++c) min_acc[r][c] = 0.0f;
  }
  const int64_t blocks = K / C::QK, groups = K / avx2::Q8_GROUP;
  for (int64_t blk = 0; blk < blocks; ++blk) {
    alignas(32) float a[NC][NA];
    alignas(32) float b[NC][NB];
    const uint8_t* col_blk[NC];
    for (int c = 0; c < NC; ++c) {
      col_blk[c] = w + c * row_bytes + blk * C::BYTES;
      // Each column's row is a short stream (a 4096-wide Q4_K row: 36 lines) that the hardware
      // prefetchers hardly ramp up on: ask for the lines PREFETCH_BYTES ahead (past a row's end,
      // the next column's row: the next tile's).
      for (int64_t line = 0; line < C::BYTES; line += 64) _mm_prefetch(reinterpret_cast<const char*>(col_blk[c] + PREFETCH_BYTES + line), _MM_HINT_T0);
      C::scales(col_blk[c], a[c], b[c]);
    }
    for (int j = 0; j < C::GROUPS; ++j) {
      const int64_t g = blk * C::GROUPS + j, k = g * avx2::Q8_GROUP;
      typename L::ivec wq[NV], wmag[NV];
      typename L::fvec ws[NV];
      for (int v = 0; v < NV; ++v) {
        __m256i q[L::COLS];
        __m256 s[L::COLS];
        for (int h = 0; h < L::COLS; ++h) {
          q[h] = C::quants(col_blk[v * L::COLS + h], j);
          s[h] = group_scale<C>(a[v * L::COLS + h], j);
        }
        wq[v] = L::join(q);
        ws[v] = L::join(s);
        if constexpr (!UNSIGNED) {
          wq[v] = L::sub8(wq[v], L::set1_8(C::OFFSET));
          wmag[v] = L::abs8(wq[v]);
        }
      }
      for (int r = 0; r < R; ++r) {
        const typename L::ivec x = L::row(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq.q_at(m0 + r, k))));
        const typename L::fvec xs = L::set1(xq.scale_at(m0 + r, g));
        typename L::ivec x_offset;
        if constexpr (UNSIGNED && C::OFFSET != 0) x_offset = L::dot4(L::set1_8(C::OFFSET), x);
        for (int v = 0; v < NV; ++v) {
          typename L::ivec isum;
          if constexpr (!UNSIGNED) isum = L::dot4(wmag[v], L::sign8(x, wq[v]));
          else if constexpr (C::OFFSET != 0) isum = L::sub32(L::dot4(wq[v], x), x_offset);
          else isum = L::dot4(wq[v], x);
          acc[r][v] = L::fma_int(isum, L::mul(ws[v], xs), acc[r][v]);
        }
        if constexpr (C::HAS_MIN && !VECTOR_MIN) {
          const float xsum = xq.sum_at(m0 + r, g);
          for (int c = 0; c < NC; ++c) min_acc[r][c] = std::fma(b[c][j], xsum, min_acc[r][c]);
        }
      }
    }
    if constexpr (VECTOR_MIN) {
      // Lane j: b_j * (xs_j * sum x_q over group j), added into the column's partial sums; with
      // HALF_MINS b_i * (xs * sum x_q over half i) for the block's halves 8p .. 8p + 7.
      for (int p = 0; p < NB / 8; ++p) {
        typename L::fvec bv[NV];
        for (int v = 0; v < NV; ++v) {
          __m256 parts[L::COLS];
          for (int h = 0; h < L::COLS; ++h) parts[h] = _mm256_load_ps(b[v * L::COLS + h] + 8 * p);
          bv[v] = L::join(parts);
        }
        for (int r = 0; r < R; ++r) {
          __m256 sums;
          if constexpr (C::HALF_MINS) {
            const __m256i exact = _mm256_loadu_si256(
                reinterpret_cast<const __m256i*>(half_sums + (m0 + r) * (K / 16) + blk * 16 + 8 * p));
            sums = _mm256_mul_ps(_mm256_set1_ps(xq.scale_at(m0 + r, blk * 8)), _mm256_cvtepi32_ps(exact));
          } else {
            sums = _mm256_loadu_ps(xq.sum.data() + (m0 + r) * groups + blk * 8);
          }
          const typename L::fvec xsum = L::row(sums);
          for (int v = 0; v < NV; ++v) acc[r][v] = L::fma(bv[v], xsum, acc[r][v]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < NC; ++c)
      out[(m0 + r) * ldo + n0 + c] = L::hsum(acc[r][c / L::COLS], c % L::COLS) + min_acc[r][c];
}

// Tile shapes: (rows, columns) of a tile and the register width, per tier. At M = 1 wide tiles
// (independent columns hide the latencies); with more rows, tall ones that reuse each decoded
// group R times.
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
using WideLanes = Lanes512;
constexpr int DECODE_COLS = 8, PREFILL_ROWS = 4, PREFILL_COLS = 4;
#else
using WideLanes = Lanes256;
constexpr int DECODE_COLS = 4, PREFILL_ROWS = 4, PREFILL_COLS = 2;
#endif

// Rows [m0, m0 + rows) x columns [n0, n0 + cols) in tiles of up to R rows (one instantiation per
// row count), NC columns.
template <class C, class L, int R, int NC>
inline void int_rows(const QuantizedRows& xq, const int32_t* half_sums, int64_t m0, int64_t rows, const uint8_t* w,
                     int64_t row_bytes, int64_t K, float* out, int64_t ldo, int64_t n0) {
  int64_t m = m0;
  for (; m + R <= m0 + rows; m += R) int_tile<C, L, R, NC>(xq, half_sums, m, w, row_bytes, K, out, ldo, n0);
  if constexpr (R > 1) {
    if (m < m0 + rows) int_rows<C, L, R - 1, NC>(xq, half_sums, m, m0 + rows - m, w, row_bytes, K, out, ldo, n0);
  }
}

// Columns [n_begin, n_end) of y for every row: row blocks whose quantized activations stay in
// L2 (ROW_BLOCK_BYTES), in each the columns in tiles, in each the row tiles. Column tails narrower
// than a tile go one column at a time (256-bit). half_sums: as int_tile's (C::HALF_MINS only).
template <class C>
void int_gemm_columns(const QuantizedRows& xq, const int32_t* half_sums, int64_t M, const uint8_t* w,
                      int64_t row_bytes, int64_t K, float* out, int64_t ldo, int64_t n_begin, int64_t n_end) {
  constexpr int64_t ROW_BLOCK_BYTES = 256 << 10;
  const int64_t row_block = std::max<int64_t>(PREFILL_ROWS, ROW_BLOCK_BYTES / K / PREFILL_ROWS * PREFILL_ROWS);
  for (int64_t mb = 0; mb < M; mb += row_block) {
    const int64_t rows = std::min(row_block, M - mb);
    int64_t n = n_begin;
    if (M == 1) {
      for (; n + DECODE_COLS <= n_end; n += DECODE_COLS)
        int_tile<C, WideLanes, 1, DECODE_COLS>(xq, half_sums, 0, w + n * row_bytes, row_bytes, K, out, ldo, n);
    } else {
      for (; n + PREFILL_COLS <= n_end; n += PREFILL_COLS)
        int_rows<C, WideLanes, PREFILL_ROWS, PREFILL_COLS>(xq, half_sums, mb, rows, w + n * row_bytes, row_bytes, K,
                                                          out, ldo, n);
    }
    for (; n < n_end; ++n)
      int_rows<C, Lanes256, PREFILL_ROWS, 1>(xq, half_sums, mb, rows, w + n * row_bytes, row_bytes, K, out, ldo, n);
  }
}

#endif  // CADENCE_HAVE_AVX2

}  // namespace gguf
}  // namespace cadence_kernels
