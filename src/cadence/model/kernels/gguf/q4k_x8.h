// Q4_K repacked at load, losslessly, with 8 columns interleaved (llama.cpp's repack idea): the
// row-wise kernel (int_gemm.h) spends a float convert, multiply and FMA per column and group of
// 32 k; with the columns in the lanes of one register, that work is shared by 8 columns, and a
// decode step runs ~8x fewer instructions per weight.
//
// Layout: per octet of columns (8o .. 8o + 7), per 256-block, Q4K_X8_BYTES bytes:
//   d[8], dmin[8]     float32 (the blocks' fp16 values, exact)
//   sc[8][8], mn[8][8] uint8, [group][column] (the 6-bit scales and minimums, unpacked)
//   q[8][4][8][4]     [group][k-octet][column][byte]: byte t of k-octet kk holds q[8kk + t] in
//                     its low nibble and q[8kk + 4 + t] in its high one (q4_gemm.h's layout)
// 1216 bytes per 2048 weights (the file's blocks: 1152). w = (d * sc) * q - (dmin * mn), the
// values gguf-py's dequantization gives. Columns past the last whole octet stay row-wise.
#pragma once

#include <cstdint>
#include <cstring>

#include "../avx2/q4_gemm.h"
#include "blocks.h"
#include "x16_pairs.h"

namespace cadence_kernels {
namespace gguf {

constexpr int64_t Q4K_X8_BYTES = 1216;
constexpr int64_t Q4K_X8_HEADER = 192;

#if CADENCE_HAVE_AVX2

// Octet o of a Q4_K weight (row-wise blocks, row_bytes per column) into `out`
// (K / 256 * Q4K_X8_BYTES bytes).
inline void repack_q4k_x8_octet(const uint8_t* w, int64_t row_bytes, int64_t K, int64_t o, uint8_t* out) {
  for (int64_t blk = 0; blk < K / 256; ++blk) {
    uint8_t* dst = out + blk * Q4K_X8_BYTES;
    float* d = reinterpret_cast<float*>(dst);
    uint8_t* sc = dst + 64;
    uint8_t* mn = dst + 128;
    uint8_t* q = dst + Q4K_X8_HEADER;
    for (int i = 0; i < 8; ++i) {
      const uint8_t* raw = w + (8 * o + i) * row_bytes + blk * 144;
      const float dv = half_at(raw), dminv = half_at(raw + 2);
      std::memcpy(d + i, &dv, 4);
      std::memcpy(d + 8 + i, &dminv, 4);
      const uint8_t* s = raw + 4;
      for (int j = 0; j < 8; ++j) {
        const int scale = j < 4 ? s[j] & 63 : (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
        const int minimum = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        sc[j * 8 + i] = static_cast<uint8_t>(scale);
        mn[j * 8 + i] = static_cast<uint8_t>(minimum);
        const uint8_t* qs = raw + 16 + 32 * (j / 2);
        const int shift = 4 * (j % 2);
        for (int kk = 0; kk < 4; ++kk)
          for (int t = 0; t < 4; ++t)
            q[((j * 4 + kk) * 8 + i) * 4 + t] = static_cast<uint8_t>(
                ((qs[8 * kk + t] >> shift) & 0x0F) | (((qs[8 * kk + 4 + t] >> shift) & 0x0F) << 4));
      }
    }
  }
}

// Both tiers' tiles take the minimums' terms in integers from these.

// Byte c of rows j and j + 1 of an octet's [group][column] minimums side by side (per 128 bits).
inline __m128i min_pairs_order() { return _mm_setr_epi8(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15); }
// The minimums of groups j, j + 1 (16 bytes at a, [group][column]) as int32 lanes of int16 pairs
// (mn_j, mn_j+1), one lane per column.
inline __m256i min_words(const uint8_t* a) {
  return _mm256_cvtepu8_epi16(_mm_shuffle_epi8(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a)), min_pairs_order()));
}
// Group sums j, j + 1 of a row (int16, adjacent) in every int32 lane.
inline int32_t sum_pair(const avx2::QuantizedRows& xq, int64_t row, int64_t group) {
  int32_t v;
  std::memcpy(&v, xq.group_sum.data() + row * (xq.K / avx2::Q8_GROUP) + group, sizeof(v));
  return v;
}

#ifdef CADENCE_GGUF_X16
// The AVX-512 tiers' Q4_K tiles: the groups' 6-bit scales and minimums applied in integers, the
// float work once per 256-block (llama.cpp's q4_K x q8_K idea; the AVX2 tier's tiles below do the
// scales the same way). Per (row, octet) and group of 32 k, the low and the high nibbles' vpdpbusd
// sums (two independent chains: their latency, not memory, bounded a one-chain GEMV; 16 products
// of q <= 15 and |x| <= 127 each: |s| <= 30480, an int16 in an int32 lane) each go through one
// vpdpwssd by the group's scale (the lane's low int16 times sc <= 63, its high int16 times 0) into
// the block's int32 sum (8 groups x 2 x 30480 x 63 < 2^25: exact); the 16-column R-row tile puts
// the two sums in one lane's two int16 halves and adds both scaled terms with one vpdpwssd by
// (sc, sc) (one multiply-port instruction instead of two: the same exact int32). The minimums:
// one vpdpwssd per two groups of (mn_j, mn_j+1) by the row's exact group sums of q (|sum| <= 4064)
// into a second int32 (< 2^21). Then per block and column: acc += float(sum) * (d * x_scale), acc -=
// float(min_sum) * (dmin * x_scale), x_scale the activations' one scale per 256 (quantize.h).
// Every tile below (16 columns of a pair of octets, R rows or one row over P pairs; 8 columns of
// a lone octet) computes the same exact integer sums and runs the same float steps lane for lane
// in this order, so a column's bits do not depend on the tile, the rows beside it or the thread
// split.

// Rows per 16-column tile (q4k_x16_tile): 8 fit the registers with the accumulators in memory.
constexpr int Q4K_X16_ROWS = 8;

// min_words for two octets: 8 columns at a, then 8 at b.
inline __m512i min_words_pair(const uint8_t* a, const uint8_t* b) {
  const __m256i both = _mm256_inserti128_si256(
      _mm256_castsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a))),
      _mm_loadu_si128(reinterpret_cast<const __m128i*>(b)), 1);
  const __m256i order = _mm256_broadcastsi128_si256(min_pairs_order());
  return _mm512_cvtepu8_epi16(_mm256_shuffle_epi8(both, order));
}
// 8 bytes at a (then 8 at b) zero-extended into int32 lanes (byte, 0): word_dot_add's multiplier.
inline __m256i scale_words(const uint8_t* a) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a)));
}
inline __m512i scale_words_pair(const uint8_t* a, const uint8_t* b) {
  return _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a)),
                                                 _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b))));
}
// Per int32 lane, lo's sum in the low int16 and hi's in the high one (both |s| <= 30480): one
// vpdpwssd by (sc, sc) then adds lo * sc + hi * sc, the two sums' scaled terms in one instruction.
inline __m512i lo_hi_words(__m512i lo, __m512i hi) {
  return _mm512_mask_blend_epi16(0xAAAAAAAA, lo, _mm512_slli_epi32(hi, 16));
}
inline __m256i word_dot_add_256(__m256i acc, __m256i s, __m256i w) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpwssd_epi32(acc, s, w);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(s, w));
#endif
}

// out[(m0 + r) * ldo + n0 + c], c < 8, r < R: rows of x against the lone octet at `packed` (an odd
// octet count's last), on 8 lanes.
template <int R>
inline void q4k_x8_tile(const avx2::QuantizedRows& xq, int64_t m0, const uint8_t* packed, int64_t K, float* out,
                        int64_t ldo, int64_t n0) {
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const __m256i ones16 = _mm256_set1_epi16(1), low4 = _mm256_set1_epi8(0x0F);
  const int64_t groups = K / avx2::Q8_GROUP;
  for (int64_t blk = 0; blk < K / 256; ++blk) {
    const uint8_t* hdr = packed + blk * Q4K_X8_BYTES;
    _mm_prefetch(reinterpret_cast<const char*>(hdr + PREFETCH_AHEAD), PREFETCH_HINT);
    __m256i block_sum[R], min_sum[R];
    for (int r = 0; r < R; ++r) block_sum[r] = min_sum[r] = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
      const int64_t k0 = (blk * 8 + j) * avx2::Q8_GROUP;
      const uint8_t* q = hdr + Q4K_X8_HEADER + j * 128;
      _mm_prefetch(reinterpret_cast<const char*>(q + PREFETCH_AHEAD), PREFETCH_HINT);
      _mm_prefetch(reinterpret_cast<const char*>(q + PREFETCH_AHEAD + 64), PREFETCH_HINT);
      __m256i lo_sum[R], hi_sum[R];
      for (int r = 0; r < R; ++r) lo_sum[r] = hi_sum[r] = _mm256_setzero_si256();
      for (int kk = 0; kk < 4; ++kk) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + kk * 32));
        const __m256i lo = _mm256_and_si256(v, low4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        for (int r = 0; r < R; ++r) {
          const int8_t* x = xq.q_at(m0 + r, k0 + kk * 8);
          lo_sum[r] = avx2::udot4_add(lo_sum[r], lo, avx2::broadcast4(x), ones16);
          hi_sum[r] = avx2::udot4_add(hi_sum[r], hi, avx2::broadcast4(x + 4), ones16);
        }
      }
      const __m256i sc = scale_words(hdr + 64 + 8 * j);
      for (int r = 0; r < R; ++r)
        block_sum[r] = word_dot_add_256(word_dot_add_256(block_sum[r], lo_sum[r], sc), hi_sum[r], sc);
    }
    for (int jp = 0; jp < 4; ++jp) {
      const __m256i mn = min_words(hdr + 128 + 16 * jp);
      for (int r = 0; r < R; ++r)
        min_sum[r] = word_dot_add_256(min_sum[r], mn, _mm256_set1_epi32(sum_pair(xq, m0 + r, blk * 8 + 2 * jp)));
    }
    const __m256 d = _mm256_loadu_ps(reinterpret_cast<const float*>(hdr));
    const __m256 dmin = _mm256_loadu_ps(reinterpret_cast<const float*>(hdr + 32));
    for (int r = 0; r < R; ++r) {
      const __m256 xs = _mm256_set1_ps(xq.scale[(m0 + r) * groups + blk * 8]);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(block_sum[r]), _mm256_mul_ps(d, xs), acc[r]);
      acc[r] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(min_sum[r]), _mm256_mul_ps(dmin, xs), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm256_storeu_ps(out + (m0 + r) * ldo + n0, acc[r]);
}

template <int R>
inline void q4k_x8_rows(const avx2::QuantizedRows& xq, int64_t m0, int64_t rows, const uint8_t* packed, int64_t K,
                        float* out, int64_t ldo, int64_t n0) {
  int64_t m = m0;
  for (; m + R <= m0 + rows; m += R) q4k_x8_tile<R>(xq, m, packed, K, out, ldo, n0);
  if constexpr (R > 1) {
    if (m < m0 + rows) q4k_x8_rows<R - 1>(xq, m, m0 + rows - m, packed, K, out, ldo, n0);
  }
}

// R rows against the octets at `packed` and packed + octet_bytes, in the two halves of each
// register (x16_pairs.h). The rows' float accumulators live in `out` between blocks (one load and
// store per row and 2048 weights): the 32 registers then hold R = 8 rows' block, low and high sums
// beside the decoded weights (24 + 5), so each decoded register serves 8 rows and a 32-row decode
// batch splits into whole tiles.
template <int R>
inline void q4k_x16_tile(const avx2::QuantizedRows& xq, int64_t m0, const uint8_t* packed, int64_t octet_bytes,
                         int64_t K, float* out, int64_t ldo, int64_t n0) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const int64_t groups = K / avx2::Q8_GROUP;
  for (int64_t blk = 0; blk < K / 256; ++blk) {
    const uint8_t* h0 = packed + blk * Q4K_X8_BYTES;
    const uint8_t* h1 = h0 + octet_bytes;
    _mm_prefetch(reinterpret_cast<const char*>(h0 + PREFETCH_AHEAD), PREFETCH_HINT);
    _mm_prefetch(reinterpret_cast<const char*>(h1 + PREFETCH_AHEAD), PREFETCH_HINT);
    __m512i block_sum[R];
    for (int r = 0; r < R; ++r) block_sum[r] = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) {
      const int64_t k0 = (blk * 8 + j) * avx2::Q8_GROUP;
      const uint8_t* q0 = h0 + Q4K_X8_HEADER + j * 128;
      const uint8_t* q1 = h1 + Q4K_X8_HEADER + j * 128;
      _mm_prefetch(reinterpret_cast<const char*>(q0 + PREFETCH_AHEAD), PREFETCH_HINT);
      _mm_prefetch(reinterpret_cast<const char*>(q0 + PREFETCH_AHEAD + 64), PREFETCH_HINT);
      _mm_prefetch(reinterpret_cast<const char*>(q1 + PREFETCH_AHEAD), PREFETCH_HINT);
      _mm_prefetch(reinterpret_cast<const char*>(q1 + PREFETCH_AHEAD + 64), PREFETCH_HINT);
      __m512i lo_sum[R], hi_sum[R];
      for (int r = 0; r < R; ++r) lo_sum[r] = hi_sum[r] = _mm512_setzero_si512();
      for (int kk = 0; kk < 4; ++kk) {
        const __m512i v = load_pair(q0 + kk * 32, q1 + kk * 32);
        const __m512i lo = _mm512_and_si512(v, low4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
        for (int r = 0; r < R; ++r) {
          const int8_t* x = xq.q_at(m0 + r, k0 + kk * 8);
          lo_sum[r] = udot4_add_512_at(lo_sum[r], lo, x);
          hi_sum[r] = udot4_add_512_at(hi_sum[r], hi, x + 4);
        }
      }
      const __m512i sc = scale_words_pair(h0 + 64 + 8 * j, h1 + 64 + 8 * j);
      const __m512i sc2 = _mm512_or_si512(sc, _mm512_slli_epi32(sc, 16));
      for (int r = 0; r < R; ++r)
        block_sum[r] = word_dot_add_512(block_sum[r], lo_hi_words(lo_sum[r], hi_sum[r]), sc2);
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

// One row (a decode step) against P pairs of octets at once (2P consecutive octets from
// `packed`): q4k_x16_tile<1>'s operations lane for lane, with P pairs' loads and dot-product
// chains in flight together (a GEMV is bound by how many memory streams and independent chains it
// keeps going, not by its instructions).
template <int P>
inline void q4k_x16_gemv(const avx2::QuantizedRows& xq, const uint8_t* packed, int64_t octet_bytes, int64_t K,
                         float* out, GemvPrefetch pf = {}) {
  __m512 acc[P];
  for (int p = 0; p < P; ++p) acc[p] = _mm512_setzero_ps();
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  for (int64_t blk = 0; blk < K / 256; ++blk) {
    const uint8_t* h[2 * P];
    for (int i = 0; i < 2 * P; ++i) {
      h[i] = packed + i * octet_bytes + blk * Q4K_X8_BYTES;
      if (pf.in_stream) _mm_prefetch(reinterpret_cast<const char*>(h[i] + PREFETCH_AHEAD), PREFETCH_HINT);
      if (pf.next_tile)  // the next tile's header (3 lines)
        for (int line = 0; line < 3; ++line) prefetch_l2(h[i] + pf.next_tile + 64 * line);
    }
    __m512i block_sum[P];
    for (int p = 0; p < P; ++p) block_sum[p] = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) {
      const int64_t k0 = (blk * 8 + j) * avx2::Q8_GROUP;
      for (int i = 0; i < 2 * P; ++i) {
        const uint8_t* q = h[i] + Q4K_X8_HEADER + j * 128;
        if (pf.in_stream) {
          _mm_prefetch(reinterpret_cast<const char*>(q + PREFETCH_AHEAD), PREFETCH_HINT);
          _mm_prefetch(reinterpret_cast<const char*>(q + PREFETCH_AHEAD + 64), PREFETCH_HINT);
        }
        if (pf.next_tile) {
          prefetch_l2(q + pf.next_tile);
          prefetch_l2(q + pf.next_tile + 64);
        }
      }
      __m512i lo_sum[P], hi_sum[P];
      for (int p = 0; p < P; ++p) lo_sum[p] = hi_sum[p] = _mm512_setzero_si512();
      for (int kk = 0; kk < 4; ++kk) {
        const __m512i x_lo = broadcast4_512(xq.q_at(0, k0 + kk * 8)), x_hi = broadcast4_512(xq.q_at(0, k0 + kk * 8 + 4));
        for (int p = 0; p < P; ++p) {
          const __m512i v = load_pair(h[2 * p] + Q4K_X8_HEADER + j * 128 + kk * 32,
                                      h[2 * p + 1] + Q4K_X8_HEADER + j * 128 + kk * 32);
          lo_sum[p] = udot4_add_512(lo_sum[p], _mm512_and_si512(v, low4), x_lo);
          hi_sum[p] = udot4_add_512(hi_sum[p], _mm512_and_si512(_mm512_srli_epi16(v, 4), low4), x_hi);
        }
      }
      for (int p = 0; p < P; ++p) {
        const __m512i sc = scale_words_pair(h[2 * p] + 64 + 8 * j, h[2 * p + 1] + 64 + 8 * j);
        block_sum[p] = word_dot_add_512(word_dot_add_512(block_sum[p], lo_sum[p], sc), hi_sum[p], sc);
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
inline void q4k_x16_rows(const avx2::QuantizedRows& xq, int64_t m0, int64_t rows, const uint8_t* packed,
                         int64_t octet_bytes, int64_t K, float* out, int64_t ldo, int64_t n0) {
  int64_t m = m0;
  for (; m + R <= m0 + rows; m += R) q4k_x16_tile<R>(xq, m, packed, octet_bytes, K, out, ldo, n0);
  if constexpr (R > 1) {
    if (m < m0 + rows) q4k_x16_rows<R - 1>(xq, m, m0 + rows - m, packed, octet_bytes, K, out, ldo, n0);
  }
}
#endif

#ifndef CADENCE_GGUF_X16
// The AVX2 tier's tiles (maddubs, no VNNI): R rows x O octets with the 6-bit scales and the
// minimums applied in integers, as llama.cpp's AVX2 K-quant kernels do. Per (row, octet) and group
// of 32 k the eight maddubs' int16 pair sums add up in int16 (16 products of q <= 15 and |x| <= 127:
// <= 30480, exact), one madd multiplies them by the group's scale (int16 pairs of sc <= 63) into
// int32 and adds them to the block's sum (8 groups x 30480 x 63 < 2^24: exact). The minimums,
// once per block after the groups (their registers free by then: 4 rows' sums stay within AVX2's
// 16): per octet the 4 int16 pair vectors (mn_j, mn_j+1), per row one madd of each by the row's
// exact group sums (sum_j, sum_j+1) (|sum| <= 32 x 127 = 4064; 2 x 63 x 4064 per madd, 4 added:
// < 2^21, exact). Then per block and column, as the AVX-512 tiers: acc += float(sum) * (d *
// x_scale), acc -= float(min_sum) * (dmin * x_scale): the float work (two converts, two
// multiplies, two FMAs) runs once per 256-block, not per group (the minimums in float per group
// cost a GEMV ~8% of its instructions). Every (row, column) pair runs the same instructions in
// the same order whatever R and O (the FMAs explicit): a row's result does not depend on the rows
// or columns beside it. The integer sums equal the AVX-512 tiers' and the float steps are theirs.
template <int R, int O>
inline void q4k_x8_tile_avx2(const avx2::QuantizedRows& xq, int64_t m0, const uint8_t* packed, int64_t octet_bytes,
                             int64_t K, float* out, int64_t ldo, int64_t n0, GemvPrefetch pf = {}) {
  __m256 acc[R][O];
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < O; ++i) acc[r][i] = _mm256_setzero_ps();
  const __m256i low4 = _mm256_set1_epi8(0x0F);
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
      for (int i = 0; i < O; ++i) {
        const uint8_t* q = packed + i * octet_bytes + blk * Q4K_X8_BYTES + Q4K_X8_HEADER + j * 128;
        if (R > 1 || pf.in_stream) {
          prefetch_tile_line<R>(q);
          prefetch_tile_line<R>(q + 64);
        }
        if (R == 1 && pf.next_tile) {  // the next tile's lines: 16 of q and the 3 of the header
          prefetch_l2(q + pf.next_tile);
          prefetch_l2(q + pf.next_tile + 64);
          if (j < 3) prefetch_l2(packed + i * octet_bytes + blk * Q4K_X8_BYTES + pf.next_tile + 64 * j);
        }
      }
      __m256i group_sum[R][O];
      for (int kk = 0; kk < 4; ++kk) {
        __m256i lo[O], hi[O];
        for (int i = 0; i < O; ++i) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
              packed + i * octet_bytes + blk * Q4K_X8_BYTES + Q4K_X8_HEADER + j * 128 + kk * 32));
          lo[i] = _mm256_and_si256(v, low4);
          hi[i] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        }
        for (int r = 0; r < R; ++r) {
          const int8_t* x = xq.q_at(m0 + r, k0 + kk * 8);
          const __m256i x_lo = avx2::broadcast4(x), x_hi = avx2::broadcast4(x + 4);
          for (int i = 0; i < O; ++i) {
            const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo[i], x_lo), _mm256_maddubs_epi16(hi[i], x_hi));
            group_sum[r][i] = kk == 0 ? pairs : _mm256_add_epi16(group_sum[r][i], pairs);
          }
        }
      }
      for (int i = 0; i < O; ++i) {
        int64_t scales;
        std::memcpy(&scales, packed + i * octet_bytes + blk * Q4K_X8_BYTES + 64 + 8 * j, sizeof(scales));
        const __m256i sc16 = _mm256_shuffle_epi8(_mm256_set1_epi64x(scales), scale_pairs);
        for (int r = 0; r < R; ++r)
          block_sum[r][i] = _mm256_add_epi32(block_sum[r][i], _mm256_madd_epi16(group_sum[r][i], sc16));
      }
    }
    // The minimums' terms, once per block: per octet the 4 (mn_j, mn_j+1) int16 pair vectors, per
    // row one madd each by the row's (sum_j, sum_j+1) group sums, added in jp order.
    for (int i = 0; i < O; ++i) {
      const uint8_t* hdr = packed + i * octet_bytes + blk * Q4K_X8_BYTES;
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
inline void q4k_x8_rows_avx2(const avx2::QuantizedRows& xq, int64_t m0, int64_t rows, const uint8_t* packed,
                             int64_t octet_bytes, int64_t K, float* out, int64_t ldo, int64_t n0) {
  int64_t m = m0;
  for (; m + R <= m0 + rows; m += R) q4k_x8_tile_avx2<R, 1>(xq, m, packed, octet_bytes, K, out, ldo, n0);
  if constexpr (R > 1) {
    if (m < m0 + rows) q4k_x8_rows_avx2<R - 1>(xq, m, m0 + rows - m, packed, octet_bytes, K, out, ldo, n0);
  }
}
#endif

// Octets [o_begin, o_end) of a repacked Q4_K weight for every row (row blocks that stay in L2,
// as int_gemm_columns). One row (a decode step) takes the octets eight at a time on the AVX-512
// tiers (four pairs: eight memory streams and dot-product chains in flight; a 734 MB GEMV set on 2
// Zen 4 threads streamed 38 GB/s against 29-33 with four octets), then four, two, one; on the AVX2
// tier eight at a time too, then two, one (two -> six: the 1B shape's decode step 42-43 -> 34-37 ms,
// paired in one run; six -> eight: its 765 MB GEMV set 32.8-33.5 -> 35.5-35.9 GB/s and 28.2-29.1 ->
// 30.0-31.1 on a slower hour, 2 Zen 4 threads, a standalone build of these headers; ten no better,
// twelve and sixteen slower), each tile of eight prefetching the next one into L2 (GemvPrefetch:
// that set's Q4_K 20-28 -> 25-33 GB/s, alternated in one binary); more rows share each octet's
// decode across 4 rows.
inline void q4k_x8_columns(const avx2::QuantizedRows& xq, int64_t M, const uint8_t* packed, int64_t K, float* out,
                           int64_t ldo, int64_t o_begin, int64_t o_end) {
  const int64_t octet_bytes = K / 256 * Q4K_X8_BYTES;
#ifdef CADENCE_GGUF_X16
  constexpr int ROWS = 4;  // the lone octet's tile rows
  if (M == 1) {
    int64_t o = o_begin;
    for (; o + 8 <= o_end; o += 8)  // each tile prefetching the next (GemvPrefetch), as the AVX2 tier's
      q4k_x16_gemv<4>(xq, packed + o * octet_bytes, octet_bytes, K, out + 8 * o,
                      gemv_prefetch(o, o_begin, o_end, 8, 8 * octet_bytes));
    for (; o + 4 <= o_end; o += 4) q4k_x16_gemv<2>(xq, packed + o * octet_bytes, octet_bytes, K, out + 8 * o);
    for (; o + 2 <= o_end; o += 2) q4k_x16_tile<1>(xq, 0, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
    if (o < o_end) q4k_x8_tile<1>(xq, 0, packed + o * octet_bytes, K, out, ldo, 8 * o);
    return;
  }
  const int64_t row_block = std::max<int64_t>(Q4K_X16_ROWS, (256 << 10) / K / Q4K_X16_ROWS * Q4K_X16_ROWS);
  for (int64_t mb = 0; mb < M; mb += row_block) {
    const int64_t rows = std::min(row_block, M - mb);
    int64_t o = o_begin;
    for (; o + 2 <= o_end; o += 2)
      q4k_x16_rows<Q4K_X16_ROWS>(xq, mb, rows, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
    if (o < o_end) q4k_x8_rows<ROWS>(xq, mb, rows, packed + o * octet_bytes, K, out, ldo, 8 * o);
  }
#else
  if (M == 1) {
    int64_t o = o_begin;
    for (; o + 8 <= o_end; o += 8)
      q4k_x8_tile_avx2<1, 8>(xq, 0, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o,
                             gemv_prefetch(o, o_begin, o_end, 8, 8 * octet_bytes));
    for (; o + 2 <= o_end; o += 2) q4k_x8_tile_avx2<1, 2>(xq, 0, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
    if (o < o_end) q4k_x8_tile_avx2<1, 1>(xq, 0, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
    return;
  }
  const int64_t row_block = std::max<int64_t>(AVX2_ROWS, (256 << 10) / K / AVX2_ROWS * AVX2_ROWS);
  for (int64_t mb = 0; mb < M; mb += row_block) {
    const int64_t rows = std::min(row_block, M - mb);
    for (int64_t o = o_begin; o < o_end; ++o)
      q4k_x8_rows_avx2<AVX2_ROWS>(xq, mb, rows, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
  }
#endif
}

#endif  // CADENCE_HAVE_AVX2

}  // namespace gguf
}  // namespace cadence_kernels
