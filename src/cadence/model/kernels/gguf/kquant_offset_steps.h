// The integer steps of the repacked K-quants whose weights are w = (d * sc) * (q - offset), a
// signed scale per 16 k: Q6_K (q6k_x8.h, offset 32) and Q3_K (q3k_x8.h, offset 4), for the tiles
// of kquant_tiles.h (KQuantTiles<OffsetSteps<U>>). Both share an octet's 160-byte block header
//   d[8]         fp16, the blocks' own (the tiles widen them: halves8_ps), then 16 bytes unused
//                (the quants after the header stay 32-byte aligned, as their loads are)
//   sc[16][8]    int8, [16-weight scale][column] (at OFFSET_HEADER_SCALES)
// and differ only in how the quants unpack into q bytes: the format's policy U, a template
// parameter (its unpack inlines into every step), gives
//   BYTES, OFFSET_SHIFT  an octet's bytes per 256-block; log2 of the offset
//   LINES, line(j, l)  the cache lines of group j's quants: line l's offset in a block (prefetch_group)
//   unpack_256(b, j, kk, lo, hi)  k-octet kk of group j of the block at b: per column's 4 bytes t,
//                                 the q of position 8kk + t (lo) and 8kk + 4 + t (hi)
//   decode_16k(b0, b1, j, p, w)   the 16 k of scale 2j + p in two octets' blocks (a register's
//                                 halves): w[0] / w[1] k-octet 2p's lo / hi, w[2] / w[3] 2p + 1's
//
// Exact integers: per (row, column) and 16 k, the sum of q * x (16 products of q <= 63 and |x| <=
// 127: <= 128016) times the int8 scale into the block's int32 sum (<= 16 x 128016 x 128 < 2^28);
// q's offset taken off once per block, offset * sum_s sc_s * (the row's byte sum over s's 16 k,
// |.| <= 2032: half_sums), in the same int32 (< 2^27 more). Every tile computes these same
// integers for a column.
#pragma once

#include <cstdint>
#include <cstring>

#include "../avx2/q4_gemm.h"
#include "kquant_tiles.h"

namespace cadence_kernels {
namespace gguf {

// Offsets in the block header above, and its size.
constexpr int64_t OFFSET_HEADER_SCALES = 32, OFFSET_HEADER_BYTES = 160;

#if CADENCE_HAVE_AVX2

#ifdef CADENCE_GGUF_X16
// The int8 scales of 8 columns at a, then 8 at b, as scaled_add_16k's multiplier: int32 lanes
// (VNNI), or each in both int16 halves of its lane (madd's pairs).
inline __m512i offset_scale_operand(const uint8_t* a, const uint8_t* b) {
  const __m512i sc = _mm512_cvtepi8_epi32(_mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a)),
                                                             _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b))));
#if defined(__AVX512VNNI__)
  return sc;
#else
  return _mm512_or_si512(_mm512_and_si512(sc, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(sc, 16));
#endif
}

// block_sum + sc * (the exact sum of q * x over 16 k), x the row's 16 bytes, w: decode_16k. With
// VNNI one chain of 4 vpdpbusd and one vpmulld by the scale; without, the 256-bit tile's maddubs
// pairs (4 products: <= 32004, exact in int16) and madd by the scale.
inline __m512i scaled_add_16k(__m512i block_sum, const __m512i w[4], const int8_t* x, __m512i sc) {
#if defined(__AVX512VNNI__)
  __m512i s = udot4_add_512_at(_mm512_setzero_si512(), w[0], x);
  s = udot4_add_512_at(s, w[1], x + 4);
  s = udot4_add_512_at(s, w[2], x + 8);
  s = udot4_add_512_at(s, w[3], x + 12);
  return _mm512_add_epi32(block_sum, _mm512_mullo_epi32(s, sc));
#else
  for (int sub = 0; sub < 2; ++sub) {
    const __m512i pairs = _mm512_add_epi16(_mm512_maddubs_epi16(w[2 * sub], broadcast4_512(x + 8 * sub)),
                                           _mm512_maddubs_epi16(w[2 * sub + 1], broadcast4_512(x + 8 * sub + 4)));
    block_sum = _mm512_add_epi32(block_sum, _mm512_madd_epi16(pairs, sc));
  }
  return block_sum;
#endif
}

// block_sum[r] -= 2^SHIFT * sum_s sc_s * hs_s for R rows of one 256-block: hs the first row's 16
// byte sums (half_sums), rows `stride` apart; b0, b1 the block of the two octets. Per two scales
// one vpdpwssd of the int16 pairs (-2^SHIFT sc_s, -2^SHIFT sc_s+1) by the row's (hs_s, hs_s+1).
template <int R, int SHIFT>
inline void offset_add(const int32_t* hs, int64_t stride, const uint8_t* b0, const uint8_t* b1, __m512i* block_sum) {
  alignas(32) int32_t pairs[R][8];  // (hs_2i, hs_2i+1) as int16 pairs
  for (int r = 0; r < R; ++r)
    _mm256_store_si256(reinterpret_cast<__m256i*>(pairs[r]), _mm512_cvtepi32_epi16(_mm512_loadu_si512(hs + r * stride)));
  for (int i = 0; i < 8; ++i) {
    // Scales 2i and 2i + 1 (16 bytes, [scale][column]) as int16 pairs per column, times -2^SHIFT.
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + OFFSET_HEADER_SCALES + 16 * i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b1 + OFFSET_HEADER_SCALES + 16 * i));
    const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_unpacklo_epi8(a, _mm_srli_si128(a, 8))),
                                                 _mm_unpacklo_epi8(b, _mm_srli_si128(b, 8)), 1);
    const __m512i offset = _mm512_sub_epi16(_mm512_setzero_si512(), _mm512_slli_epi16(_mm512_cvtepi8_epi16(both), SHIFT));
    for (int r = 0; r < R; ++r) block_sum[r] = word_dot_add_512(block_sum[r], offset, _mm512_set1_epi32(pairs[r][i]));
  }
}
#endif

template <class U>
struct OffsetSteps {
  using Unpack = U;
  static constexpr bool MINIMUMS = false;
  static constexpr int64_t DMIN = 0;  // no minimums
  static constexpr int X16_GEMV_PAIRS = 2;  // a decode row's octets four at a time (eight no faster)
  static constexpr int AVX2_GEMV_OCTETS = 4;

  // Group j of R rows x O octets (maddubs, no VNNI): its two 16-k scales' halves (half_avx2). The
  // rows' tiles (R > 1) call the two halves straight: in a loop over them GCC tested each half's
  // k-octet bounds at run time, and Q6_K's AVX2 M = 32 GEMM stayed ~20% slower than before the
  // tile dedupe (1217d7b; docs/performance.md, issue 30). The decode GEMV (R = 1) keeps the loop
  // (its rate did not move either way).
  template <int R, int O>
  static void group_avx2(const avx2::QuantizedRows& xq, int64_t m0, int64_t k0, const uint8_t* const* b, int j,
                         __m256i (&block_sum)[R][O]) {
    if constexpr (R > 1) {
      half_avx2<R, O>(xq, m0, k0, b, j, 0, block_sum);
      half_avx2<R, O>(xq, m0, k0, b, j, 1, block_sum);
    } else {
      for (int p = 0; p < 2; ++p) half_avx2<R, O>(xq, m0, k0, b, j, p, block_sum);
    }
  }

  // Scale 2j + p's 16 k (k-octets 2p, 2p + 1 of group j): per (row, octet) and 8 k the two
  // maddubs' int16 pair sums are added (4 products of q <= 63: <= 32004, exact), one madd
  // multiplies them by the scale (int16 pairs of the signed sc) into the block's int32 sum.
  template <int R, int O>
  static void half_avx2(const avx2::QuantizedRows& xq, int64_t m0, int64_t k0, const uint8_t* const* b, int j, int p,
                        __m256i (&block_sum)[R][O]) {
    // Byte c of 8 scales into both bytes of int16 lanes 2c and 2c + 1 (then >> 8: sign-extended).
    const __m256i scale_twice = _mm256_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3,
                                                 4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7);
    __m256i sc16[O];
    for (int i = 0; i < O; ++i) {
      int64_t scales;
      std::memcpy(&scales, b[i] + OFFSET_HEADER_SCALES + (2 * j + p) * 8, sizeof(scales));
      sc16[i] = _mm256_srai_epi16(_mm256_shuffle_epi8(_mm256_set1_epi64x(scales), scale_twice), 8);
    }
    for (int kk = 2 * p; kk < 2 * p + 2; ++kk) {
      __m256i lo[O], hi[O];
      for (int i = 0; i < O; ++i) U::unpack_256(b[i], j, kk, lo[i], hi[i]);
      maddubs_pairs<R, O>(xq, m0, k0 + kk * 8, lo, hi, [&](int r, int i, __m256i pairs) {
        block_sum[r][i] = _mm256_add_epi32(block_sum[r][i], _mm256_madd_epi16(pairs, sc16[i]));
      });
    }
  }

  // Octet i's (block at b) offset taken off R rows' block sums: two scales per madd, int16 pairs
  // (sc_s, sc_s+1) per column against the row's (hs_s, hs_s+1), times 2^OFFSET_SHIFT.
  template <int R, int O>
  static void block_avx2(const avx2::QuantizedRows& /*xq*/, const int32_t* half_sums, int64_t m0, int64_t blk,
                         int64_t K, const uint8_t* b, int i, __m256i (&block_sum)[R][O], __m256i (&/*mins*/)[R]) {
    __m256i offset[R];
    for (int r = 0; r < R; ++r) offset[r] = _mm256_setzero_si256();
    for (int s = 0; s < 16; s += 2) {
      const __m128i two_rows = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + OFFSET_HEADER_SCALES + s * 8));
      const __m256i sc_pairs = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(two_rows, _mm_srli_si128(two_rows, 8)));
      for (int r = 0; r < R; ++r) {
        const int32_t* hs = half_sums + (m0 + r) * (K / 16) + blk * 16 + s;
        const uint32_t pair = (static_cast<uint32_t>(hs[0]) & 0xFFFFu) | (static_cast<uint32_t>(hs[1]) << 16);
        offset[r] = _mm256_add_epi32(offset[r], _mm256_madd_epi16(sc_pairs, _mm256_set1_epi32(static_cast<int32_t>(pair))));
      }
    }
    for (int r = 0; r < R; ++r)
      block_sum[r][i] = _mm256_sub_epi32(block_sum[r][i], _mm256_slli_epi32(offset[r], U::OFFSET_SHIFT));
  }

#ifdef CADENCE_GGUF_X16
  // Group j of R rows against two octets' blocks (b0, b1: a register's halves): per 16 k of one
  // scale, scaled_add_16k.
  template <int R>
  static void group_x16(const avx2::QuantizedRows& xq, int64_t m0, int64_t k0, const uint8_t* b0, const uint8_t* b1,
                        int j, __m512i (&block_sum)[R]) {
    for (int p = 0; p < 2; ++p) {
      __m512i w[4];
      U::decode_16k(b0, b1, j, p, w);
      const __m512i sc = offset_scale_operand(b0 + OFFSET_HEADER_SCALES + (2 * j + p) * 8, b1 + OFFSET_HEADER_SCALES + (2 * j + p) * 8);
      for (int r = 0; r < R; ++r) block_sum[r] = scaled_add_16k(block_sum[r], w, xq.q_at(m0 + r, k0 + 16 * p), sc);
    }
  }

  // Group j of one row against P pairs of octets (b[2p], b[2p + 1]): group_x16<1>'s sums.
  template <int P>
  static void group_gemv(const avx2::QuantizedRows& xq, int64_t k0, const uint8_t* const* b, int j,
                         __m512i (&block_sum)[P]) {
    for (int hp = 0; hp < 2; ++hp) {
      const int8_t* x = xq.q_at(0, k0 + 16 * hp);
      for (int p = 0; p < P; ++p) {
        __m512i w[4];
        U::decode_16k(b[2 * p], b[2 * p + 1], j, hp, w);
        const __m512i sc = offset_scale_operand(b[2 * p] + OFFSET_HEADER_SCALES + (2 * j + hp) * 8,
                                                  b[2 * p + 1] + OFFSET_HEADER_SCALES + (2 * j + hp) * 8);
        block_sum[p] = scaled_add_16k(block_sum[p], w, x, sc);
      }
    }
  }

  // The offset taken off R rows' block sums against two octets' blocks (offset_add).
  template <int R>
  static void block_x16(const avx2::QuantizedRows& /*xq*/, const int32_t* half_sums, int64_t m0, int64_t blk,
                        int64_t K, const uint8_t* b0, const uint8_t* b1, __m512i* block_sum, __m512i* /*mins*/) {
    offset_add<R, U::OFFSET_SHIFT>(half_sums + m0 * (K / 16) + blk * 16, K / 16, b0, b1, block_sum);
  }
#endif
};

#endif  // CADENCE_HAVE_AVX2

}  // namespace gguf
}  // namespace cadence_kernels
