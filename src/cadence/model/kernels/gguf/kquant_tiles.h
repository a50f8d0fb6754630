// The tiles of every repacked K-quant (q3k_x8.h .. q6k_x8.h), written once: loops over the
// 256-blocks and their 8 groups of 32 k, the prefetches, and the float steps, once per block and
// column. What a format's integers are comes from F, a family's steps on the format's unpack
// policy (MinSteps<Q4KUnpack>, MinSteps<Q5KUnpack>: kquant_min_steps.h; OffsetSteps<Q6KUnpack>,
// OffsetSteps<Q3KUnpack>: kquant_offset_steps.h), a template parameter: everything inlines into
// each tile. F gives
//   Unpack, MINIMUMS, DMIN      the format's policy (its BYTES per octet and 256-block, the lines
//                               prefetch_group fetches); whether the weights take minimums, and
//                               where in the block header their dmin[8] lies
//   group_avx2<R, O>, group_x16<R>, group_gemv<P>
//                               group j's exact integer sums added to the rows' and octets' block sums
//   block_avx2<R, O>(.., i, ..), block_x16<R>
//                               the block's last integers per row: its block sums completed in place
//                               (Q6_K / Q3_K: the quants' offset taken off), the minimums' sums in `mins`
// Then per block and column: acc += float(sum) * (d * x_scale) and, with minimums, acc -=
// float(min_sum) * (dmin * x_scale), x_scale the activations' one scale per 256 (quantize.h); d
// (and dmin at DMIN) the octet's 8 columns' fp16 values at the block's start, widened to float32
// (exact; halves8_ps). Every tile computes a column's exact
// integers and runs these float steps lane for lane in this order, so its bits do not depend on
// the tile, the rows beside it, the thread split or the tier.
#pragma once

#include <cstdint>

#include "../avx2/q4_gemm.h"
#include "x16_pairs.h"

namespace cadence_kernels {
namespace gguf {

#if CADENCE_HAVE_AVX2

// The 256-bit tiles' inner step, in both families' group_avx2: k-octet kk's q bytes of O octets
// (lo: positions 8kk + t, hi: 8kk + 4 + t) against R rows' activations at k (8kk of the group), the
// two maddubs' int16 pair sums added (exact: <= 4 * 63 * 127), handed to f(r, i, pairs).
template <int R, int O, class Sink>
inline void maddubs_pairs(const avx2::QuantizedRows& xq, int64_t m0, int64_t k, const __m256i (&lo)[O],
                          const __m256i (&hi)[O], Sink&& f) {
  for (int r = 0; r < R; ++r) {
    const int8_t* x = xq.q_at(m0 + r, k);
    const __m256i x_lo = avx2::broadcast4(x), x_hi = avx2::broadcast4(x + 4);
    for (int i = 0; i < O; ++i) f(r, i, _mm256_add_epi16(_mm256_maddubs_epi16(lo[i], x_lo), _mm256_maddubs_epi16(hi[i], x_hi)));
  }
}

// 8 fp16 values at p (a block header's d or dmin of an octet's columns) as float32 lanes: exact
// (vcvtph2ps ignores MXCSR's flush-to-zero and denormals-are-zero; every fp16 value, subnormals
// too, is a normal float32), so a column's d is the value gguf-py's dequantization reads. Stored
// as the file's fp16 (not widened at repack) the header is 32 bytes smaller per 256-block: a
// decode GEMV streams its weights once per step, and every byte it reads costs the step time.
inline __m256 halves8_ps(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
#ifdef CADENCE_GGUF_X16
// halves8_ps of two octets' headers (a then b) in a register's halves.
inline __m512 halves8_pair_ps(const uint8_t* a, const uint8_t* b) {
  return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
                                                 _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), 1));
}
#endif

template <class F>
struct KQuantTiles {
  // R rows x O octets, 8 columns per 256-bit register (maddubs, no VNNI): the AVX2 tier's tiles,
  // and a lone octet's on every tier. The float accumulators stay in registers.
  template <int R, int O>
  static void tile_avx2(const avx2::QuantizedRows& xq, const int32_t* half_sums, int64_t m0, const uint8_t* packed,
                        int64_t octet_bytes, int64_t K, float* out, int64_t ldo, int64_t n0, GemvPrefetch pf = {}) {
    __m256 acc[R][O];
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < O; ++i) acc[r][i] = _mm256_setzero_ps();
    const int64_t groups = K / avx2::Q8_GROUP;
    for (int64_t blk = 0; blk < K / 256; ++blk) {
      const uint8_t* b[O];
      for (int i = 0; i < O; ++i) b[i] = packed + i * octet_bytes + blk * F::Unpack::BYTES;
      __m256i block_sum[R][O];
      for (int r = 0; r < R; ++r)
        for (int i = 0; i < O; ++i) block_sum[r][i] = _mm256_setzero_si256();
      for (int j = 0; j < 8; ++j) {
        for (int i = 0; i < O; ++i) prefetch_group<typename F::Unpack, R>(b[i], j, pf);
        F::template group_avx2<R, O>(xq, m0, (blk * 8 + j) * avx2::Q8_GROUP, b, j, block_sum);
      }
      for (int i = 0; i < O; ++i) {
        __m256i mins[R] = {};
        F::template block_avx2<R, O>(xq, half_sums, m0, blk, K, b[i], i, block_sum, mins);
        const __m256 d = halves8_ps(b[i]);
        const __m256 dmin = halves8_ps(b[i] + F::DMIN);  // unused without minimums
        for (int r = 0; r < R; ++r) {
          const __m256 xs = _mm256_set1_ps(xq.scale[(m0 + r) * groups + blk * 8]);
          acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(block_sum[r][i]), _mm256_mul_ps(d, xs), acc[r][i]);
          if constexpr (F::MINIMUMS)
            acc[r][i] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mins[r]), _mm256_mul_ps(dmin, xs), acc[r][i]);
        }
      }
    }
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < O; ++i) _mm256_storeu_ps(out + (m0 + r) * ldo + n0 + 8 * i, acc[r][i]);
  }

#ifdef CADENCE_GGUF_X16
  // R rows against the octets at `packed` and packed + octet_bytes, in the two halves of each
  // register (x16_pairs.h). The rows' float accumulators live in `out` between blocks (one load
  // and store per row and 2048 weights): the 32 registers then hold R = 8 rows' sums beside the
  // decoded weights, so each decoded register serves 8 rows.
  template <int R>
  static void tile_x16(const avx2::QuantizedRows& xq, const int32_t* half_sums, int64_t m0, const uint8_t* packed,
                       int64_t octet_bytes, int64_t K, float* out, int64_t ldo, int64_t n0) {
    const int64_t groups = K / avx2::Q8_GROUP;
    for (int64_t blk = 0; blk < K / 256; ++blk) {
      const uint8_t* b0 = packed + blk * F::Unpack::BYTES;
      const uint8_t* b1 = b0 + octet_bytes;
      __m512i block_sum[R];
      for (int r = 0; r < R; ++r) block_sum[r] = _mm512_setzero_si512();
      for (int j = 0; j < 8; ++j) {
        prefetch_group<typename F::Unpack, R>(b0, j, {});
        prefetch_group<typename F::Unpack, R>(b1, j, {});
        F::template group_x16<R>(xq, m0, (blk * 8 + j) * avx2::Q8_GROUP, b0, b1, j, block_sum);
      }
      __m512i mins[R] = {};
      F::template block_x16<R>(xq, half_sums, m0, blk, K, b0, b1, block_sum, mins);
      const __m512 d = halves8_pair_ps(b0, b1), dmin = halves8_pair_ps(b0 + F::DMIN, b1 + F::DMIN);  // dmin: with minimums
      for (int r = 0; r < R; ++r) {
        float* o = out + (m0 + r) * ldo + n0;
        const __m512 xs = _mm512_set1_ps(xq.scale[(m0 + r) * groups + blk * 8]);
        __m512 acc = blk == 0 ? _mm512_setzero_ps() : load_pair_ps(reinterpret_cast<const uint8_t*>(o),
                                                                   reinterpret_cast<const uint8_t*>(o + 8));
        store_pair(o, float_step(acc, block_sum[r], mins[r], d, dmin, xs));
      }
    }
  }

  // One row (a decode step) against P pairs of octets at once (2P consecutive octets from
  // `packed`): tile_x16<1>'s integers and float steps lane for lane, with P pairs' loads and
  // dot-product chains in flight together (a GEMV is bound by how many memory streams and
  // independent chains it keeps going, not by its instructions), prefetching as `pf` says.
  template <int P>
  static void gemv_x16(const avx2::QuantizedRows& xq, const int32_t* half_sums, const uint8_t* packed,
                       int64_t octet_bytes, int64_t K, float* out, GemvPrefetch pf) {
    __m512 acc[P];
    for (int p = 0; p < P; ++p) acc[p] = _mm512_setzero_ps();
    for (int64_t blk = 0; blk < K / 256; ++blk) {
      const uint8_t* b[2 * P];
      for (int i = 0; i < 2 * P; ++i) b[i] = packed + i * octet_bytes + blk * F::Unpack::BYTES;
      __m512i block_sum[P];
      for (int p = 0; p < P; ++p) block_sum[p] = _mm512_setzero_si512();
      for (int j = 0; j < 8; ++j) {
        for (int i = 0; i < 2 * P; ++i) prefetch_group<typename F::Unpack, 1>(b[i], j, pf);
        F::template group_gemv<P>(xq, (blk * 8 + j) * avx2::Q8_GROUP, b, j, block_sum);
      }
      const __m512 xs = _mm512_set1_ps(xq.scale[blk * 8]);
      for (int p = 0; p < P; ++p) {
        __m512i mins = _mm512_setzero_si512();
        F::template block_x16<1>(xq, half_sums, 0, blk, K, b[2 * p], b[2 * p + 1], &block_sum[p], &mins);
        const __m512 d = halves8_pair_ps(b[2 * p], b[2 * p + 1]);
        const __m512 dmin = halves8_pair_ps(b[2 * p] + F::DMIN, b[2 * p + 1] + F::DMIN);
        acc[p] = float_step(acc[p], block_sum[p], mins, d, dmin, xs);
      }
    }
    for (int p = 0; p < P; ++p) store_pair(out + 16 * p, acc[p]);
  }

  // acc + float(sum) * (d * xs), then - float(mins) * (dmin * xs) with minimums.
  static __m512 float_step(__m512 acc, __m512i sum, __m512i mins, __m512 d, __m512 dmin, __m512 xs) {
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(d, xs), acc);
    if constexpr (F::MINIMUMS) acc = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mins), _mm512_mul_ps(dmin, xs), acc);
    return acc;
  }
#endif
};

#endif  // CADENCE_HAVE_AVX2

}  // namespace gguf
}  // namespace cadence_kernels
