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

// half_sums: [M][K / 16] sums of xq's bytes per 16 k (for the q - 32 offset). As q4k_x8_tile:
// O consecutive octets (octet_bytes apart) and two exact integer sums per (row, octet) and 16 k,
// added once: 2 * R * O independent dot-product chains, the same instructions per (row, column)
// whatever R and O.
template <int R, int O>
inline void q6k_x8_tile(const avx2::QuantizedRows& xq, const int32_t* half_sums, int64_t m0, const uint8_t* packed,
                        int64_t octet_bytes, int64_t K, float* out, int64_t ldo, int64_t n0) {
  __m256 acc[R][O];
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < O; ++i) acc[r][i] = _mm256_setzero_ps();
  const __m256i ones16 = _mm256_set1_epi16(1), low4 = _mm256_set1_epi8(0x0F), bits45 = _mm256_set1_epi8(0x30);
  const int64_t groups = K / avx2::Q8_GROUP;
  for (int64_t blk = 0; blk < K / 256; ++blk) {
    for (int j = 0; j < 8; ++j) {
      for (int i = 0; i < O; ++i) {
        const uint8_t* base = packed + i * octet_bytes + blk * Q6K_X8_BYTES;
        _mm_prefetch(reinterpret_cast<const char*>(base + Q6K_X8_QL + j * 128 + PREFETCH_AHEAD), PREFETCH_HINT);
        _mm_prefetch(reinterpret_cast<const char*>(base + Q6K_X8_QL + j * 128 + PREFETCH_AHEAD + 64), PREFETCH_HINT);
        _mm_prefetch(reinterpret_cast<const char*>(base + Q6K_X8_QH + j * 64 + PREFETCH_AHEAD), PREFETCH_HINT);
      }
      const int64_t g = blk * 8 + j;
      for (int p = 0; p < 2; ++p) {
        __m256i lo_sum[R][O], hi_sum[R][O];
        for (int r = 0; r < R; ++r)
          for (int i = 0; i < O; ++i) lo_sum[r][i] = hi_sum[r][i] = _mm256_setzero_si256();
        for (int sub = 0; sub < 2; ++sub) {
          const int kk = 2 * p + sub;
          __m256i lo[O], hi[O];
          for (int i = 0; i < O; ++i) {
            const uint8_t* base = packed + i * octet_bytes + blk * Q6K_X8_BYTES;
            const __m256i hv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + Q6K_X8_QH + (j * 2 + p) * 32));
            const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base + Q6K_X8_QL + j * 128 + kk * 32));
            // bits 4-5 of each byte: the high bits of q[8kk + t] (lo) and q[8kk + 4 + t] (hi).
            const __m256i h_lo = _mm256_and_si256(sub == 0 ? _mm256_slli_epi16(hv, 4) : hv, bits45);
            const __m256i h_hi =
                _mm256_and_si256(sub == 0 ? _mm256_slli_epi16(hv, 2) : _mm256_srli_epi16(hv, 2), bits45);
            lo[i] = _mm256_or_si256(_mm256_and_si256(v, low4), h_lo);
            hi[i] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4), h_hi);
          }
          const int64_t k = g * avx2::Q8_GROUP + kk * 8;
          for (int r = 0; r < R; ++r) {
            const __m256i x_lo = avx2::broadcast4(xq.q_at(m0 + r, k)), x_hi = avx2::broadcast4(xq.q_at(m0 + r, k + 4));
            for (int i = 0; i < O; ++i) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
              lo_sum[r][i] = avx2::udot4_add(lo_sum[r][i], lo[i], x_lo, ones16);
              hi_sum[r][i] = avx2::udot4_add(hi_sum[r][i], hi[i], x_hi, ones16);
#else
              // The two maddubs' int16 pair sums added first (each <= 2 * 63 * 127 = 16002, the
              // two 32004 < 2^15: exact), then one madd: half the widening multiplies.
              lo_sum[r][i] = _mm256_add_epi32(lo_sum[r][i], _mm256_madd_epi16(_mm256_add_epi16(
                  _mm256_maddubs_epi16(lo[i], x_lo), _mm256_maddubs_epi16(hi[i], x_hi)), ones16));
#endif
            }
          }
        }
        for (int i = 0; i < O; ++i) {
          const uint8_t* base = packed + i * octet_bytes + blk * Q6K_X8_BYTES;
          const __m256 d = _mm256_loadu_ps(reinterpret_cast<const float*>(base));
          const __m256 scale = _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(
                                                    reinterpret_cast<const __m128i*>(base + 32 + (2 * j + p) * 8)))));
          for (int r = 0; r < R; ++r) {
            const int32_t x_sum = half_sums[(m0 + r) * (K / 16) + 2 * g + p];
            const __m256i isum = _mm256_add_epi32(lo_sum[r][i], hi_sum[r][i]);
            const __m256i centred = _mm256_sub_epi32(isum, _mm256_set1_epi32(32 * x_sum));
            const float xs = xq.scale[(m0 + r) * groups + g];
            acc[r][i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(centred), _mm256_mul_ps(scale, _mm256_set1_ps(xs)), acc[r][i]);
          }
        }
      }
    }
  }
  for (int r = 0; r < R; ++r)
    for (int i = 0; i < O; ++i) _mm256_storeu_ps(out + (m0 + r) * ldo + n0 + 8 * i, acc[r][i]);
}

#ifdef CADENCE_GGUF_X16
// q6k_x8_tile<R, 2> on the AVX-512 tiers: two octets in the halves of each register (x16_pairs.h).
template <int R>
inline void q6k_x16_tile(const avx2::QuantizedRows& xq, const int32_t* half_sums, int64_t m0, const uint8_t* packed,
                         int64_t octet_bytes, int64_t K, float* out, int64_t ldo, int64_t n0) {
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const __m512i low4 = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30);
  const int64_t groups = K / avx2::Q8_GROUP;
  for (int64_t blk = 0; blk < K / 256; ++blk) {
    const uint8_t* b0 = packed + blk * Q6K_X8_BYTES;
    const uint8_t* b1 = b0 + octet_bytes;
    const __m512 d = load_pair_ps(b0, b1);
    for (int j = 0; j < 8; ++j) {
      for (const uint8_t* base : {b0, b1}) {
        _mm_prefetch(reinterpret_cast<const char*>(base + Q6K_X8_QL + j * 128 + PREFETCH_AHEAD), PREFETCH_HINT);
        _mm_prefetch(reinterpret_cast<const char*>(base + Q6K_X8_QL + j * 128 + PREFETCH_AHEAD + 64), PREFETCH_HINT);
        _mm_prefetch(reinterpret_cast<const char*>(base + Q6K_X8_QH + j * 64 + PREFETCH_AHEAD), PREFETCH_HINT);
      }
      const int64_t g = blk * 8 + j;
      for (int p = 0; p < 2; ++p) {
        const __m512i hv = load_pair(b0 + Q6K_X8_QH + (j * 2 + p) * 32, b1 + Q6K_X8_QH + (j * 2 + p) * 32);
        __m512i lo_sum[R], hi_sum[R];
        for (int r = 0; r < R; ++r) lo_sum[r] = hi_sum[r] = _mm512_setzero_si512();
        for (int sub = 0; sub < 2; ++sub) {
          const int kk = 2 * p + sub;
          const __m512i v = load_pair(b0 + Q6K_X8_QL + j * 128 + kk * 32, b1 + Q6K_X8_QL + j * 128 + kk * 32);
          const __m512i h_lo = _mm512_and_si512(sub == 0 ? _mm512_slli_epi16(hv, 4) : hv, bits45);
          const __m512i h_hi = _mm512_and_si512(sub == 0 ? _mm512_slli_epi16(hv, 2) : _mm512_srli_epi16(hv, 2), bits45);
          const __m512i lo = _mm512_or_si512(_mm512_and_si512(v, low4), h_lo);
          const __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), low4), h_hi);
          const int64_t k = g * avx2::Q8_GROUP + kk * 8;
          for (int r = 0; r < R; ++r) {
            lo_sum[r] = udot4_add_512(lo_sum[r], lo, broadcast4_512(xq.q_at(m0 + r, k)));
            hi_sum[r] = udot4_add_512(hi_sum[r], hi, broadcast4_512(xq.q_at(m0 + r, k + 4)));
          }
        }
        const __m512 scale = _mm512_mul_ps(d, bytes_pair_ps(b0 + 32 + (2 * j + p) * 8, b1 + 32 + (2 * j + p) * 8, true));
        for (int r = 0; r < R; ++r) {
          const int32_t x_sum = half_sums[(m0 + r) * (K / 16) + 2 * g + p];
          const __m512i isum = _mm512_add_epi32(lo_sum[r], hi_sum[r]);
          const __m512i centred = _mm512_sub_epi32(isum, _mm512_set1_epi32(32 * x_sum));
          const float xs = xq.scale[(m0 + r) * groups + g];
          acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(centred), _mm512_mul_ps(scale, _mm512_set1_ps(xs)), acc[r]);
        }
      }
    }
  }
  for (int r = 0; r < R; ++r) store_pair(out + (m0 + r) * ldo + n0, acc[r]);
}

// One row against P pairs of octets at once (q4k_x16_gemv's reasoning): q6k_x16_tile<1>'s
// operations lane for lane.
template <int P>
inline void q6k_x16_gemv(const avx2::QuantizedRows& xq, const int32_t* half_sums, const uint8_t* packed,
                         int64_t octet_bytes, int64_t K, float* out) {
  __m512 acc[P];
  for (int p = 0; p < P; ++p) acc[p] = _mm512_setzero_ps();
  const __m512i low4 = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30);
  for (int64_t blk = 0; blk < K / 256; ++blk) {
    const uint8_t* b[2 * P];
    for (int i = 0; i < 2 * P; ++i) b[i] = packed + i * octet_bytes + blk * Q6K_X8_BYTES;
    __m512 d[P];
    for (int p = 0; p < P; ++p) d[p] = load_pair_ps(b[2 * p], b[2 * p + 1]);
    for (int j = 0; j < 8; ++j) {
      for (int i = 0; i < 2 * P; ++i) {
        _mm_prefetch(reinterpret_cast<const char*>(b[i] + Q6K_X8_QL + j * 128 + PREFETCH_AHEAD), PREFETCH_HINT);
        _mm_prefetch(reinterpret_cast<const char*>(b[i] + Q6K_X8_QL + j * 128 + PREFETCH_AHEAD + 64), PREFETCH_HINT);
        _mm_prefetch(reinterpret_cast<const char*>(b[i] + Q6K_X8_QH + j * 64 + PREFETCH_AHEAD), PREFETCH_HINT);
      }
      const int64_t g = blk * 8 + j;
      const __m512 xs = _mm512_set1_ps(xq.scale[g]);
      for (int hp = 0; hp < 2; ++hp) {
        __m512i lo_sum[P], hi_sum[P];
        for (int p = 0; p < P; ++p) lo_sum[p] = hi_sum[p] = _mm512_setzero_si512();
        for (int sub = 0; sub < 2; ++sub) {
          const int kk = 2 * hp + sub;
          const int64_t k = g * avx2::Q8_GROUP + kk * 8;
          const __m512i x_lo = broadcast4_512(xq.q_at(0, k)), x_hi = broadcast4_512(xq.q_at(0, k + 4));
          for (int p = 0; p < P; ++p) {
            const __m512i hv = load_pair(b[2 * p] + Q6K_X8_QH + (j * 2 + hp) * 32, b[2 * p + 1] + Q6K_X8_QH + (j * 2 + hp) * 32);
            const __m512i v = load_pair(b[2 * p] + Q6K_X8_QL + j * 128 + kk * 32, b[2 * p + 1] + Q6K_X8_QL + j * 128 + kk * 32);
            const __m512i h_lo = _mm512_and_si512(sub == 0 ? _mm512_slli_epi16(hv, 4) : hv, bits45);
            const __m512i h_hi = _mm512_and_si512(sub == 0 ? _mm512_slli_epi16(hv, 2) : _mm512_srli_epi16(hv, 2), bits45);
            const __m512i lo = _mm512_or_si512(_mm512_and_si512(v, low4), h_lo);
            const __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), low4), h_hi);
            lo_sum[p] = udot4_add_512(lo_sum[p], lo, x_lo);
            hi_sum[p] = udot4_add_512(hi_sum[p], hi, x_hi);
          }
        }
        const __m512i x_sum = _mm512_set1_epi32(32 * half_sums[2 * g + hp]);
        for (int p = 0; p < P; ++p) {
          const __m512 scale =
              _mm512_mul_ps(d[p], bytes_pair_ps(b[2 * p] + 32 + (2 * j + hp) * 8, b[2 * p + 1] + 32 + (2 * j + hp) * 8, true));
          const __m512i centred = _mm512_sub_epi32(_mm512_add_epi32(lo_sum[p], hi_sum[p]), x_sum);
          acc[p] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(centred), _mm512_mul_ps(scale, xs), acc[p]);
        }
      }
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

#ifndef CADENCE_GGUF_X16
// The AVX2 tier's tiles (maddubs, no VNNI), as q4k_x8_tile_avx2: the 16-weight scales applied in
// integers. Per (row, octet) and 8 k the two maddubs' int16 pair sums are added (4 products of
// q <= 63 and |x| <= 127: <= 32004, exact), one madd multiplies them by the 16 k's scale (int16
// pairs of the signed sc) into int32, added to the block's sum (16 x 2 x 32004 x 128 < 2^31);
// q's offset of 32 is taken off once per block in integers (32 * sum of sc_s * the row's byte sum
// over the 16 k of s), and the float work runs once per 256-block. The same instructions per
// (row, column) whatever R and O.
template <int R, int O>
inline void q6k_x8_tile_avx2(const avx2::QuantizedRows& xq, const int32_t* half_sums, int64_t m0, const uint8_t* packed,
                             int64_t octet_bytes, int64_t K, float* out, int64_t ldo, int64_t n0) {
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
        prefetch_tile_line<R>(base + Q6K_X8_QL + j * 128);
        prefetch_tile_line<R>(base + Q6K_X8_QL + j * 128 + 64);
        prefetch_tile_line<R>(base + Q6K_X8_QH + j * 64);
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
#endif

template <int R, int O>
inline void q6k_x8_rows(const avx2::QuantizedRows& xq, const int32_t* half_sums, int64_t m0, int64_t rows,
                        const uint8_t* packed, int64_t octet_bytes, int64_t K, float* out, int64_t ldo, int64_t n0) {
  int64_t m = m0;
  for (; m + R <= m0 + rows; m += R) q6k_x8_tile<R, O>(xq, half_sums, m, packed, octet_bytes, K, out, ldo, n0);
  if constexpr (R > 1) {
    if (m < m0 + rows) q6k_x8_rows<R - 1, O>(xq, half_sums, m, m0 + rows - m, packed, octet_bytes, K, out, ldo, n0);
  }
}

inline void q6k_x8_columns(const avx2::QuantizedRows& xq, const int32_t* half_sums, int64_t M, const uint8_t* packed,
                           int64_t K, float* out, int64_t ldo, int64_t o_begin, int64_t o_end) {
  const int64_t octet_bytes = K / 256 * Q6K_X8_BYTES;
#ifdef CADENCE_GGUF_X16
  constexpr int ROWS = 4;  // the lone octet's tile rows
  if (M == 1) {
    int64_t o = o_begin;
    for (; o + 4 <= o_end; o += 4) q6k_x16_gemv<2>(xq, half_sums, packed + o * octet_bytes, octet_bytes, K, out + 8 * o);
    for (; o + 2 <= o_end; o += 2) q6k_x16_tile<1>(xq, half_sums, 0, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
    if (o < o_end) q6k_x8_tile<1, 1>(xq, half_sums, 0, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
    return;
  }
  const int64_t row_block = std::max<int64_t>(ROWS, (256 << 10) / K / ROWS * ROWS);
  for (int64_t mb = 0; mb < M; mb += row_block) {
    const int64_t rows = std::min(row_block, M - mb);
    int64_t o = o_begin;
    for (; o + 2 <= o_end; o += 2)
      q6k_x16_rows<X16_ROWS>(xq, half_sums, mb, rows, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
    if (o < o_end) q6k_x8_rows<ROWS, 1>(xq, half_sums, mb, rows, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
  }
#else
  if (M == 1) {  // four octets at a time where they are (as Q4_K's six: more streams in flight)
    int64_t o = o_begin;
    for (; o + 4 <= o_end; o += 4)
      q6k_x8_tile_avx2<1, 4>(xq, half_sums, 0, packed + o * octet_bytes, octet_bytes, K, out, ldo, 8 * o);
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
