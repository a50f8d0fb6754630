// Q3_K repacked at load, losslessly, with 8 columns interleaved: Q6_K's arithmetic (q6k_x8.h: a
// signed scale per 16 k applied in integers, the quants' offset taken off once per block against
// the activations' byte sums per 16 k, one float step per 256-block) on 3-bit quants. The
// row-wise codec (blocks.h CodecQ3_K, int_gemm.h) pays a float convert, multiply and FMA per
// column and 16 k (two scales per group) and ran a 2048 x 2048 GEMV ~4x a repacked Q4_K one.
//
// Layout: per octet of columns (8o .. 8o + 7), per 256-block, Q3K_X8_BYTES bytes:
//   d[8]          float32 (the blocks' fp16 d, exact)
//   sc[16][8]     int8, [16-weight scale][column]: the 6-bit scales less 32, in [-32, 31]
//   per group j of 32 k (Q3K_X8_GROUP bytes each):
//     q2[2][8][4]  [pair of k-octets][column][byte]: the low 2 bits of q[8kk + t], q[8kk + 4 + t],
//                  q[8kk' + t], q[8kk' + 4 + t] (kk = 2p, kk' = 2p + 1) at bits 0, 2, 4, 6
//     hb[8][4]     [column][byte]: the third bits, q5k_x8.h's fifth-bit order: bit 4 + kk that of
//                  q[8kk + t], bit kk that of q[8kk + 4 + t]
// 928 bytes per 2048 weights (the file's blocks: 880, +5.5%). w = (d * sc) * (q - 4), q in [0, 7]
// (q = low | third << 2: gguf-py's ql - 4 * (1 - hmask bit)).
//
// Exact integers: per (row, column) and 16 k, sum q * x (16 products of q <= 7 and |x| <= 127:
// <= 14224) times the int8 scale into the block's int32 sum (16 x 14224 x 32 < 2^23); the offset
// 4 * sum_s sc_s * (row's byte sum over s's 16 k) subtracted once per block (|.| < 2^19). Then per
// block and column acc += float(centred) * (d * x_scale). Every tile (the AVX2 tier's R rows x O
// octets, also the AVX-512 tiers' lone octet; the AVX-512 tiers' 16-column tiles and decode rows)
// computes the same integers and runs the same float steps, so a column's bits do not depend on
// the tile, the rows beside it, the thread split or the tier.
#pragma once

#include <cstdint>
#include <cstring>

#include "q6k_x8.h"

namespace cadence_kernels {
namespace gguf {

constexpr int64_t Q3K_X8_BYTES = 928;
constexpr int64_t Q3K_X8_HEADER = 160;
constexpr int64_t Q3K_X8_GROUP = 96;  // 64 bytes of low 2 bits, 32 of third bits

#if CADENCE_HAVE_AVX2

// The 16 6-bit scales of a Q3_K block (12 bytes at s), less 32.
inline void q3k_scales(const uint8_t* s, int8_t* out) {
  for (int i = 0; i < 16; ++i) {
    const int low = i < 8 ? s[i] & 0x0F : s[i - 8] >> 4;
    const int high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
    out[i] = static_cast<int8_t>((low | (high << 4)) - 32);
  }
}

// Octet o of a Q3_K weight (row-wise blocks of 110 bytes: 32 hmask, 64 qs, 12 scale bytes, d;
// row_bytes per column) into `out` (K / 256 * Q3K_X8_BYTES bytes).
inline void repack_q3k_x8_octet(const uint8_t* w, int64_t row_bytes, int64_t K, int64_t o, uint8_t* out) {
  for (int64_t blk = 0; blk < K / 256; ++blk) {
    uint8_t* dst = out + blk * Q3K_X8_BYTES;
    for (int i = 0; i < 8; ++i) {
      const uint8_t* raw = w + (8 * o + i) * row_bytes + blk * 110;
      const float d = half_at(raw + 108);
      std::memcpy(dst + 4 * i, &d, 4);
      int8_t sc[16];
      q3k_scales(raw + 96, sc);
      for (int s = 0; s < 16; ++s) dst[32 + s * 8 + i] = static_cast<uint8_t>(sc[s]);
      for (int j = 0; j < 8; ++j) {
        const int h = j / 4, t = j % 4;
        const uint8_t* qs = raw + 32 + 32 * h;
        auto low = [&](int l) { return (qs[l] >> (2 * t)) & 3; };
        auto third = [&](int l) { return (raw[l] >> j) & 1; };
        uint8_t* g = dst + Q3K_X8_HEADER + j * Q3K_X8_GROUP;
        for (int p = 0; p < 2; ++p)
          for (int b = 0; b < 4; ++b) {
            const int k0 = 16 * p, k1 = 16 * p + 8;
            g[(p * 8 + i) * 4 + b] = static_cast<uint8_t>(low(k0 + b) | (low(k0 + 4 + b) << 2) | (low(k1 + b) << 4) |
                                                          (low(k1 + 4 + b) << 6));
          }
        for (int b = 0; b < 4; ++b) {
          int bits = 0;
          for (int kk = 0; kk < 4; ++kk) bits |= (third(8 * kk + b) << (4 + kk)) | (third(8 * kk + 4 + b) << kk);
          g[64 + i * 4 + b] = static_cast<uint8_t>(bits);
        }
      }
    }
  }
}

// k-octet kk = 2p + sub of a group: q bytes (0..7) of the low (q[8kk + t]) and the high (q[8kk + 4 +
// t]) positions from the pair's low-bit register cv and the group's third bits hb.
inline __m256i q3_low_256(__m256i cv, __m256i hb, int sub, int kk) {
  return _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(cv, 4 * sub), _mm256_set1_epi8(3)),
                         _mm256_and_si256(_mm256_srli_epi16(hb, kk + 2), _mm256_set1_epi8(4)));
}
inline __m256i q3_high_256(__m256i cv, __m256i hb, int sub, int kk) {
  return _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(cv, 4 * sub + 2), _mm256_set1_epi8(3)),
                         _mm256_and_si256(_mm256_srli_epi16(_mm256_slli_epi16(hb, 2), kk), _mm256_set1_epi8(4)));
}

// R rows x O octets (maddubs): q6k_x8_tile_avx2's steps on 3-bit quants, offset 4.
template <int R, int O>
inline void q3k_x8_tile_avx2(const avx2::QuantizedRows& xq, const int32_t* half_sums, int64_t m0, const uint8_t* packed,
                             int64_t octet_bytes, int64_t K, float* out, int64_t ldo, int64_t n0) {
  __m256 acc[R][O];
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < O; ++i) acc[r][i] = _mm256_setzero_ps();
  // Byte c of 8 scales into both bytes of int16 lanes 2c and 2c + 1 (then >> 8: sign-extended).
  const __m256i scale_twice = _mm256_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3,
                                               4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7);
  const int64_t groups = K / avx2::Q8_GROUP;
  for (int64_t blk = 0; blk < K / 256; ++blk) {
    __m256i block_sum[R][O];
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < O; ++i) block_sum[r][i] = _mm256_setzero_si256();
    for (int i = 0; i < O; ++i)
      for (int line = 0; line < 3; ++line)  // the header (d, scales): 160 bytes
        prefetch_tile_line<R>(packed + i * octet_bytes + blk * Q3K_X8_BYTES + 64 * line);
    for (int j = 0; j < 8; ++j) {
      for (int i = 0; i < O; ++i) {
        const uint8_t* g = packed + i * octet_bytes + blk * Q3K_X8_BYTES + Q3K_X8_HEADER + j * Q3K_X8_GROUP;
        prefetch_tile_line<R>(g);
        prefetch_tile_line<R>(g + 64);
      }
      const int64_t k0 = (blk * 8 + j) * avx2::Q8_GROUP;
      for (int p = 0; p < 2; ++p) {
        __m256i sc16[O], cv[O], hb[O];
        for (int i = 0; i < O; ++i) {
          const uint8_t* base = packed + i * octet_bytes + blk * Q3K_X8_BYTES;
          const uint8_t* g = base + Q3K_X8_HEADER + j * Q3K_X8_GROUP;
          int64_t scales;
          std::memcpy(&scales, base + 32 + (2 * j + p) * 8, sizeof(scales));
          sc16[i] = _mm256_srai_epi16(_mm256_shuffle_epi8(_mm256_set1_epi64x(scales), scale_twice), 8);
          cv[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + p * 32));
          hb[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 64));
        }
        for (int sub = 0; sub < 2; ++sub) {
          const int kk = 2 * p + sub;
          __m256i lo[O], hi[O];
          for (int i = 0; i < O; ++i) {
            lo[i] = q3_low_256(cv[i], hb[i], sub, kk);
            hi[i] = q3_high_256(cv[i], hb[i], sub, kk);
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
      const uint8_t* base = packed + i * octet_bytes + blk * Q3K_X8_BYTES;
      // sum_s sc_s * (row's byte sum over s's 16 k), two scales per madd (q6k_x8_tile_avx2's).
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
        const __m256i centred = _mm256_sub_epi32(block_sum[r][i], _mm256_slli_epi32(offset[r], 2));
        const __m256 d_xs = _mm256_mul_ps(d, _mm256_set1_ps(xq.scale[(m0 + r) * groups + blk * 8]));
        acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(centred), d_xs, acc[r][i]);
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < O; ++i) _mm256_storeu_ps(out + (m0 + r) * ldo + n0 + 8 * i, acc[r][i]);
}

template <int R>
inline void q3k_x8_rows_avx2(const avx2::QuantizedRows& xq, const int32_t* half_sums, int64_t m0, int64_t rows,
                             const uint8_t* packed, int64_t octet_bytes, int64_t K, float* out, int64_t ldo, int64_t n0) {
  int64_t m = m0;
  for (; m + R <= m0 + rows; m += R) q3k_x8_tile_avx2<R, 1>(xq, half_sums, m, packed, octet_bytes, K, out, ldo, n0);
  if constexpr (R > 1) {
    if (m < m0 + rows) q3k_x8_rows_avx2<R - 1>(xq, half_sums, m, m0 + rows - m, packed, octet_bytes, K, out, ldo, n0);
  }
}

// Rows per prefill tile of a lone octet (every tier) and of the AVX2 tier's octets.
constexpr int Q3K_AVX2_ROWS = 4;

#ifdef CADENCE_GGUF_X16
// The AVX-512 tiers: two octets per register, q6k_x16_tile's steps (q6k_scaled_add: with VNNI a
// vpdpbusd chain per 16 k and one vpmulld by the scale; without, maddubs pairs and madd) on the
// 3-bit quants; the offset as q6k_offset_add's vpdpwssd with -4 sc in place of -32 sc.

// The 16 k of scale 2j + p in two octets' blocks at b0, b1 as q bytes (0..7), q6k_decode_16k's order.
inline void q3k_decode_16k(const uint8_t* b0, const uint8_t* b1, int j, int p, __m512i w[4]) {
  const uint8_t* g0 = b0 + Q3K_X8_HEADER + j * Q3K_X8_GROUP;
  const uint8_t* g1 = b1 + Q3K_X8_HEADER + j * Q3K_X8_GROUP;
  const __m512i three = _mm512_set1_epi8(3), four = _mm512_set1_epi8(4);
  const __m512i cv = load_pair(g0 + p * 32, g1 + p * 32);
  const __m512i hb = load_pair(g0 + 64, g1 + 64);
  const __m512i hb2 = _mm512_slli_epi16(hb, 2);
  for (int sub = 0; sub < 2; ++sub) {
    const int kk = 2 * p + sub;
    // bits 0-1 from cv, bit 2 (the third bit) from hb: (A & 3) | (B & 4) in one ternary op each.
    w[2 * sub] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(cv, 4 * sub), three),
                                           _mm512_srli_epi16(hb, kk + 2), four, 0xF8);
    w[2 * sub + 1] = _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(cv, 4 * sub + 2), three),
                                               _mm512_srli_epi16(hb2, kk), four, 0xF8);
  }
}

// block_sum[r] += -4 * sum_s sc_s * hs_s for R rows (q6k_offset_add with -4 for -32).
template <int R>
inline void q3k_offset_add(const int32_t* hs, int64_t stride, const uint8_t* b0, const uint8_t* b1, __m512i* block_sum) {
  alignas(32) int32_t pairs[R][8];
  for (int r = 0; r < R; ++r)
    _mm256_store_si256(reinterpret_cast<__m256i*>(pairs[r]), _mm512_cvtepi32_epi16(_mm512_loadu_si512(hs + r * stride)));
  for (int i = 0; i < 8; ++i) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b0 + 32 + 16 * i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b1 + 32 + 16 * i));
    const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_unpacklo_epi8(a, _mm_srli_si128(a, 8))),
                                                 _mm_unpacklo_epi8(b, _mm_srli_si128(b, 8)), 1);
    const __m512i offset = _mm512_sub_epi16(_mm512_setzero_si512(), _mm512_slli_epi16(_mm512_cvtepi8_epi16(both), 2));
    for (int r = 0; r < R; ++r) block_sum[r] = word_dot_add_512(block_sum[r], offset, _mm512_set1_epi32(pairs[r][i]));
  }
}

constexpr int Q3K_X16_ROWS = 8;

template <int R>
inline void q3k_x16_tile(const avx2::QuantizedRows& xq, const int32_t* half_sums, int64_t m0, const uint8_t* packed,
                         int64_t octet_bytes, int64_t K, float* out, int64_t ldo, int64_t n0) {
  const int64_t groups = K / avx2::Q8_GROUP;
  for (int64_t blk = 0; blk < K / 256; ++blk) {
    const uint8_t* b0 = packed + blk * Q3K_X8_BYTES;
    const uint8_t* b1 = b0 + octet_bytes;
    for (int line = 0; line < 3; ++line) {  // the header (d, scales): 160 bytes
      _mm_prefetch(reinterpret_cast<const char*>(b0 + PREFETCH_AHEAD + 64 * line), PREFETCH_HINT);
      _mm_prefetch(reinterpret_cast<const char*>(b1 + PREFETCH_AHEAD + 64 * line), PREFETCH_HINT);
    }
    __m512i block_sum[R];
    for (int r = 0; r < R; ++r) block_sum[r] = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) {
      for (const uint8_t* base : {b0, b1}) {
        _mm_prefetch(reinterpret_cast<const char*>(base + Q3K_X8_HEADER + j * Q3K_X8_GROUP + PREFETCH_AHEAD), PREFETCH_HINT);
        _mm_prefetch(reinterpret_cast<const char*>(base + Q3K_X8_HEADER + j * Q3K_X8_GROUP + PREFETCH_AHEAD + 64), PREFETCH_HINT);
      }
      for (int p = 0; p < 2; ++p) {
        __m512i w[4];
        q3k_decode_16k(b0, b1, j, p, w);
        const __m512i sc = q6k_scale_operand(b0 + 32 + (2 * j + p) * 8, b1 + 32 + (2 * j + p) * 8);
        const int64_t k = (blk * 8 + j) * avx2::Q8_GROUP + 16 * p;
        for (int r = 0; r < R; ++r) block_sum[r] = q6k_scaled_add(block_sum[r], w, xq.q_at(m0 + r, k), sc);
      }
    }
    q3k_offset_add<R>(half_sums + m0 * (K / 16) + blk * 16, K / 16, b0, b1, block_sum);
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

// One row against P pairs of octets at once: q3k_x16_tile<1>'s operations lane for lane.
template <int P>
inline void q3k_x16_gemv(const avx2::QuantizedRows& xq, const int32_t* half_sums, const uint8_t* packed,
                         int64_t octet_bytes, int64_t K, float* out) {
  __m512 acc[P];
  for (int p = 0; p < P; ++p) acc[p] = _mm512_setzero_ps();
  for (int64_t blk = 0; blk < K / 256; ++blk) {
    const uint8_t* b[2 * P];
    for (int i = 0; i < 2 * P; ++i) {
      b[i] = packed + i * octet_bytes + blk * Q3K_X8_BYTES;
      for (int line = 0; line < 3; ++line)  // the header (d, scales): 160 bytes
        _mm_prefetch(reinterpret_cast<const char*>(b[i] + PREFETCH_AHEAD + 64 * line), PREFETCH_HINT);
    }
    __m512i block_sum[P];
    for (int p = 0; p < P; ++p) block_sum[p] = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) {
      for (int i = 0; i < 2 * P; ++i) {
        _mm_prefetch(reinterpret_cast<const char*>(b[i] + Q3K_X8_HEADER + j * Q3K_X8_GROUP + PREFETCH_AHEAD), PREFETCH_HINT);
        _mm_prefetch(reinterpret_cast<const char*>(b[i] + Q3K_X8_HEADER + j * Q3K_X8_GROUP + PREFETCH_AHEAD + 64), PREFETCH_HINT);
      }
      for (int hp = 0; hp < 2; ++hp) {
        const int8_t* x = xq.q_at(0, (blk * 8 + j) * avx2::Q8_GROUP + 16 * hp);
        for (int p = 0; p < P; ++p) {
          __m512i w[4];
          q3k_decode_16k(b[2 * p], b[2 * p + 1], j, hp, w);
          const __m512i sc = q6k_scale_operand(b[2 * p] + 32 + (2 * j + hp) * 8, b[2 * p + 1] + 32 + (2 * j + hp) * 8);
          block_sum[p] = q6k_scaled_add(block_sum[p], w, x, sc);
        }
      }
    }
    const __m512 xs = _mm512_set1_ps(xq.scale[blk * 8]);
    for (int p = 0; p < P; ++p) {
      q3k_offset_add<1>(half_sums + blk * 16, 0, b[2 * p], b[2 * p + 1], &block_sum[p]);
      acc[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(block_sum[p]), _mm512_mul_ps(load_pair_ps(b[2 * p], b[2 * p + 1]), xs), acc[p]);
    }
  }
  for (int p = 0; p < P; ++p) store_pair(out + 16 * p, acc[p]);
}

template <int R>
inline void q3k_x16_rows(const avx2::QuantizedRows& xq, const int32_t* half_sums, int64_t m0, int64_t rows,
                         const uint8_t* packed, int64_t octet_bytes, int64_t K, float* out, int64_t ldo, int64_t n0) {
  int64_t m = m0;
  for (; m + R <= m0 + rows; m += R) q3k_x16_tile<R>(xq, half_sums, m, packed, octet_bytes, K, out, ldo, n0);
  if constexpr (R > 1) {
    if (m < m0 + rows) q3k_x16_rows<R - 1>(xq, half_sums, m, m0 + rows - m, packed, octet_bytes, K, out, ldo, n0);
  }
}
#endif

// Octets [o_begin, o_end) of a repacked Q3_K weight for every row: a decode row four octets at a
// time (two pairs on the AVX-512 tiers), then two, one; more rows in L2-sized row blocks.
inline void q3k_x8_columns(const avx2::QuantizedRows& xq, const int32_t* half_sums, int64_t M, const uint8_t* packed,
                           int64_t K, float* out, int64_t ldo, int64_t o_begin, int64_t o_end) {
  const int64_t octet_bytes = K / 256 * Q3K_X8_BYTES;
#ifdef CADENCE_GGUF_X16
  if (M == 1) {
    int64_t o = o_begin;
    for (; o + 4 <= o_end; o += 4) q3k_x16_gemv<2>(xq, half_sums, packed + o * octet_bytes, octet_bytes, K, out + 8 * o);
    for (; o + 2 <= o_end; o += 2) q3k_x16_tile<1>(xq, half_sums, 0, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
    if (o < o_end) q3k_x8_tile_avx2<1, 1>(xq, half_sums, 0, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
    return;
  }
  const int64_t row_block = std::max<int64_t>(Q3K_X16_ROWS, (256 << 10) / K / Q3K_X16_ROWS * Q3K_X16_ROWS);
  for (int64_t mb = 0; mb < M; mb += row_block) {
    const int64_t rows = std::min(row_block, M - mb);
    int64_t o = o_begin;
    for (; o + 2 <= o_end; o += 2)
      q3k_x16_rows<Q3K_X16_ROWS>(xq, half_sums, mb, rows, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
    if (o < o_end)
      q3k_x8_rows_avx2<Q3K_AVX2_ROWS>(xq, half_sums, mb, rows, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
  }
#else
  if (M == 1) {
    int64_t o = o_begin;
    for (; o + 4 <= o_end; o += 4)
      q3k_x8_tile_avx2<1, 4>(xq, half_sums, 0, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
    for (; o + 2 <= o_end; o += 2)
      q3k_x8_tile_avx2<1, 2>(xq, half_sums, 0, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
    if (o < o_end) q3k_x8_tile_avx2<1, 1>(xq, half_sums, 0, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
    return;
  }
  const int64_t row_block = std::max<int64_t>(Q3K_AVX2_ROWS, (256 << 10) / K / Q3K_AVX2_ROWS * Q3K_AVX2_ROWS);
  for (int64_t mb = 0; mb < M; mb += row_block) {
    const int64_t rows = std::min(row_block, M - mb);
    for (int64_t o = o_begin; o < o_end; ++o)
      q3k_x8_rows_avx2<Q3K_AVX2_ROWS>(xq, half_sums, mb, rows, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
  }
#endif
}

#endif  // CADENCE_HAVE_AVX2

}  // namespace gguf
}  // namespace cadence_kernels
