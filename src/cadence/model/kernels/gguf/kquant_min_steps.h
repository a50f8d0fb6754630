// The integer steps of the repacked K-quants whose weights are w = (d * sc) * q - (dmin * mn):
// Q4_K (q4k_x8.h) and Q5_K (q5k_x8.h), for the tiles of kquant_tiles.h (KQuantTiles<MinSteps<U>>).
// Both share an octet's 128-byte block header (MIN_HEADER_*)
//   d[8], dmin[8]     fp16, the blocks' own (the tiles widen them: halves8_ps)
//   s[12][8]          uint8, [byte][column]: each column's 12 bytes of 6-bit scales and minimums
//                     as the file packs them (group_scales / group_mins unpack a group's 8 columns)
// (the file's bytes, no more: with the scales and minimums a byte each and d, dmin widened to
// float32 an octet held 64 bytes more per 256-block, +5.6% for Q4_K, streamed by every decode step)
// and differ only in how a group's k-octet unpacks into q bytes: the format's policy U, a template
// parameter (its unpack inlines into every step), gives
//   BYTES              an octet's bytes per 256-block
//   LINES, line(j, l)  the cache lines of group j's quants: line l's offset in a block (prefetch_group)
//   CHUNK              k-octets whose sums stay exact in int16 before the scale (Q4_K 4, Q5_K 2)
//   AVX2_GEMV_OCTETS   octets per AVX2 decode tile (as many as the 16 registers hold)
//   unpack_256(b, j, kk, lo, hi)       k-octet kk of group j of the block at b: per column's 4
//                                      bytes t, the q of position 8kk + t (lo) and 8kk + 4 + t (hi)
//   unpack_512(b0, b1, j, kk, lo, hi)  the same for two octets' blocks, in a register's halves
//
// The groups' 6-bit scales and minimums apply in integers, the float work once per 256-block
// (llama.cpp's q4_K x q8_K idea). Per (row, column), group and chunk of CHUNK k-octets: the low
// and the high positions' sums of q * x (16 products of q <= 15, or 8 of q <= 31, times |x| <=
// 127: <= 30480 / 31496, an int16) times the group's scale (<= 63) into the block's int32 sum
// (< 2^26: exact); the minimums' terms, sum_j mn_j * (the row's exact group sum of x, |.| <=
// 4064: QuantizedRows::group_sum), into a second int32 (< 2^21). Every tile computes these same
// integers for a column.
#pragma once

#include <cstdint>
#include <cstring>

#include "../avx2/q4_gemm.h"
#include "kquant_tiles.h"

namespace cadence_kernels {
namespace gguf {

// Offsets in the block header above, and its size.
constexpr int64_t MIN_HEADER_DMIN = 16, MIN_HEADER_SCALES = 32, MIN_HEADER_BYTES = 128;

// The file's 12 scale bytes of a column: bytes 0-3 the scales of groups 0-3 (6 bits) with bits 4-5
// of groups 4-7's in their top 2; bytes 4-7 the same for the minimums; bytes 8-11 groups 4-7's
// low 4 bits, the scale's in the low nibble and the minimum's in the high one. Byte `byte` of an
// octet's 8 columns, one column per byte of the uint64.
inline uint64_t header_bytes(const uint8_t* b, int byte) {
  uint64_t v;
  std::memcpy(&v, b + MIN_HEADER_SCALES + 8 * byte, sizeof(v));
  return v;
}
constexpr uint64_t BYTES_3F = 0x3F3F3F3F3F3F3F3FULL, BYTES_30 = 0x3030303030303030ULL, BYTES_0F = 0x0F0F0F0F0F0F0F0FULL;
// Group j's 6-bit scales of the octet's 8 columns (byte c: column c). The shifts move bits within
// each byte only: the masks drop what crosses from the neighbour byte.
inline uint64_t group_scales(const uint8_t* b, int j) {
  if (j < 4) return header_bytes(b, j) & BYTES_3F;
  return (header_bytes(b, j + 4) & BYTES_0F) | ((header_bytes(b, j - 4) >> 2) & BYTES_30);
}
// Group j's 6-bit minimums, as group_scales.
inline uint64_t group_mins(const uint8_t* b, int j) {
  if (j < 4) return header_bytes(b, j + 4) & BYTES_3F;
  return ((header_bytes(b, j + 4) >> 4) & BYTES_0F) | ((header_bytes(b, j) >> 2) & BYTES_30);
}

#if CADENCE_HAVE_AVX2

// Groups j and j + 1's minimums side by side (min_words' input).
inline __m128i group_mins_pair(const uint8_t* b, int j) {
  return _mm_set_epi64x(static_cast<int64_t>(group_mins(b, j + 1)), static_cast<int64_t>(group_mins(b, j)));
}

// Byte c of rows j and j + 1 of an octet's [group][column] minimums side by side (per 128 bits).
inline __m128i min_pairs_order() { return _mm_setr_epi8(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15); }
// The minimums of groups j, j + 1 (group_mins_pair: [group][column]) as int32 lanes of int16 pairs
// (mn_j, mn_j+1), one lane per column.
inline __m256i min_words(__m128i mins) { return _mm256_cvtepu8_epi16(_mm_shuffle_epi8(mins, min_pairs_order())); }
// Group sums j, j + 1 of a row (int16, adjacent) in every int32 lane.
inline int32_t sum_pair(const avx2::QuantizedRows& xq, int64_t row, int64_t group) {
  int32_t v;
  std::memcpy(&v, xq.group_sum.data() + row * (xq.K / avx2::Q8_GROUP) + group, sizeof(v));
  return v;
}

#ifdef CADENCE_GGUF_X16
// min_words for two octets: 8 columns of a, then 8 of b.
inline __m512i min_words_pair(__m128i a, __m128i b) {
  const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1);
  const __m256i order = _mm256_broadcastsi128_si256(min_pairs_order());
  return _mm512_cvtepu8_epi16(_mm256_shuffle_epi8(both, order));
}
// Group j's scales of the octets at a, then b, zero-extended into int32 lanes (byte, 0):
// word_dot_add_512's multiplier.
inline __m512i scale_words_pair(const uint8_t* a, const uint8_t* b, int j) {
  return _mm512_cvtepu8_epi32(_mm_set_epi64x(static_cast<int64_t>(group_scales(b, j)), static_cast<int64_t>(group_scales(a, j))));
}
// Per int32 lane, lo's sum in the low int16 and hi's in the high one (both int16): one vpdpwssd by
// (sc, sc) then adds lo * sc + hi * sc, the two sums' scaled terms in one instruction.
inline __m512i lo_hi_words(__m512i lo, __m512i hi) {
  return _mm512_mask_blend_epi16(0xAAAAAAAA, lo, _mm512_slli_epi32(hi, 16));
}
#endif

template <class U>
struct MinSteps {
  using Unpack = U;
  static constexpr bool MINIMUMS = true;
  static constexpr int64_t DMIN = MIN_HEADER_DMIN;
  static constexpr int X16_GEMV_PAIRS = 4;  // a decode row's octets eight at a time (kquant_x8_columns)
  static constexpr int AVX2_GEMV_OCTETS = U::AVX2_GEMV_OCTETS;

  // Group j of R rows x O octets (maddubs, no VNNI), as llama.cpp's AVX2 K-quant kernels: per
  // chunk the maddubs' int16 pair sums add up in int16, one madd by the group's scale (int16
  // pairs of sc) adds them into the block's int32 sum.
  template <int R, int O>
  static void group_avx2(const avx2::QuantizedRows& xq, int64_t m0, int64_t k0, const uint8_t* const* b, int j,
                         __m256i (&block_sum)[R][O]) {
    // Byte c of a group's 8 scales into both int16 halves of 32-bit lane c (high bytes zero).
    const __m256i scale_pairs = _mm256_setr_epi8(0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1,
                                                 4, -1, 4, -1, 5, -1, 5, -1, 6, -1, 6, -1, 7, -1, 7, -1);
    for (int c = 0; c < 4; c += U::CHUNK) {
      __m256i chunk_sum[R][O];
      for (int kk = c; kk < c + U::CHUNK; ++kk) {
        __m256i lo[O], hi[O];
        for (int i = 0; i < O; ++i) U::unpack_256(b[i], j, kk, lo[i], hi[i]);
        maddubs_pairs<R, O>(xq, m0, k0 + kk * 8, lo, hi, [&](int r, int i, __m256i pairs) {
          chunk_sum[r][i] = kk == c ? pairs : _mm256_add_epi16(chunk_sum[r][i], pairs);
        });
      }
      for (int i = 0; i < O; ++i) {
        const __m256i sc16 = _mm256_shuffle_epi8(_mm256_set1_epi64x(static_cast<int64_t>(group_scales(b[i], j))), scale_pairs);
        for (int r = 0; r < R; ++r)
          block_sum[r][i] = _mm256_add_epi32(block_sum[r][i], _mm256_madd_epi16(chunk_sum[r][i], sc16));
      }
    }
  }

  // The minimums' sums of octet i (block at b) for R rows, once per block after the groups (their
  // registers free by then: 4 rows' sums stay within AVX2's 16): the 4 int16 pair vectors (mn_j,
  // mn_j+1), per row one madd each by the row's (sum_j, sum_j+1) (the minimums in float per group
  // cost a GEMV ~8% of its instructions).
  template <int R, int O>
  static void block_avx2(const avx2::QuantizedRows& xq, const int32_t* /*half_sums*/, int64_t m0, int64_t blk,
                         int64_t /*K*/, const uint8_t* b, int /*i*/, __m256i (&/*block_sum*/)[R][O], __m256i (&mins)[R]) {
    __m256i mn[4];
    for (int jp = 0; jp < 4; ++jp) mn[jp] = min_words(group_mins_pair(b, 2 * jp));
    for (int r = 0; r < R; ++r) {
      mins[r] = _mm256_madd_epi16(mn[0], _mm256_set1_epi32(sum_pair(xq, m0 + r, blk * 8)));
      for (int jp = 1; jp < 4; ++jp)
        mins[r] = _mm256_add_epi32(mins[r], _mm256_madd_epi16(mn[jp], _mm256_set1_epi32(sum_pair(xq, m0 + r, blk * 8 + 2 * jp))));
    }
  }

#ifdef CADENCE_GGUF_X16
  // Group j of R rows against two octets' blocks (b0, b1: a register's halves). Per row and chunk
  // the low and the high positions' vpdpbusd sums (two independent chains: their latency, not
  // memory, bounded a one-chain GEMV) share one int32 lane as two int16s, and one vpdpwssd by (sc,
  // sc) adds both scaled terms to the block's sum (one multiply-port instruction instead of two:
  // the same exact int32).
  template <int R>
  static void group_x16(const avx2::QuantizedRows& xq, int64_t m0, int64_t k0, const uint8_t* b0, const uint8_t* b1,
                        int j, __m512i (&block_sum)[R]) {
    const __m512i sc = scale_words_pair(b0, b1, j);
    const __m512i sc2 = _mm512_or_si512(sc, _mm512_slli_epi32(sc, 16));
    for (int c = 0; c < 4; c += U::CHUNK) {
      __m512i lo_sum[R], hi_sum[R];
      for (int r = 0; r < R; ++r) lo_sum[r] = hi_sum[r] = _mm512_setzero_si512();
      for (int kk = c; kk < c + U::CHUNK; ++kk) {
        __m512i lo, hi;
        U::unpack_512(b0, b1, j, kk, lo, hi);
        for (int r = 0; r < R; ++r) {
          const int8_t* x = xq.q_at(m0 + r, k0 + kk * 8);
          lo_sum[r] = udot4_add_512_at(lo_sum[r], lo, x);
          hi_sum[r] = udot4_add_512_at(hi_sum[r], hi, x + 4);
        }
      }
      for (int r = 0; r < R; ++r) block_sum[r] = word_dot_add_512(block_sum[r], lo_hi_words(lo_sum[r], hi_sum[r]), sc2);
    }
  }

  // Group j of one row against P pairs of octets (b[2p], b[2p + 1]): group_x16<1>'s sums, each
  // k-octet's activations broadcast once for the P pairs.
  template <int P>
  static void group_gemv(const avx2::QuantizedRows& xq, int64_t k0, const uint8_t* const* b, int j,
                         __m512i (&block_sum)[P]) {
    for (int c = 0; c < 4; c += U::CHUNK) {
      __m512i lo_sum[P], hi_sum[P];
      for (int p = 0; p < P; ++p) lo_sum[p] = hi_sum[p] = _mm512_setzero_si512();
      for (int kk = c; kk < c + U::CHUNK; ++kk) {
        const __m512i x_lo = broadcast4_512(xq.q_at(0, k0 + kk * 8)), x_hi = broadcast4_512(xq.q_at(0, k0 + kk * 8 + 4));
        for (int p = 0; p < P; ++p) {
          __m512i lo, hi;
          U::unpack_512(b[2 * p], b[2 * p + 1], j, kk, lo, hi);
          lo_sum[p] = udot4_add_512(lo_sum[p], lo, x_lo);
          hi_sum[p] = udot4_add_512(hi_sum[p], hi, x_hi);
        }
      }
      for (int p = 0; p < P; ++p) {
        const __m512i sc = scale_words_pair(b[2 * p], b[2 * p + 1], j);
        block_sum[p] = word_dot_add_512(word_dot_add_512(block_sum[p], lo_sum[p], sc), hi_sum[p], sc);
      }
    }
  }

  // The minimums' sums of R rows against two octets' blocks: one vpdpwssd per two groups.
  template <int R>
  static void block_x16(const avx2::QuantizedRows& xq, const int32_t* /*half_sums*/, int64_t m0, int64_t blk,
                        int64_t /*K*/, const uint8_t* b0, const uint8_t* b1, __m512i* /*block_sum*/, __m512i* mins) {
    for (int jp = 0; jp < 4; ++jp) {
      const __m512i mn = min_words_pair(group_mins_pair(b0, 2 * jp), group_mins_pair(b1, 2 * jp));
      for (int r = 0; r < R; ++r)
        mins[r] = word_dot_add_512(mins[r], mn, _mm512_set1_epi32(sum_pair(xq, m0 + r, blk * 8 + 2 * jp)));
    }
  }
#endif
};

#endif  // CADENCE_HAVE_AVX2

}  // namespace gguf
}  // namespace cadence_kernels
