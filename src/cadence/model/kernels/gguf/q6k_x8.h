// Q6_K repacked at load, losslessly, with 8 columns interleaved (as q4k_x8.h for Q4_K: the
// float work per group of 32 k is shared by the 8 columns in a register's lanes).
//
// Layout: per octet of columns, per 256-block, Q6K_X8_BYTES bytes:
//   d[8]              float32 (the blocks' fp16 d, exact)
//   sc[16][8]         int8, [16-weight scale][column]
//   ql[8][4][8][4]    [group][k-octet][column][byte]: low 4 bits of q[8kk + t] | of q[8kk + 4 + t] << 4
//   qh[8][2][8][4]    [group][pair of k-octets][column][byte]: the top 2 bits of q[8kk + t],
//                     q[8kk + 4 + t], q[8kk' + t], q[8kk' + 4 + t] (kk = 2p, kk' = 2p + 1) at bits
//                     0, 2, 4, 6
// 1696 bytes per 2048 weights (the file's blocks: 1680). w = (d * sc) * (q - 32), q in [0, 63].
#pragma once

#include <cstdint>
#include <cstring>

#include "../avx2/q4_gemm.h"
#include "blocks.h"
#include "x16_pairs.h"

namespace cadence_kernels {
namespace gguf {

constexpr int64_t Q6K_X8_BYTES = 1696;
constexpr int64_t Q6K_X8_QL = 160;          // offset of ql in a block
constexpr int64_t Q6K_X8_QH = 160 + 1024;   // offset of qh

#if CADENCE_HAVE_AVX2

inline void repack_q6k_x8_octet(const uint8_t* w, int64_t row_bytes, int64_t K, int64_t o, uint8_t* out) {
  for (int64_t blk = 0; blk < K / 256; ++blk) {
    uint8_t* dst = out + blk * Q6K_X8_BYTES;
    for (int i = 0; i < 8; ++i) {
      const uint8_t* raw = w + (8 * o + i) * row_bytes + blk * 210;
      const float d = half_at(raw + 208);
      std::memcpy(dst + 4 * i, &d, 4);
      for (int s = 0; s < 16; ++s) dst[32 + s * 8 + i] = raw[192 + s];
      for (int j = 0; j < 8; ++j) {
        const int h = j / 4, t = j % 4;
        const uint8_t* ql = raw + 64 * h + 32 * (t % 2);
        const uint8_t* qh = raw + 128 + 32 * h;
        const int ql_shift = t >= 2 ? 4 : 0, qh_shift = 2 * t;
        auto low = [&](int l) { return (ql[l] >> ql_shift) & 0x0F; };
        auto high = [&](int l) { return (qh[l] >> qh_shift) & 0x03; };
        for (int kk = 0; kk < 4; ++kk)
          for (int b = 0; b < 4; ++b)
            dst[Q6K_X8_QL + ((j * 4 + kk) * 8 + i) * 4 + b] =
                static_cast<uint8_t>(low(8 * kk + b) | (low(8 * kk + 4 + b) << 4));
        for (int p = 0; p < 2; ++p)
          for (int b = 0; b < 4; ++b) {
            const int k0 = 16 * p, k1 = 16 * p + 8;
            dst[Q6K_X8_QH + ((j * 2 + p) * 8 + i) * 4 + b] = static_cast<uint8_t>(
                high(k0 + b) | (high(k0 + 4 + b) << 2) | (high(k1 + b) << 4) | (high(k1 + 4 + b) << 6));
          }
      }
    }
  }
}

// The AVX2 tier's tiles (maddubs, no VNNI; on the AVX-512 tiers the lone octet's tile), as
// q4k_x8_tile_avx2: the 16-weight scales applied in integers. Per (row, octet) and 8 k the two
// maddubs' int16 pair sums are added (4 products of q <= 63 and |x| <= 127: <= 32004, exact),
// one madd multiplies them by the 16 k's scale (int16
// pairs of the signed sc) into int32, added to the block's sum (16 x 2 x 32004 x 128 < 2^31);
// q's offset of 32 is taken off once per block in integers (32 * sum of sc_s * the row's byte sum
// over the 16 k of s), and the float work runs once per 256-block. The same instructions per
// (row, column) whatever R and O.
template <int R, int O>
inline void q6k_x8_tile_avx2(const avx2::QuantizedRows& xq, const int32_t* half_sums, int64_t m0, const uint8_t* packed,
                             int64_t octet_bytes, int64_t K, float* out, int64_t ldo, int64_t n0, GemvPrefetch pf = {}) {
  __m256 acc[R][O];
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < O; ++i) acc[r][i] = _mm256_setzero_ps();
  const __m256i low4 = _mm256_set1_epi8(0x0F), bits45 = _mm256_set1_epi8(0x30);
  // Byte c of 8 scales into both bytes of int16 lanes 2c and 2c + 1 (then >> 8: sign-extended).
  const __m256i scale_twice = _mm256_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3,
                                               4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7);
  const int64_t groups = K / avx2::Q8_GROUP;
  for (int64_t blk = 0; blk < K / 256; ++blk) {
    __m256i block_sum[R][O];
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < O; ++i) block_sum[r][i] = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
      for (int i = 0; i < O; ++i) {
        const uint8_t* base = packed + i * octet_bytes + blk * Q6K_X8_BYTES;
        if (R > 1 || pf.in_stream) {
          prefetch_tile_line<R>(base + Q6K_X8_QL + j * 128);
          prefetch_tile_line<R>(base + Q6K_X8_QL + j * 128 + 64);
          prefetch_tile_line<R>(base + Q6K_X8_QH + j * 64);
        }
        if (R == 1 && pf.next_tile) {  // the next tile's lines: 24 of ql and qh, 2 of the header
          const uint8_t* next = base + pf.next_tile;
          prefetch_l2(next + Q6K_X8_QL + j * 128);
          prefetch_l2(next + Q6K_X8_QL + j * 128 + 64);
          prefetch_l2(next + Q6K_X8_QH + j * 64);
          if (j < 2) prefetch_l2(next + 64 * j);
        }
      }
      const int64_t k0 = (blk * 8 + j) * avx2::Q8_GROUP;
      for (int p = 0; p < 2; ++p) {
        __m256i sc16[O], hv[O];
        for (int i = 0; i < O; ++i) {
          const uint8_t* base = packed + i * octet_bytes + blk * Q6K_X8_BYTES;
          int64_t scales;
          std::memcpy(&scales, base + 32 + (2 * j + p) * 8, sizeof(scales));
          sc16[i] = _mm256_srai_epi16(_mm256_shuffle_epi8(_mm256_set1_epi64x(scales), scale_twice), 8);
          hv[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + Q6K_X8_QH + (j * 2 + p) * 32));
        }
        for (int sub = 0; sub < 2; ++sub) {
          const int kk = 2 * p + sub;
          __m256i lo[O], hi[O];
          for (int i = 0; i < O; ++i) {
            const uint8_t* base = packed + i * octet_bytes + blk * Q6K_X8_BYTES;
            const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + Q6K_X8_QL + j * 128 + kk * 32));
            const __m256i h_lo = _mm256_and_si256(sub == 0 ? _mm256_slli_epi16(hv[i], 4) : hv[i], bits45);
            const __m256i h_hi =
                _mm256_and_si256(sub == 0 ? _mm256_slli_epi16(hv[i], 2) : _mm256_srli_epi16(hv[i], 2), bits45);
            lo[i] = _mm256_or_si256(_mm256_and_si256(v, low4), h_lo);
            hi[i] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4), h_hi);
          }
          for (int r = 0; r < R; ++r) {
            const int8_t* x = xq.q_at(m0 + r, k0 + kk * 8);
            const __m256i x_lo = avx2::broadcast4(x), x_hi = avx2::broadcast4(x + 4);
            for (int i = 0; i < O; ++i) {
              const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo[i], x_lo), _mm256_maddubs_epi16(hi[i], x_hi));
              block_sum[r][i] = _mm256_add_epi32(block_sum[r][i], _mm256_madd_epi16(pairs, sc16[i]));
            }
          }
        }
      }
    }
    for (int i = 0; i < O; ++i) {
      const uint8_t* base = packed + i * octet_bytes + blk * Q6K_X8_BYTES;
      // sum_s sc_s * (row's byte sum over s's 16 k), two scales per madd: int16 pairs (sc_s, sc_s+1)
      // per column against the row's (sum_s, sum_s+1) (|sum| <= 16 * 127).
      __m256i offset[R];
      for (int r = 0; r < R; ++r) offset[r] = _mm256_setzero_si256();
      for (int s = 0; s < 16; s += 2) {
        const __m128i two_rows = _mm_loadu_si128(reinterpret_cast<const __m128i*>(base + 32 + s * 8));
        const __m256i sc_pairs = _mm256_cvtepi8_epi16(_mm_unpacklo_epi8(two_rows, _mm_srli_si128(two_rows, 8)));
        for (int r = 0; r < R; ++r) {
          const int32_t* hs = half_sums + (m0 + r) * (K / 16) + blk * 16 + s;
          const uint32_t pair = (static_cast<uint32_t>(hs[0]) & 0xFFFFu) | (static_cast<uint32_t>(hs[1]) << 16);
          offset[r] = _mm256_add_epi32(offset[r], _mm256_madd_epi16(sc_pairs, _mm256_set1_epi32(static_cast<int32_t>(pair))));
        }
      }
      const __m256 d = _mm256_loadu_ps(reinterpret_cast<const float*>(base));
      for (int r = 0; r < R; ++r) {
        const __m256i centred = _mm256_sub_epi32(block_sum[r][i], _mm256_slli_epi32(offset[r], 5));
        const __m256 d_xs = _mm256_mul_ps(d, _mm256_set1_ps(xq.scale[(m0 + r) * groups + blk * 8]));
        acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(centred), d_xs, acc[r][i]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < O; ++i) _mm256_storeu_ps(out + (m0 + r) * ldo + n0 + 8 * i, acc[r][i]);
}

template <int R>
inline void q6k_x8_rows_avx2(const avx2::QuantizedRows& xq, const int32_t* half_sums, int64_t m0, int64_t rows,
                             const uint8_t* packed, int64_t octet_bytes, int64_t K, float* out, int64_t ldo, int64_t n0) {
  int64_t m = m0;
  for (; m + R <= m0 + rows; m += R) q6k_x8_tile_avx2<R, 1>(xq, half_sums, m, packed, octet_bytes, K, out, ldo, n0);
  if constexpr (R > 1) {
    if (m < m0 + rows) q6k_x8_rows_avx2<R - 1>(xq, half_sums, m, m0 + rows - m, packed, octet_bytes, K, out, ldo, n0);
  }
}

#ifdef CADENCE_GGUF_X16
// The AVX-512 tiers' tiles: q6k_x8_tile_avx2's exact integers and float steps on 16 columns (two
// octets in the halves of each register, x16_pairs.h). Per (row, 16 k of one scale): with VNNI
// one chain of 4 vpdpbusd gives the exact sum of q * x (16 products of q <= 63 and |x| <= 127:
// |s| <= 128016) and one vpmulld by the scale (int32 lanes, |sc| <= 128) adds it to the block's
// int32 sum; without VNNI the AVX2 tile's maddubs pairs and madd by the scale. Either way the block
// sum is sum_s sc_s * (16 k's sum of q * x), exact (<= 16 x 128016 x 128 < 2^28). q's offset of
// 32: per two scales one vpdpwssd of the int16 pairs (-32 sc_s, -32 sc_s+1) by the row's byte sums
// (hs_s, hs_s+1) (|hs| <= 2032) into the same int32 (<= 16 x 4096 x 2032 < 2^27 more): the AVX2
// tile's centred sum. Then one float step per 256-block and column, acc += float(centred) *
// (d * x_scale), the float accumulators in `out` between blocks (one load and store per row and
// block; the registers hold the rows' block sums beside the decoded weights). Every tile and tier
// computes a column's result with the same operations, so its bits do not depend on the tile, the
// rows beside it, the thread split or the tier. (Was: a float convert, multiply and FMA per
// row, 16 k and column, 6 rows per tile.)

// Rows per 16-column tile: each decoded weight register serves this many rows.
constexpr int Q6K_X16_ROWS = 8;

// The 16 k of scale 2j + p in two octets' blocks at b0, b1, decoded into q bytes (0..63): w[0] /
// w[1] the first / last 4 k of k-octet 2p per column, w[2] / w[3] those of k-octet 2p + 1.
inline void q6k_decode_16k(const uint8_t* b0, const uint8_t* b1, int j, int p, __m512i w[4]) {
  const __m512i low4 = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30);
  const __m512i hv = load_pair(b0 + Q6K_X8_QH + (j * 2 + p) * 32, b1 + Q6K_X8_QH + (j * 2 + p) * 32);
  for (int sub = 0; sub < 2; ++sub) {
    const int kk = 2 * p + sub;
    const __m512i v = load_pair(b0 + Q6K_X8_QL + j * 128 + kk * 32, b1 + Q6K_X8_QL + j * 128 + kk * 32);
    // bits 4-5 of each byte: the high bits of q[8kk + t] (w[2 sub]) and q[8kk + 4 + t] (w[2 sub + 1]).
    const __m512i h_lo = _mm512_and_si512(sub == 0 ? _mm512_slli_epi16(hv, 4) : hv, bits45);
    const __m512i h_hi = _mm512_and_si512(sub == 0 ? _mm512_slli_epi16(hv, 2) : _mm512_srli_epi16(hv, 2), bits45);
    w[2 * sub] = _mm512_or_si512(_mm512_and_si512(v, low4), h_lo);
    w[2 * sub + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), low4), h_hi);
  }
}

// The int8 scales of 8 columns at a, then 8 at b, as q6k_scaled_add's multiplier: int32 lanes
// (VNNI), or each in both int16 halves of its lane (madd's pairs).
inline __m512i q6k_scale_operand(const uint8_t* a, const uint8_t* b) {
  const __m512i sc = _mm512_cvtepi8_epi32(_mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a)),
                                                             _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b))));
#if defined(__AVX512VNNI__)
  return sc;
#else
  return _mm512_or_si512(_mm512_and_si512(sc, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32(sc, 16));
#endif
}

// block_sum + sc * (the exact sum of q * x over 16 k), x the row's 16 bytes, w: q6k_decode_16k.
inline __m512i q6k_scaled_add(__m512i block_sum, const __m512i w[4], const int8_t* x, __m512i sc) {
#if defined(__AVX512VNNI__)
  __m512i s = udot4_add_512_at(_mm512_setzero_si512(), w[0], x);
  s = udot4_add_512_at(s, w[1], x + 4);
  s = udot4_add_512_at(s, w[2], x + 8);
  s = udot4_add_512_at(s, w[3], x + 12);
  return _mm512_add_epi32(block_sum, _mm512_mullo_epi32(s, sc));
#else
  for (int sub = 0; sub < 2; ++sub) {  // int16 pair sums of 8 k (<= 4 x 63 x 127 = 32004: exact)
    const __m512i pairs = _mm512_add_epi16(_mm512_maddubs_epi16(w[2 * sub], broadcast4_512(x + 8 * sub)),
                                           _mm512_maddubs_epi16(w[2 * sub + 1], broadcast4_512(x + 8 * sub + 4)));
    block_sum = _mm512_add_epi32(block_sum, _mm512_madd_epi16(pairs, sc));
  }
  return block_sum;
#endif
}

// block_sum[r] += -32 * sum_s sc_s * hs_s for R rows of one 256-block: hs the first row's 16 byte
// sums (half_sums), rows `stride` apart; b0, b1 the block of the two octets.
template <int R>
inline void q6k_offset_add(const int32_t* hs, int64_t stride, const uint8_t* b0, const uint8_t* b1, __m512i* block_sum) {
  alignas(32) int32_t pairs[R][8];  // (hs_2i, hs_2i+1) as int16 pairs
  for (int r = 0; r < R; ++r)
    _mm256_store_si256(reinterpret_cast<__m256i*>(pairs[r]), _mm512_cvtepi32_epi16(_mm512_loadu_si512(hs + r * stride)));
  for (int i = 0; i < 8; ++i) {
    // Scales 2i and 2i + 1 (16 bytes, [scale][column]) as int16 pairs per column, times -32.
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + 32 + 16 * i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b1 + 32 + 16 * i));
    const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_unpacklo_epi8(a, _mm_srli_si128(a, 8))),
                                                 _mm_unpacklo_epi8(b, _mm_srli_si128(b, 8)), 1);
    const __m512i offset = _mm512_sub_epi16(_mm512_setzero_si512(), _mm512_slli_epi16(_mm512_cvtepi8_epi16(both), 5));
    for (int r = 0; r < R; ++r) block_sum[r] = word_dot_add_512(block_sum[r], offset, _mm512_set1_epi32(pairs[r][i]));
  }
}

template <int R>
inline void q6k_x16_tile(const avx2::QuantizedRows& xq, const int32_t* half_sums, int64_t m0, const uint8_t* packed,
                         int64_t octet_bytes, int64_t K, float* out, int64_t ldo, int64_t n0) {
  const int64_t groups = K / avx2::Q8_GROUP;
  for (int64_t blk = 0; blk < K / 256; ++blk) {
    const uint8_t* b0 = packed + blk * Q6K_X8_BYTES;
    const uint8_t* b1 = b0 + octet_bytes;
    __m512i block_sum[R];
    for (int r = 0; r < R; ++r) block_sum[r] = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) {
      for (const uint8_t* base : {b0, b1}) {
        _mm_prefetch(reinterpret_cast<const char*>(base + Q6K_X8_QL + j * 128 + PREFETCH_AHEAD), PREFETCH_HINT);
        _mm_prefetch(reinterpret_cast<const char*>(base + Q6K_X8_QL + j * 128 + PREFETCH_AHEAD + 64), PREFETCH_HINT);
        _mm_prefetch(reinterpret_cast<const char*>(base + Q6K_X8_QH + j * 64 + PREFETCH_AHEAD), PREFETCH_HINT);
      }
      for (int p = 0; p < 2; ++p) {
        __m512i w[4];
        q6k_decode_16k(b0, b1, j, p, w);
        const __m512i sc = q6k_scale_operand(b0 + 32 + (2 * j + p) * 8, b1 + 32 + (2 * j + p) * 8);
        const int64_t k = (blk * 8 + j) * avx2::Q8_GROUP + 16 * p;
        for (int r = 0; r < R; ++r) block_sum[r] = q6k_scaled_add(block_sum[r], w, xq.q_at(m0 + r, k), sc);
      }
    }
    q6k_offset_add<R>(half_sums + m0 * (K / 16) + blk * 16, K / 16, b0, b1, block_sum);
    const __m512 d = load_pair_ps(b0, b1);
    for (int r = 0; r < R; ++r) {
      float* o = out + (m0 + r) * ldo + n0;
      const __m512 xs = _mm512_set1_ps(xq.scale[(m0 + r) * groups + blk * 8]);
      __m512 acc = blk == 0 ? _mm512_setzero_ps() : load_pair_ps(reinterpret_cast<const uint8_t*>(o),
                                                                 reinterpret_cast<const uint8_t*>(o + 8));
      acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(block_sum[r]), _mm512_mul_ps(d, xs), acc);
      store_pair(o, acc);
    }
  }
}

// One row against P pairs of octets at once (q4k_x16_gemv's reasoning): q6k_x16_tile<1>'s
// operations lane for lane, the float accumulators in registers.
template <int P>
inline void q6k_x16_gemv(const avx2::QuantizedRows& xq, const int32_t* half_sums, const uint8_t* packed,
                         int64_t octet_bytes, int64_t K, float* out, GemvPrefetch pf = {}) {
  __m512 acc[P];
  for (int p = 0; p < P; ++p) acc[p] = _mm512_setzero_ps();
  for (int64_t blk = 0; blk < K / 256; ++blk) {
    const uint8_t* b[2 * P];
    for (int i = 0; i < 2 * P; ++i) b[i] = packed + i * octet_bytes + blk * Q6K_X8_BYTES;
    __m512i block_sum[P];
    for (int p = 0; p < P; ++p) block_sum[p] = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) {
      for (int i = 0; i < 2 * P; ++i) {
        if (pf.in_stream) {
          _mm_prefetch(reinterpret_cast<const char*>(b[i] + Q6K_X8_QL + j * 128 + PREFETCH_AHEAD), PREFETCH_HINT);
          _mm_prefetch(reinterpret_cast<const char*>(b[i] + Q6K_X8_QL + j * 128 + PREFETCH_AHEAD + 64), PREFETCH_HINT);
          _mm_prefetch(reinterpret_cast<const char*>(b[i] + Q6K_X8_QH + j * 64 + PREFETCH_AHEAD), PREFETCH_HINT);
        }
        if (pf.next_tile) {  // the next tile's lines (q6k_x8_tile_avx2's)
          const uint8_t* next = b[i] + pf.next_tile;
          prefetch_l2(next + Q6K_X8_QL + j * 128);
          prefetch_l2(next + Q6K_X8_QL + j * 128 + 64);
          prefetch_l2(next + Q6K_X8_QH + j * 64);
          if (j < 2) prefetch_l2(next + 64 * j);
        }
      }
      for (int hp = 0; hp < 2; ++hp) {
        const int8_t* x = xq.q_at(0, (blk * 8 + j) * avx2::Q8_GROUP + 16 * hp);
        for (int p = 0; p < P; ++p) {
          __m512i w[4];
          q6k_decode_16k(b[2 * p], b[2 * p + 1], j, hp, w);
          const __m512i sc = q6k_scale_operand(b[2 * p] + 32 + (2 * j + hp) * 8, b[2 * p + 1] + 32 + (2 * j + hp) * 8);
          block_sum[p] = q6k_scaled_add(block_sum[p], w, x, sc);
        }
      }
    }
    const __m512 xs = _mm512_set1_ps(xq.scale[blk * 8]);
    for (int p = 0; p < P; ++p) {
      q6k_offset_add<1>(half_sums + blk * 16, 0, b[2 * p], b[2 * p + 1], &block_sum[p]);
      acc[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(block_sum[p]), _mm512_mul_ps(load_pair_ps(b[2 * p], b[2 * p + 1]), xs), acc[p]);
    }
  }
  for (int p = 0; p < P; ++p) store_pair(out + 16 * p, acc[p]);
}

template <int R>
inline void q6k_x16_rows(const avx2::QuantizedRows& xq, const int32_t* half_sums, int64_t m0, int64_t rows,
                         const uint8_t* packed, int64_t octet_bytes, int64_t K, float* out, int64_t ldo, int64_t n0) {
  int64_t m = m0;
  for (; m + R <= m0 + rows; m += R) q6k_x16_tile<R>(xq, half_sums, m, packed, octet_bytes, K, out, ldo, n0);
  if constexpr (R > 1) {
    if (m < m0 + rows) q6k_x16_rows<R - 1>(xq, half_sums, m, m0 + rows - m, packed, octet_bytes, K, out, ldo, n0);
  }
}
#endif

inline void q6k_x8_columns(const avx2::QuantizedRows& xq, const int32_t* half_sums, int64_t M, const uint8_t* packed,
                           int64_t K, float* out, int64_t ldo, int64_t o_begin, int64_t o_end) {
  const int64_t octet_bytes = K / 256 * Q6K_X8_BYTES;
#ifdef CADENCE_GGUF_X16
  constexpr int ROWS = 4;  // the lone octet's tile rows (q6k_x8_tile_avx2: the same bits)
  if (M == 1) {
    int64_t o = o_begin;
    for (; o + 4 <= o_end; o += 4)  // each tile prefetching the next (GemvPrefetch)
      q6k_x16_gemv<2>(xq, half_sums, packed + o * octet_bytes, octet_bytes, K, out + 8 * o,
                      gemv_prefetch(o, o_begin, o_end, 4, 4 * octet_bytes));
    for (; o + 2 <= o_end; o += 2) q6k_x16_tile<1>(xq, half_sums, 0, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
    if (o < o_end) q6k_x8_tile_avx2<1, 1>(xq, half_sums, 0, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
    return;
  }
  const int64_t row_block = std::max<int64_t>(Q6K_X16_ROWS, (256 << 10) / K / Q6K_X16_ROWS * Q6K_X16_ROWS);
  for (int64_t mb = 0; mb < M; mb += row_block) {
    const int64_t rows = std::min(row_block, M - mb);
    int64_t o = o_begin;
    for (; o + 2 <= o_end; o += 2)
      q6k_x16_rows<Q6K_X16_ROWS>(xq, half_sums, mb, rows, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
    if (o < o_end) q6k_x8_rows_avx2<ROWS>(xq, half_sums, mb, rows, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
  }
#else
  if (M == 1) {  // four octets at a time where they are (as Q4_K's six: more streams in flight)
    int64_t o = o_begin;
    for (; o + 4 <= o_end; o += 4)  // each tile prefetching the next (as q4k_x8_columns)
      q6k_x8_tile_avx2<1, 4>(xq, half_sums, 0, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o,
                             gemv_prefetch(o, o_begin, o_end, 4, 4 * octet_bytes));
    for (; o + 2 <= o_end; o += 2)
      q6k_x8_tile_avx2<1, 2>(xq, half_sums, 0, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
    if (o < o_end) q6k_x8_tile_avx2<1, 1>(xq, half_sums, 0, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
    return;
  }
  const int64_t row_block = std::max<int64_t>(AVX2_ROWS, (256 << 10) / K / AVX2_ROWS * AVX2_ROWS);
  for (int64_t mb = 0; mb < M; mb += row_block) {
    const int64_t rows = std::min(row_block, M - mb);
    for (int64_t o = o_begin; o < o_end; ++o)
      q6k_x8_rows_avx2<AVX2_ROWS>(xq, half_sums, mb, rows, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
  }
#endif
}

#endif  // CADENCE_HAVE_AVX2

}  // namespace gguf
}  // namespace cadence_kernels
