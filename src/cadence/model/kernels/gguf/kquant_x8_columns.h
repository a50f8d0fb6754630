// Which tiles (kquant_tiles.h) run a GEMM over repacked K-quant octets (q3k_x8.h .. q6k_x8.h), for
// every format: F is a family's steps on the format's unpack policy (MinSteps<Q4KUnpack>,
// OffsetSteps<Q6KUnpack>, ...).
#pragma once

#include <algorithm>
#include <cstdint>

#include "../avx2/q4_gemm.h"
#include "kquant_tiles.h"

namespace cadence_kernels {
namespace gguf {

#if CADENCE_HAVE_AVX2

// One R-row 256-bit tile of kquant_rows_avx2 as a function of its own. Inlined into
// kquant_x8_columns beside every other tile, GCC unrolled the tile's k-octet loop, reordered the
// int16 adds across the rows and spilled their sums (Q4_K's driver: 129 ymm stack accesses; the
// R = 4 tile here: none in its k-octet loop), and the AVX2 tier's M = 32 GEMM lost a quarter of
// its rate in the tile dedupe (1217d7b; docs/performance.md, issue 30). Out of line, each tile's
// registers are allocated for it alone, as they were before.
template <class T, int R>
__attribute__((noinline)) void kquant_row_tile_avx2(const avx2::QuantizedRows& xq, const int32_t* half_sums, int64_t m0,
                                                    const uint8_t* packed, int64_t octet_bytes, int64_t K, float* out,
                                                    int64_t ldo, int64_t n0) {
  T::template tile_avx2<R, 1>(xq, half_sums, m0, packed, octet_bytes, K, out, ldo, n0);
}

// Rows [m0, m0 + rows) against the octet at `packed` in 256-bit tiles of R rows, then fewer.
template <class T, int R>
inline void kquant_rows_avx2(const avx2::QuantizedRows& xq, const int32_t* half_sums, int64_t m0, int64_t rows,
                             const uint8_t* packed, int64_t octet_bytes, int64_t K, float* out, int64_t ldo, int64_t n0) {
  int64_t m = m0;
  for (; m + R <= m0 + rows; m += R) kquant_row_tile_avx2<T, R>(xq, half_sums, m, packed, octet_bytes, K, out, ldo, n0);
  if constexpr (R > 1) {
    if (m < m0 + rows) kquant_rows_avx2<T, R - 1>(xq, half_sums, m, m0 + rows - m, packed, octet_bytes, K, out, ldo, n0);
  }
}

#ifdef CADENCE_GGUF_X16
// The same for the pair of octets at `packed` in 16-column tiles.
template <class T, int R>
inline void kquant_rows_x16(const avx2::QuantizedRows& xq, const int32_t* half_sums, int64_t m0, int64_t rows,
                            const uint8_t* packed, int64_t octet_bytes, int64_t K, float* out, int64_t ldo, int64_t n0) {
  int64_t m = m0;
  for (; m + R <= m0 + rows; m += R) T::template tile_x16<R>(xq, half_sums, m, packed, octet_bytes, K, out, ldo, n0);
  if constexpr (R > 1) {
    if (m < m0 + rows) kquant_rows_x16<T, R - 1>(xq, half_sums, m, m0 + rows - m, packed, octet_bytes, K, out, ldo, n0);
  }
}
#endif

// Octets [o_begin, o_end) for every row; half_sums: the rows' byte sums per 16 k (OffsetSteps;
// MinSteps reads the group sums in xq instead).
//
// One row (a decode step): on the AVX-512 tiers 2 * F::X16_GEMV_PAIRS octets at a time (MinSteps
// eight: a 734 MB Q4_K GEMV set on 2 Zen 4 threads streamed 38 GB/s against 29-33 with four;
// OffsetSteps four: Q6_K 36-39 GB/s already, eight no better), then four, a pair, a lone octet; on
// the AVX2 tier F::AVX2_GEMV_OCTETS at a time (Q4_K eight: its 765 MB GEMV set 32.8-33.5 -> 35.5-35.9
// GB/s against six, ten no better, twelve and sixteen slower; the others four, as their unpack's
// registers allow), then two, one. Each such tile prefetches the thread's next one into L2
// (GemvPrefetch; the Q4_K set 20-28 -> 25-33 GB/s, alternated in one binary), so every format's
// decode GEMV streams as Q4_K's does. The tails' gemv_prefetch says "no next tile".
//
// More rows: row blocks that stay in L2 (as int_gemm_columns), 8-row x 16-column tiles on the
// AVX-512 tiers, 4-row x 8-column ones on AVX2 and for a lone octet.
template <class F>
inline void kquant_x8_columns(const avx2::QuantizedRows& xq, const int32_t* half_sums, int64_t M, const uint8_t* packed,
                              int64_t K, float* out, int64_t ldo, int64_t o_begin, int64_t o_end) {
  using T = KQuantTiles<F>;
  const int64_t octet_bytes = K / 256 * F::Unpack::BYTES;
  const auto at = [&](int64_t o) { return packed + o * octet_bytes; };
#ifdef CADENCE_GGUF_X16
  if (M == 1) {
    int64_t o = o_begin;
    if constexpr (F::X16_GEMV_PAIRS >= 4) {
      for (; o + 8 <= o_end; o += 8)
        T::template gemv_x16<4>(xq, half_sums, at(o), octet_bytes, K, out + 8 * o,
                                gemv_prefetch(o, o_begin, o_end, 8, 8 * octet_bytes));
    }
    for (; o + 4 <= o_end; o += 4)
      T::template gemv_x16<2>(xq, half_sums, at(o), octet_bytes, K, out + 8 * o,
                              gemv_prefetch(o, o_begin, o_end, 4, 4 * octet_bytes));
    for (; o + 2 <= o_end; o += 2) T::template tile_x16<1>(xq, half_sums, 0, at(o), octet_bytes, K, out, ldo, 8 * o);
    if (o < o_end) T::template tile_avx2<1, 1>(xq, half_sums, 0, at(o), octet_bytes, K, out, ldo, 8 * o);
    return;
  }
  const int64_t row_block = std::max<int64_t>(X16_ROWS, (256 << 10) / K / X16_ROWS * X16_ROWS);
  for (int64_t mb = 0; mb < M; mb += row_block) {
    const int64_t rows = std::min(row_block, M - mb);
    int64_t o = o_begin;
    for (; o + 2 <= o_end; o += 2)
      kquant_rows_x16<T, X16_ROWS>(xq, half_sums, mb, rows, at(o), octet_bytes, K, out, ldo, 8 * o);
    if (o < o_end) kquant_rows_avx2<T, AVX2_ROWS>(xq, half_sums, mb, rows, at(o), octet_bytes, K, out, ldo, 8 * o);
  }
#else
  if (M == 1) {
    constexpr int O = F::AVX2_GEMV_OCTETS;
    int64_t o = o_begin;
    for (; o + O <= o_end; o += O)
      T::template tile_avx2<1, O>(xq, half_sums, 0, at(o), octet_bytes, K, out, ldo, 8 * o,
                                  gemv_prefetch(o, o_begin, o_end, O, O * octet_bytes));
    for (; o + 2 <= o_end; o += 2) T::template tile_avx2<1, 2>(xq, half_sums, 0, at(o), octet_bytes, K, out, ldo, 8 * o);
    if (o < o_end) T::template tile_avx2<1, 1>(xq, half_sums, 0, at(o), octet_bytes, K, out, ldo, 8 * o);
    return;
  }
  const int64_t row_block = std::max<int64_t>(AVX2_ROWS, (256 << 10) / K / AVX2_ROWS * AVX2_ROWS);
  for (int64_t mb = 0; mb < M; mb += row_block) {
    const int64_t rows = std::min(row_block, M - mb);
    for (int64_t o = o_begin; o < o_end; ++o)
      kquant_rows_avx2<T, AVX2_ROWS>(xq, half_sums, mb, rows, at(o), octet_bytes, K, out, ldo, 8 * o);
  }
#endif
}

#endif  // CADENCE_HAVE_AVX2

}  // namespace gguf
}  // namespace cadence_kernels
