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

// out[(m0 + r) * ldo + n0 + 8i + c], c < 8, r < R, i < O: rows of x against O consecutive octets
// (packed: the first, octet_bytes apart). Each (row, octet) pair keeps two integer sums per group
// (the low and the high nibbles'), so a tile runs 2 * R * O independent vpdpbusd chains instead of
// R chains 8 deep (a decode row had one: its latency, not memory, bounded the GEMV). The sums are
// exact integers, added once per group; every (row, column) pair runs the same instructions in
// the same order whatever R and O: a row's result does not depend on the rows beside it.
template <int R, int O>
inline void q4k_x8_tile(const avx2::QuantizedRows& xq, int64_t m0, const uint8_t* packed, int64_t octet_bytes,
                        int64_t K, float* out, int64_t ldo, int64_t n0) {
  __m256 acc[R][O];
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < O; ++i) acc[r][i] = _mm256_setzero_ps();
  const __m256i ones16 = _mm256_set1_epi16(1), low4 = _mm256_set1_epi8(0x0F);
  const int64_t groups = K / avx2::Q8_GROUP;
  for (int64_t blk = 0; blk < K / 256; ++blk) {
    for (int i = 0; i < O; ++i)
      _mm_prefetch(reinterpret_cast<const char*>(packed + i * octet_bytes + blk * Q4K_X8_BYTES + 2048), _MM_HINT_T0);
    for (int j = 0; j < 8; ++j) {
      const int64_t g = blk * 8 + j;
      // VNNI: two int32 chains per (row, octet). Without it: maddubs' int16 pair sums added in
      // int16 over the whole group (each pair <= 2 * 15 * 127 = 3810, eight of them 30480 <
      // 2^15: exact), widened by one madd per group instead of one per maddubs.
      __m256i lo_sum[R][O], hi_sum[R][O];
      for (int r = 0; r < R; ++r)
        for (int i = 0; i < O; ++i) lo_sum[r][i] = hi_sum[r][i] = _mm256_setzero_si256();
      for (int i = 0; i < O; ++i) {
        const uint8_t* q = packed + i * octet_bytes + blk * Q4K_X8_BYTES + Q4K_X8_HEADER + j * 128;
        _mm_prefetch(reinterpret_cast<const char*>(q + 2048), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(q + 2048 + 64), _MM_HINT_T0);
      }
      for (int kk = 0; kk < 4; ++kk) {
        const int64_t k = g * avx2::Q8_GROUP + kk * 8;
        __m256i lo[O], hi[O];
        for (int i = 0; i < O; ++i) {
          const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(
              packed + i * octet_bytes + blk * Q4K_X8_BYTES + Q4K_X8_HEADER + j * 128 + kk * 32));
          lo[i] = _mm256_and_si256(v, low4);
          hi[i] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        }
        for (int r = 0; r < R; ++r) {
          const __m256i x_lo = avx2::broadcast4(xq.q_at(m0 + r, k)), x_hi = avx2::broadcast4(xq.q_at(m0 + r, k + 4));
          for (int i = 0; i < O; ++i) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
            lo_sum[r][i] = avx2::udot4_add(lo_sum[r][i], lo[i], x_lo, ones16);
            hi_sum[r][i] = avx2::udot4_add(hi_sum[r][i], hi[i], x_hi, ones16);
#else
            lo_sum[r][i] = _mm256_add_epi16(lo_sum[r][i], _mm256_maddubs_epi16(lo[i], x_lo));
            hi_sum[r][i] = _mm256_add_epi16(hi_sum[r][i], _mm256_maddubs_epi16(hi[i], x_hi));
#endif
          }
        }
      }
#if !(defined(__AVX512VNNI__) && defined(__AVX512VL__))
      for (int r = 0; r < R; ++r)
        for (int i = 0; i < O; ++i) {
          lo_sum[r][i] = _mm256_madd_epi16(_mm256_add_epi16(lo_sum[r][i], hi_sum[r][i]), ones16);
          hi_sum[r][i] = _mm256_setzero_si256();
        }
#endif
      for (int i = 0; i < O; ++i) {
        const uint8_t* hdr = packed + i * octet_bytes + blk * Q4K_X8_BYTES;
        const __m256 d = _mm256_loadu_ps(reinterpret_cast<const float*>(hdr));
        const __m256 dmin = _mm256_loadu_ps(reinterpret_cast<const float*>(hdr + 32));
        const __m256 a = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                                              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(hdr + 64 + 8 * j)))));
        const __m256 b = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                                                 _mm_loadl_epi64(reinterpret_cast<const __m128i*>(hdr + 128 + 8 * j)))));
        for (int r = 0; r < R; ++r) {
          const __m256i isum = _mm256_add_epi32(lo_sum[r][i], hi_sum[r][i]);
          const float row_scale = xq.scale[(m0 + r) * groups + g], row_sum = xq.sum[(m0 + r) * groups + g];
          acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(a, _mm256_set1_ps(row_scale)), acc[r][i]);
          acc[r][i] = _mm256_fnmadd_ps(b, _mm256_set1_ps(row_sum), acc[r][i]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < O; ++i) _mm256_storeu_ps(out + (m0 + r) * ldo + n0 + 8 * i, acc[r][i]);
}

#ifdef CADENCE_GGUF_X16
// q4k_x8_tile<R, 2> on the AVX-512 tiers: the octets at `packed` and packed + octet_bytes in the
// two halves of each register (x16_pairs.h), the same operations lane for lane.
template <int R>
inline void q4k_x16_tile(const avx2::QuantizedRows& xq, int64_t m0, const uint8_t* packed, int64_t octet_bytes,
                         int64_t K, float* out, int64_t ldo, int64_t n0) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const int64_t groups = K / avx2::Q8_GROUP;
  for (int64_t blk = 0; blk < K / 256; ++blk) {
    const uint8_t* h0 = packed + blk * Q4K_X8_BYTES;
    const uint8_t* h1 = h0 + octet_bytes;
    _mm_prefetch(reinterpret_cast<const char*>(h0 + 2048), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(h1 + 2048), _MM_HINT_T0);
    const __m512 d = load_pair_ps(h0, h1), dmin = load_pair_ps(h0 + 32, h1 + 32);
    for (int j = 0; j < 8; ++j) {
      const int64_t g = blk * 8 + j;
      const uint8_t* q0 = h0 + Q4K_X8_HEADER + j * 128;
      const uint8_t* q1 = h1 + Q4K_X8_HEADER + j * 128;
      _mm_prefetch(reinterpret_cast<const char*>(q0 + 2048), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(q0 + 2048 + 64), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(q1 + 2048), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(q1 + 2048 + 64), _MM_HINT_T0);
      __m512i lo_sum[R], hi_sum[R];
      for (int r = 0; r < R; ++r) lo_sum[r] = hi_sum[r] = _mm512_setzero_si512();
      for (int kk = 0; kk < 4; ++kk) {
        const __m512i v = load_pair(q0 + kk * 32, q1 + kk * 32);
        const __m512i lo = _mm512_and_si512(v, low4), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
        const int64_t k = g * avx2::Q8_GROUP + kk * 8;
        for (int r = 0; r < R; ++r) {
          lo_sum[r] = udot4_add_512(lo_sum[r], lo, broadcast4_512(xq.q_at(m0 + r, k)));
          hi_sum[r] = udot4_add_512(hi_sum[r], hi, broadcast4_512(xq.q_at(m0 + r, k + 4)));
        }
      }
      const __m512 a = _mm512_mul_ps(d, bytes_pair_ps(h0 + 64 + 8 * j, h1 + 64 + 8 * j, false));
      const __m512 b = _mm512_mul_ps(dmin, bytes_pair_ps(h0 + 128 + 8 * j, h1 + 128 + 8 * j, false));
      for (int r = 0; r < R; ++r) {
        const __m512i isum = _mm512_add_epi32(lo_sum[r], hi_sum[r]);
        const float row_scale = xq.scale[(m0 + r) * groups + g], row_sum = xq.sum[(m0 + r) * groups + g];
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(a, _mm512_set1_ps(row_scale)), acc[r]);
        acc[r] = _mm512_fnmadd_ps(b, _mm512_set1_ps(row_sum), acc[r]);
      }
    }
  }
  for (int r = 0; r < R; ++r) store_pair(out + (m0 + r) * ldo + n0, acc[r]);
}

// One row (a decode step) against P pairs of octets at once (2P consecutive octets from
// `packed`): q4k_x16_tile<1>'s operations lane for lane, with P pairs' loads and dot-product
// chains in flight together (a GEMV is bound by how many memory streams and independent chains it
// keeps going, not by its instructions).
template <int P>
inline void q4k_x16_gemv(const avx2::QuantizedRows& xq, const uint8_t* packed, int64_t octet_bytes, int64_t K,
                         float* out) {
  __m512 acc[P];
  for (int p = 0; p < P; ++p) acc[p] = _mm512_setzero_ps();
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  for (int64_t blk = 0; blk < K / 256; ++blk) {
    const uint8_t* h[2 * P];
    for (int i = 0; i < 2 * P; ++i) {
      h[i] = packed + i * octet_bytes + blk * Q4K_X8_BYTES;
      _mm_prefetch(reinterpret_cast<const char*>(h[i] + 2048), _MM_HINT_T0);
    }
    __m512 d[P], dmin[P];
    for (int p = 0; p < P; ++p) {
      d[p] = load_pair_ps(h[2 * p], h[2 * p + 1]);
      dmin[p] = load_pair_ps(h[2 * p] + 32, h[2 * p + 1] + 32);
    }
    for (int j = 0; j < 8; ++j) {
      const int64_t g = blk * 8 + j;
      for (int i = 0; i < 2 * P; ++i) {
        _mm_prefetch(reinterpret_cast<const char*>(h[i] + Q4K_X8_HEADER + j * 128 + 2048), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(h[i] + Q4K_X8_HEADER + j * 128 + 2048 + 64), _MM_HINT_T0);
      }
      __m512i lo_sum[P], hi_sum[P];
      for (int p = 0; p < P; ++p) lo_sum[p] = hi_sum[p] = _mm512_setzero_si512();
      for (int kk = 0; kk < 4; ++kk) {
        const int64_t k = g * avx2::Q8_GROUP + kk * 8;
        const __m512i x_lo = broadcast4_512(xq.q_at(0, k)), x_hi = broadcast4_512(xq.q_at(0, k + 4));
        for (int p = 0; p < P; ++p) {
          const __m512i v = load_pair(h[2 * p] + Q4K_X8_HEADER + j * 128 + kk * 32,
                                      h[2 * p + 1] + Q4K_X8_HEADER + j * 128 + kk * 32);
          lo_sum[p] = udot4_add_512(lo_sum[p], _mm512_and_si512(v, low4), x_lo);
          hi_sum[p] = udot4_add_512(hi_sum[p], _mm512_and_si512(_mm512_srli_epi16(v, 4), low4), x_hi);
        }
      }
      const __m512 row_scale = _mm512_set1_ps(xq.scale[g]), row_sum = _mm512_set1_ps(xq.sum[g]);
      for (int p = 0; p < P; ++p) {
        const __m512 a = _mm512_mul_ps(d[p], bytes_pair_ps(h[2 * p] + 64 + 8 * j, h[2 * p + 1] + 64 + 8 * j, false));
        const __m512 b = _mm512_mul_ps(dmin[p], bytes_pair_ps(h[2 * p] + 128 + 8 * j, h[2 * p + 1] + 128 + 8 * j, false));
        const __m512i isum = _mm512_add_epi32(lo_sum[p], hi_sum[p]);
        acc[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(a, row_scale), acc[p]);
        acc[p] = _mm512_fnmadd_ps(b, row_sum, acc[p]);
      }
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
// The AVX2 tier's tiles (maddubs, no VNNI): R rows x O octets with the 6-bit scales applied in
// integers, as llama.cpp's AVX2 K-quant kernels do. Per (row, octet) and group of 32 k the eight
// maddubs' int16 pair sums add up in int16 (16 products of q <= 15 and |x| <= 127: <= 30480, exact),
// one madd multiplies them by the group's scale (int16 pairs of sc <= 63) into int32 and adds them
// to the block's sum (8 groups <= 3.1e7: exact); the float work (convert, d * x_scale, FMA) runs
// once per 256-block, not per group: a third fewer instructions per weight than q4k_x8_tile,
// whose per-group float step does not fit AVX2's 16 registers next to 4 rows' sums. The minimum
// terms stay per group in float (dmin * mn times the row's scaled group sum), added at the block's
// end. Every (row, column) pair runs the same instructions in the same order whatever R and O
// (the FMAs explicit): a row's result does not depend on the rows or columns beside it.
template <int R, int O>
inline void q4k_x8_tile_avx2(const avx2::QuantizedRows& xq, int64_t m0, const uint8_t* packed, int64_t octet_bytes,
                             int64_t K, float* out, int64_t ldo, int64_t n0) {
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
        _mm_prefetch(reinterpret_cast<const char*>(q + 2048), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(q + 2048 + 64), _MM_HINT_T0);
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
    for (int i = 0; i < O; ++i) {
      const uint8_t* hdr = packed + i * octet_bytes + blk * Q4K_X8_BYTES;
      const __m256 d = _mm256_loadu_ps(reinterpret_cast<const float*>(hdr));
      const __m256 dmin = _mm256_loadu_ps(reinterpret_cast<const float*>(hdr + 32));
      for (int r = 0; r < R; ++r) {
        const __m256 d_xs = _mm256_mul_ps(d, _mm256_set1_ps(xq.scale[(m0 + r) * groups + blk * 8]));
        acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(block_sum[r][i]), d_xs, acc[r][i]);
      }
      for (int j = 0; j < 8; ++j) {
        const __m256 b = _mm256_mul_ps(dmin, _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
                                                 _mm_loadl_epi64(reinterpret_cast<const __m128i*>(hdr + 128 + 8 * j)))));
        for (int r = 0; r < R; ++r)
          acc[r][i] = _mm256_fnmadd_ps(b, _mm256_set1_ps(xq.sum[(m0 + r) * groups + blk * 8 + j]), acc[r][i]);
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

template <int R, int O>
inline void q4k_x8_rows(const avx2::QuantizedRows& xq, int64_t m0, int64_t rows, const uint8_t* packed,
                        int64_t octet_bytes, int64_t K, float* out, int64_t ldo, int64_t n0) {
  int64_t m = m0;
  for (; m + R <= m0 + rows; m += R) q4k_x8_tile<R, O>(xq, m, packed, octet_bytes, K, out, ldo, n0);
  if constexpr (R > 1) {
    if (m < m0 + rows) q4k_x8_rows<R - 1, O>(xq, m, m0 + rows - m, packed, octet_bytes, K, out, ldo, n0);
  }
}

// Octets [o_begin, o_end) of a repacked Q4_K weight for every row (row blocks that stay in L2,
// as int_gemm_columns). One row (a decode step) takes the octets two at a time: independent
// chains hide the dot products' latency; more rows share each octet's decode across 4 rows.
inline void q4k_x8_columns(const avx2::QuantizedRows& xq, int64_t M, const uint8_t* packed, int64_t K, float* out,
                           int64_t ldo, int64_t o_begin, int64_t o_end) {
  const int64_t octet_bytes = K / 256 * Q4K_X8_BYTES;
#ifdef CADENCE_GGUF_X16
  constexpr int ROWS = 4;  // the lone octet's tile rows
  if (M == 1) {
    int64_t o = o_begin;
    for (; o + 4 <= o_end; o += 4) q4k_x16_gemv<2>(xq, packed + o * octet_bytes, octet_bytes, K, out + 8 * o);
    for (; o + 2 <= o_end; o += 2) q4k_x16_tile<1>(xq, 0, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
    if (o < o_end) q4k_x8_tile<1, 1>(xq, 0, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
    return;
  }
  const int64_t row_block = std::max<int64_t>(ROWS, (256 << 10) / K / ROWS * ROWS);
  for (int64_t mb = 0; mb < M; mb += row_block) {
    const int64_t rows = std::min(row_block, M - mb);
    int64_t o = o_begin;
    for (; o + 2 <= o_end; o += 2)
      q4k_x16_rows<X16_ROWS>(xq, mb, rows, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
    if (o < o_end) q4k_x8_rows<ROWS, 1>(xq, mb, rows, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
  }
#else
  if (M == 1) {
    int64_t o = o_begin;
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
