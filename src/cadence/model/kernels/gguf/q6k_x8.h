// Q6_K repacked at load, losslessly, with 8 columns interleaved (as q4k_x8.h for Q4_K: the
// float work per group of 32 k is shared by the 8 columns in a register's lanes).
//
// Layout: per octet of columns, per 256-block, Q6K_X8_BYTES bytes:
//   d[8]              fp16, the blocks' own (kquant_tiles.h halves8_ps widens them exactly), 16
//                     bytes unused (kquant_offset_steps.h)
//   sc[16][8]         int8, [16-weight scale][column]
//   ql[8][4][8][4]    [group][k-octet][column][byte]: low 4 bits of q[8kk + t] | of q[8kk + 4 + t] << 4
//   qh[8][2][8][4]    [group][pair of k-octets][column][byte]: the top 2 bits of q[8kk + t],
//                     q[8kk + 4 + t], q[8kk' + t], q[8kk' + 4 + t] (kk = 2p, kk' = 2p + 1) at bits
//                     0, 2, 4, 6
// 1696 bytes per 2048 weights (the file's blocks: 1680). w = (d * sc) * (q - 32), q in [0, 63].
// The tiles and the GEMM: OffsetSteps<Q6KUnpack> (kquant_offset_steps.h, kquant_x8_columns.h).
#pragma once

#include <cstdint>

#include "blocks.h"
#include "kquant_offset_steps.h"
#include "kquant_x8_header.h"

namespace cadence_kernels {
namespace gguf {

constexpr int64_t Q6K_X8_BYTES = 1696;
constexpr int64_t Q6K_X8_QL = OFFSET_HEADER_BYTES;      // offset of ql in a block
constexpr int64_t Q6K_X8_QH = Q6K_X8_QL + 1024;         // offset of qh

#if CADENCE_HAVE_AVX2

inline void repack_q6k_x8_octet(const uint8_t* w, int64_t row_bytes, int64_t K, int64_t o, uint8_t* out) {
  for (int64_t blk = 0; blk < K / 256; ++blk) {
    uint8_t* dst = out + blk * Q6K_X8_BYTES;
    for (int i = 0; i < 8; ++i) {
      const uint8_t* raw = w + (8 * o + i) * row_bytes + blk * 210;
      repack_offset_header_column(raw + 208, reinterpret_cast<const int8_t*>(raw + 192), i, dst);
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

// How OffsetSteps (kquant_offset_steps.h) reads a repacked Q6_K block: k-octet kk's low 4 bits
// from its ql register, its top 2 bits (at bits 4-5 of each byte) from the pair of k-octets' qh
// register by one shift (none, left 2 or 4, or right 2) and a mask.
struct Q6KUnpack {
  static constexpr int64_t BYTES = Q6K_X8_BYTES;
  static constexpr int OFFSET_SHIFT = 5;  // q - 32
  static constexpr int LINES = 3;  // two of ql, one of qh
  static int64_t line(int j, int l) { return l < 2 ? Q6K_X8_QL + j * 128 + 64 * l : Q6K_X8_QH + j * 64; }
  static void unpack_256(const uint8_t* b, int j, int kk, __m256i& lo, __m256i& hi) {
    const int sub = kk % 2;
    const __m256i low4 = _mm256_set1_epi8(0x0F), bits45 = _mm256_set1_epi8(0x30);
    const __m256i hv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + Q6K_X8_QH + (j * 2 + kk / 2) * 32));
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + Q6K_X8_QL + j * 128 + kk * 32));
    const __m256i h_lo = _mm256_and_si256(sub == 0 ? _mm256_slli_epi16(hv, 4) : hv, bits45);
    const __m256i h_hi = _mm256_and_si256(sub == 0 ? _mm256_slli_epi16(hv, 2) : _mm256_srli_epi16(hv, 2), bits45);
    lo = _mm256_or_si256(_mm256_and_si256(v, low4), h_lo);
    hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4), h_hi);
  }
#ifdef CADENCE_GGUF_X16
  static void decode_16k(const uint8_t* b0, const uint8_t* b1, int j, int p, __m512i w[4]) {
    const __m512i low4 = _mm512_set1_epi8(0x0F), bits45 = _mm512_set1_epi8(0x30);
    const __m512i hv = load_pair(b0 + Q6K_X8_QH + (j * 2 + p) * 32, b1 + Q6K_X8_QH + (j * 2 + p) * 32);
    for (int sub = 0; sub < 2; ++sub) {
      const int kk = 2 * p + sub;
      const __m512i v = load_pair(b0 + Q6K_X8_QL + j * 128 + kk * 32, b1 + Q6K_X8_QL + j * 128 + kk * 32);
      const __m512i h_lo = _mm512_and_si512(sub == 0 ? _mm512_slli_epi16(hv, 4) : hv, bits45);
      const __m512i h_hi = _mm512_and_si512(sub == 0 ? _mm512_slli_epi16(hv, 2) : _mm512_srli_epi16(hv, 2), bits45);
      w[2 * sub] = _mm512_or_si512(_mm512_and_si512(v, low4), h_lo);
      w[2 * sub + 1] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), low4), h_hi);
    }
  }
#endif
};

#endif  // CADENCE_HAVE_AVX2

}  // namespace gguf
}  // namespace cadence_kernels
