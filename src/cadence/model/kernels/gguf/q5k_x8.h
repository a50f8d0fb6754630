// Q5_K repacked at load, losslessly, with 8 columns interleaved: Q4_K's octets (q4k_x8.h) plus
// each weight's fifth bit. The row-wise codec (blocks.h CodecQ5_K, int_gemm.h) pays a float
// convert, multiply and FMA per column and group of 32 k and decodes the fifth bits of one column
// per register; here 8 columns share every register, and the groups' 6-bit scales and minimums
// apply in integers with the float work once per 256-block, exactly as repacked Q4_K does.
//
// Layout: per octet of columns (8o .. 8o + 7), per 256-block, Q5K_X8_BYTES bytes:
//   d[8], dmin[8], sc[8][8], mn[8][8]  Q4_K's 192-byte header (q4k_x8.h)
//   per group j (Q5K_X8_GROUP bytes each, the group's bytes together: one stream per octet):
//     q[4][8][4]   [k-octet][column][byte]: byte t of k-octet kk holds the low 4 bits of
//                  q[8kk + t] in its low nibble and of q[8kk + 4 + t] in its high one (Q4_K's)
//     hb[8][4]     [column][byte]: byte c * 4 + t holds the fifth bits of k-octet kk's two
//                  values of that byte position: bit 4 + kk the low nibble's (q[8kk + t]), bit kk
//                  the high nibble's (q[8kk + 4 + t])
// 1472 bytes per 2048 weights (the file's blocks: 1408, +4.5%). w = (d * sc) * q5 - (dmin * mn),
// q5 in [0, 31], the values gguf-py's dequantization gives. With that bit order the fifth bits of
// k-octet kk reach bit 4 of each byte by one 16-bit shift each (right by kk for the low nibbles,
// left by 4 - kk for the high ones; neither moves a bit across a byte into bit 4).
//
// Exact integers: a q5 byte times an activation byte is <= 31 * 127; the tiles sum 8 products per
// int16 lane or int32 lane before the scale (two k-octets of one nibble half: <= 31496, an
// int16), apply the 6-bit scale (<= 63) in integers into the block's int32 sum (8 groups x 2 x 2 x
// 31496 x 63 < 2^26) and take the minimums as repacked Q4_K does (the same header, the same
// integers). Then per block and column: acc += float(sum) * (d * x_scale), acc -= float(min_sum) *
// (dmin * x_scale). Every tile below (the AVX2 tier's R rows x O octets, used on every tier for a
// lone octet; the AVX-512 tiers' 16-column tiles and decode rows) computes the same exact integer
// sums and runs the same float steps lane for lane in this order, so a column's bits do not depend
// on the tile, the rows beside it, the thread split or the tier.
#pragma once

#include <cstdint>
#include <cstring>

#include "q4k_x8.h"

namespace cadence_kernels {
namespace gguf {

constexpr int64_t Q5K_X8_BYTES = 1472;
constexpr int64_t Q5K_X8_GROUP = 160;  // 128 bytes of nibbles, 32 of fifth bits
constexpr int64_t Q5K_X8_HEADER = 192;

#if CADENCE_HAVE_AVX2

// Octet o of a Q5_K weight (row-wise blocks of 176 bytes: d, dmin, 12 scale bytes, 32 qh, 128 qs;
// row_bytes per column) into `out` (K / 256 * Q5K_X8_BYTES bytes).
inline void repack_q5k_x8_octet(const uint8_t* w, int64_t row_bytes, int64_t K, int64_t o, uint8_t* out) {
  for (int64_t blk = 0; blk < K / 256; ++blk) {
    uint8_t* dst = out + blk * Q5K_X8_BYTES;
    float* d = reinterpret_cast<float*>(dst);
    uint8_t* sc = dst + 64;
    uint8_t* mn = dst + 128;
    for (int i = 0; i < 8; ++i) {
      const uint8_t* raw = w + (8 * o + i) * row_bytes + blk * 176;
      const float dv = half_at(raw), dminv = half_at(raw + 2);
      std::memcpy(d + i, &dv, 4);
      std::memcpy(d + 8 + i, &dminv, 4);
      const uint8_t* s = raw + 4;
      const uint8_t* qh = raw + 16;
      for (int j = 0; j < 8; ++j) {
        sc[j * 8 + i] = static_cast<uint8_t>(j < 4 ? s[j] & 63 : (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4));
        mn[j * 8 + i] = static_cast<uint8_t>(j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4));
        const uint8_t* qs = raw + 48 + 32 * (j / 2);
        const int shift = 4 * (j % 2);
        uint8_t* q = dst + Q5K_X8_HEADER + j * Q5K_X8_GROUP;
        uint8_t* hb = q + 128;
        for (int t = 0; t < 4; ++t) {
          int bits = 0;
          for (int kk = 0; kk < 4; ++kk) {
            const int lo = 8 * kk + t, hi = 8 * kk + 4 + t;  // element l of group j
            q[(kk * 8 + i) * 4 + t] =
                static_cast<uint8_t>(((qs[lo] >> shift) & 0x0F) | (((qs[hi] >> shift) & 0x0F) << 4));
            bits |= ((qh[lo] >> j) & 1) << (4 + kk);
            bits |= ((qh[hi] >> j) & 1) << kk;
          }
          hb[i * 4 + t] = static_cast<uint8_t>(bits);
        }
      }
    }
  }
}

// k-octet kk's q5 bytes of the low nibbles (and of the high ones) of v, the fifth bits from hb.
inline __m256i q5_low_256(__m256i v, __m256i hb, int kk) {
  return _mm256_or_si256(_mm256_and_si256(v, _mm256_set1_epi8(0x0F)),
                         _mm256_and_si256(_mm256_srli_epi16(hb, kk), _mm256_set1_epi8(0x10)));
}
inline __m256i q5_high_256(__m256i v, __m256i hb, int kk) {
  return _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F)),
                         _mm256_and_si256(_mm256_slli_epi16(hb, 4 - kk), _mm256_set1_epi8(0x10)));
}

// R rows x O octets with maddubs (every tier: the AVX2 tier's tiles, and the AVX-512 tiers' lone
// octet). Per (row, octet), group and half (k-octets 0-1, then 2-3) the four maddubs' int16 pair
// sums add up in int16 (8 products of q5 <= 31 and |x| <= 127: <= 31496), one madd by the
// group's scale (int16 pairs of sc) adds them into the block's int32 sum. The minimums and the
// float steps are repacked Q4_K's (q4k_x8_tile_avx2).
template <int R, int O>
inline void q5k_x8_tile_avx2(const avx2::QuantizedRows& xq, int64_t m0, const uint8_t* packed, int64_t octet_bytes,
                             int64_t K, float* out, int64_t ldo, int64_t n0) {
  __m256 acc[R][O];
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < O; ++i) acc[r][i] = _mm256_setzero_ps();
  // Byte c of a group's 8 scales into both int16 halves of 32-bit lane c (high bytes zero).
  const __m256i scale_pairs = _mm256_setr_epi8(0, -1, 0, -1, 1, -1, 1, -1, 2, -1, 2, -1, 3, -1, 3, -1,
                                               4, -1, 4, -1, 5, -1, 5, -1, 6, -1, 6, -1, 7, -1, 7, -1);
  const int64_t groups = K / avx2::Q8_GROUP;
  for (int64_t blk = 0; blk < K / 256; ++blk) {
    __m256i block_sum[R][O];
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < O; ++i) block_sum[r][i] = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
      const int64_t k0 = (blk * 8 + j) * avx2::Q8_GROUP;
      const uint8_t* g[O];
      for (int i = 0; i < O; ++i) {
        g[i] = packed + i * octet_bytes + blk * Q5K_X8_BYTES + Q5K_X8_HEADER + j * Q5K_X8_GROUP;
        prefetch_tile_line<R>(g[i]);
        prefetch_tile_line<R>(g[i] + 64);
        prefetch_tile_line<R>(g[i] + 128);
      }
      for (int half = 0; half < 2; ++half) {
        __m256i half_sum[R][O];
        for (int k2 = 0; k2 < 2; ++k2) {
          const int kk = 2 * half + k2;
          __m256i lo[O], hi[O];
          for (int i = 0; i < O; ++i) {
            const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g[i] + kk * 32));
            const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g[i] + 128));
            lo[i] = q5_low_256(v, hb, kk);
            hi[i] = q5_high_256(v, hb, kk);
          }
          for (int r = 0; r < R; ++r) {
            const int8_t* x = xq.q_at(m0 + r, k0 + kk * 8);
            const __m256i x_lo = avx2::broadcast4(x), x_hi = avx2::broadcast4(x + 4);
            for (int i = 0; i < O; ++i) {
              const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo[i], x_lo), _mm256_maddubs_epi16(hi[i], x_hi));
              half_sum[r][i] = k2 == 0 ? pairs : _mm256_add_epi16(half_sum[r][i], pairs);
            }
          }
        }
        for (int i = 0; i < O; ++i) {
          int64_t scales;
          std::memcpy(&scales, packed + i * octet_bytes + blk * Q5K_X8_BYTES + 64 + 8 * j, sizeof(scales));
          const __m256i sc16 = _mm256_shuffle_epi8(_mm256_set1_epi64x(scales), scale_pairs);
          for (int r = 0; r < R; ++r)
            block_sum[r][i] = _mm256_add_epi32(block_sum[r][i], _mm256_madd_epi16(half_sum[r][i], sc16));
        }
      }
    }
    for (int i = 0; i < O; ++i) {
      const uint8_t* hdr = packed + i * octet_bytes + blk * Q5K_X8_BYTES;
      const __m256 d = _mm256_loadu_ps(reinterpret_cast<const float*>(hdr));
      const __m256 dmin = _mm256_loadu_ps(reinterpret_cast<const float*>(hdr + 32));
      __m256i mn[4];
      for (int jp = 0; jp < 4; ++jp) mn[jp] = min_words(hdr + 128 + 16 * jp);
      for (int r = 0; r < R; ++r) {
        __m256i min_sum = _mm256_madd_epi16(mn[0], _mm256_set1_epi32(sum_pair(xq, m0 + r, blk * 8)));
        for (int jp = 1; jp < 4; ++jp)
          min_sum = _mm256_add_epi32(min_sum, _mm256_madd_epi16(mn[jp], _mm256_set1_epi32(sum_pair(xq, m0 + r, blk * 8 + 2 * jp))));
        const __m256 xs = _mm256_set1_ps(xq.scale[(m0 + r) * groups + blk * 8]);
        acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(block_sum[r][i]), _mm256_mul_ps(d, xs), acc[r][i]);
        acc[r][i] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(min_sum), _mm256_mul_ps(dmin, xs), acc[r][i]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < O; ++i) _mm256_storeu_ps(out + (m0 + r) * ldo + n0 + 8 * i, acc[r][i]);
}

template <int R>
inline void q5k_x8_rows_avx2(const avx2::QuantizedRows& xq, int64_t m0, int64_t rows, const uint8_t* packed,
                             int64_t octet_bytes, int64_t K, float* out, int64_t ldo, int64_t n0) {
  int64_t m = m0;
  for (; m + R <= m0 + rows; m += R) q5k_x8_tile_avx2<R, 1>(xq, m, packed, octet_bytes, K, out, ldo, n0);
  if constexpr (R > 1) {
    if (m < m0 + rows) q5k_x8_rows_avx2<R - 1>(xq, m, m0 + rows - m, packed, octet_bytes, K, out, ldo, n0);
  }
}

// Rows per prefill tile of a lone octet (every tier) and of the AVX2 tier's octets.
constexpr int Q5K_AVX2_ROWS = 4;

#ifdef CADENCE_GGUF_X16
// The AVX-512 tiers: two octets per 512-bit register (x16_pairs.h). Per (row, pair), group and
// half, the low and the high nibbles' vpdpbusd sums (two chains, 8 products each: |s| <= 31496)
// share one int32 lane as two int16s and one vpdpwssd by (sc, sc) adds both scaled terms to the
// block's sum (q4k_x16_tile's step, once per half). The q5 bytes: (v & 0x0F) | fifth bits, one
// vpternlogd each.

// (v & 0x0F) | t: ternary logic on (v, t, 0x0F per byte), t holding bit 4 only.
inline __m512i merge_low4(__m512i v, __m512i t) {
  return _mm512_ternarylogic_epi32(v, t, _mm512_set1_epi8(0x0F), 0xEC);
}
inline __m512i q5_low_512(__m512i v, __m512i hb, int kk) {
  return merge_low4(v, _mm512_and_si512(_mm512_srli_epi16(hb, kk), _mm512_set1_epi8(0x10)));
}
inline __m512i q5_high_512(__m512i v, __m512i hb, int kk) {
  return merge_low4(_mm512_srli_epi16(v, 4), _mm512_and_si512(_mm512_slli_epi16(hb, 4 - kk), _mm512_set1_epi8(0x10)));
}

// Rows per 16-column tile: 8 rows' block, low and high sums (24 registers) beside the decoded
// weights; the float accumulators wait in `out` between blocks (q4k_x16_tile).
constexpr int Q5K_X16_ROWS = 8;

// R rows against the octets at `packed` and packed + octet_bytes.
template <int R>
inline void q5k_x16_tile(const avx2::QuantizedRows& xq, int64_t m0, const uint8_t* packed, int64_t octet_bytes,
                         int64_t K, float* out, int64_t ldo, int64_t n0) {
  const int64_t groups = K / avx2::Q8_GROUP;
  for (int64_t blk = 0; blk < K / 256; ++blk) {
    const uint8_t* h0 = packed + blk * Q5K_X8_BYTES;
    const uint8_t* h1 = h0 + octet_bytes;
    _mm_prefetch(reinterpret_cast<const char*>(h0 + PREFETCH_AHEAD), PREFETCH_HINT);
    _mm_prefetch(reinterpret_cast<const char*>(h1 + PREFETCH_AHEAD), PREFETCH_HINT);
    __m512i block_sum[R];
    for (int r = 0; r < R; ++r) block_sum[r] = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) {
      const int64_t k0 = (blk * 8 + j) * avx2::Q8_GROUP;
      const uint8_t* g0 = h0 + Q5K_X8_HEADER + j * Q5K_X8_GROUP;
      const uint8_t* g1 = h1 + Q5K_X8_HEADER + j * Q5K_X8_GROUP;
      for (int line = 0; line < 3; ++line) {
        _mm_prefetch(reinterpret_cast<const char*>(g0 + PREFETCH_AHEAD + 64 * line), PREFETCH_HINT);
        _mm_prefetch(reinterpret_cast<const char*>(g1 + PREFETCH_AHEAD + 64 * line), PREFETCH_HINT);
      }
      const __m512i hb = load_pair(g0 + 128, g1 + 128);
      const __m512i sc = scale_words_pair(h0 + 64 + 8 * j, h1 + 64 + 8 * j);
      const __m512i sc2 = _mm512_or_si512(sc, _mm512_slli_epi32(sc, 16));
      for (int half = 0; half < 2; ++half) {
        __m512i lo_sum[R], hi_sum[R];
        for (int r = 0; r < R; ++r) lo_sum[r] = hi_sum[r] = _mm512_setzero_si512();
        for (int k2 = 0; k2 < 2; ++k2) {
          const int kk = 2 * half + k2;
          const __m512i v = load_pair(g0 + kk * 32, g1 + kk * 32);
          const __m512i lo = q5_low_512(v, hb, kk), hi = q5_high_512(v, hb, kk);
          for (int r = 0; r < R; ++r) {
            const int8_t* x = xq.q_at(m0 + r, k0 + kk * 8);
            lo_sum[r] = udot4_add_512_at(lo_sum[r], lo, x);
            hi_sum[r] = udot4_add_512_at(hi_sum[r], hi, x + 4);
          }
        }
        for (int r = 0; r < R; ++r)
          block_sum[r] = word_dot_add_512(block_sum[r], lo_hi_words(lo_sum[r], hi_sum[r]), sc2);
      }
    }
    __m512i min_sum[R];
    for (int r = 0; r < R; ++r) min_sum[r] = _mm512_setzero_si512();
    for (int jp = 0; jp < 4; ++jp) {
      const __m512i mn = min_words_pair(h0 + 128 + 16 * jp, h1 + 128 + 16 * jp);
      for (int r = 0; r < R; ++r)
        min_sum[r] = word_dot_add_512(min_sum[r], mn, _mm512_set1_epi32(sum_pair(xq, m0 + r, blk * 8 + 2 * jp)));
    }
    const __m512 d = load_pair_ps(h0, h1), dmin = load_pair_ps(h0 + 32, h1 + 32);
    for (int r = 0; r < R; ++r) {
      float* o = out + (m0 + r) * ldo + n0;
      const __m512 xs = _mm512_set1_ps(xq.scale[(m0 + r) * groups + blk * 8]);
      __m512 acc = blk == 0 ? _mm512_setzero_ps() : load_pair_ps(reinterpret_cast<const uint8_t*>(o),
                                                                 reinterpret_cast<const uint8_t*>(o + 8));
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(block_sum[r]), _mm512_mul_ps(d, xs), acc);
      acc = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(min_sum[r]), _mm512_mul_ps(dmin, xs), acc);
      store_pair(o, acc);
    }
  }
}

// One row (a decode step) against P pairs of octets at once (2P consecutive octets): the tile's
// operations lane for lane with P pairs' memory streams and dot-product chains in flight.
template <int P>
inline void q5k_x16_gemv(const avx2::QuantizedRows& xq, const uint8_t* packed, int64_t octet_bytes, int64_t K,
                         float* out) {
  __m512 acc[P];
  for (int p = 0; p < P; ++p) acc[p] = _mm512_setzero_ps();
  for (int64_t blk = 0; blk < K / 256; ++blk) {
    const uint8_t* h[2 * P];
    for (int i = 0; i < 2 * P; ++i) {
      h[i] = packed + i * octet_bytes + blk * Q5K_X8_BYTES;
      _mm_prefetch(reinterpret_cast<const char*>(h[i] + PREFETCH_AHEAD), PREFETCH_HINT);
    }
    __m512i block_sum[P];
    for (int p = 0; p < P; ++p) block_sum[p] = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) {
      const int64_t k0 = (blk * 8 + j) * avx2::Q8_GROUP;
      const int64_t at = Q5K_X8_HEADER + j * Q5K_X8_GROUP;
      for (int i = 0; i < 2 * P; ++i)
        for (int line = 0; line < 3; ++line)
          _mm_prefetch(reinterpret_cast<const char*>(h[i] + at + PREFETCH_AHEAD + 64 * line), PREFETCH_HINT);
      __m512i sc2[P];
      for (int p = 0; p < P; ++p) {
        const __m512i sc = scale_words_pair(h[2 * p] + 64 + 8 * j, h[2 * p + 1] + 64 + 8 * j);
        sc2[p] = _mm512_or_si512(sc, _mm512_slli_epi32(sc, 16));
      }
      for (int half = 0; half < 2; ++half) {
        __m512i lo_sum[P], hi_sum[P];
        for (int p = 0; p < P; ++p) lo_sum[p] = hi_sum[p] = _mm512_setzero_si512();
        for (int k2 = 0; k2 < 2; ++k2) {
          const int kk = 2 * half + k2;
          const __m512i x_lo = broadcast4_512(xq.q_at(0, k0 + kk * 8)), x_hi = broadcast4_512(xq.q_at(0, k0 + kk * 8 + 4));
          for (int p = 0; p < P; ++p) {
            const __m512i v = load_pair(h[2 * p] + at + kk * 32, h[2 * p + 1] + at + kk * 32);
            const __m512i hb = load_pair(h[2 * p] + at + 128, h[2 * p + 1] + at + 128);
            lo_sum[p] = udot4_add_512(lo_sum[p], q5_low_512(v, hb, kk), x_lo);
            hi_sum[p] = udot4_add_512(hi_sum[p], q5_high_512(v, hb, kk), x_hi);
          }
        }
        for (int p = 0; p < P; ++p)
          block_sum[p] = word_dot_add_512(block_sum[p], lo_hi_words(lo_sum[p], hi_sum[p]), sc2[p]);
      }
    }
    __m512i min_sum[P];
    for (int p = 0; p < P; ++p) min_sum[p] = _mm512_setzero_si512();
    for (int jp = 0; jp < 4; ++jp) {
      const __m512i sums = _mm512_set1_epi32(sum_pair(xq, 0, blk * 8 + 2 * jp));
      for (int p = 0; p < P; ++p)
        min_sum[p] = word_dot_add_512(min_sum[p], min_words_pair(h[2 * p] + 128 + 16 * jp, h[2 * p + 1] + 128 + 16 * jp), sums);
    }
    const __m512 xs = _mm512_set1_ps(xq.scale[blk * 8]);
    for (int p = 0; p < P; ++p) {
      const __m512 d = load_pair_ps(h[2 * p], h[2 * p + 1]), dmin = load_pair_ps(h[2 * p] + 32, h[2 * p + 1] + 32);
      acc[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(block_sum[p]), _mm512_mul_ps(d, xs), acc[p]);
      acc[p] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(min_sum[p]), _mm512_mul_ps(dmin, xs), acc[p]);
    }
  }
  for (int p = 0; p < P; ++p) store_pair(out + 16 * p, acc[p]);
}

template <int R>
inline void q5k_x16_rows(const avx2::QuantizedRows& xq, int64_t m0, int64_t rows, const uint8_t* packed,
                         int64_t octet_bytes, int64_t K, float* out, int64_t ldo, int64_t n0) {
  int64_t m = m0;
  for (; m + R <= m0 + rows; m += R) q5k_x16_tile<R>(xq, m, packed, octet_bytes, K, out, ldo, n0);
  if constexpr (R > 1) {
    if (m < m0 + rows) q5k_x16_rows<R - 1>(xq, m, m0 + rows - m, packed, octet_bytes, K, out, ldo, n0);
  }
}
#endif

// Octets [o_begin, o_end) of a repacked Q5_K weight for every row. A decode row takes the octets
// eight at a time on the AVX-512 tiers (four pairs in flight, as Q4_K), then four, two, one; on
// the AVX2 tier four, then two, one (its 16 registers: four octets' sums and decoded weights).
// More rows: row blocks that stay in L2, tiles of 8 rows x 16 columns (AVX-512) or 4 x 8.
inline void q5k_x8_columns(const avx2::QuantizedRows& xq, int64_t M, const uint8_t* packed, int64_t K, float* out,
                           int64_t ldo, int64_t o_begin, int64_t o_end) {
  const int64_t octet_bytes = K / 256 * Q5K_X8_BYTES;
#ifdef CADENCE_GGUF_X16
  if (M == 1) {
    int64_t o = o_begin;
    for (; o + 8 <= o_end; o += 8) q5k_x16_gemv<4>(xq, packed + o * octet_bytes, octet_bytes, K, out + 8 * o);
    for (; o + 4 <= o_end; o += 4) q5k_x16_gemv<2>(xq, packed + o * octet_bytes, octet_bytes, K, out + 8 * o);
    for (; o + 2 <= o_end; o += 2) q5k_x16_tile<1>(xq, 0, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
    if (o < o_end) q5k_x8_tile_avx2<1, 1>(xq, 0, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
    return;
  }
  const int64_t row_block = std::max<int64_t>(Q5K_X16_ROWS, (256 << 10) / K / Q5K_X16_ROWS * Q5K_X16_ROWS);
  for (int64_t mb = 0; mb < M; mb += row_block) {
    const int64_t rows = std::min(row_block, M - mb);
    int64_t o = o_begin;
    for (; o + 2 <= o_end; o += 2)
      q5k_x16_rows<Q5K_X16_ROWS>(xq, mb, rows, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
    if (o < o_end) q5k_x8_rows_avx2<Q5K_AVX2_ROWS>(xq, mb, rows, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
  }
#else
  if (M == 1) {
    int64_t o = o_begin;
    for (; o + 4 <= o_end; o += 4) q5k_x8_tile_avx2<1, 4>(xq, 0, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
    for (; o + 2 <= o_end; o += 2) q5k_x8_tile_avx2<1, 2>(xq, 0, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
    if (o < o_end) q5k_x8_tile_avx2<1, 1>(xq, 0, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
    return;
  }
  const int64_t row_block = std::max<int64_t>(Q5K_AVX2_ROWS, (256 << 10) / K / Q5K_AVX2_ROWS * Q5K_AVX2_ROWS);
  for (int64_t mb = 0; mb < M; mb += row_block) {
    const int64_t rows = std::min(row_block, M - mb);
    for (int64_t o = o_begin; o < o_end; ++o)
      q5k_x8_rows_avx2<Q5K_AVX2_ROWS>(xq, mb, rows, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
  }
#endif
}

#endif  // CADENCE_HAVE_AVX2

}  // namespace gguf
}  // namespace cadence_kernels
