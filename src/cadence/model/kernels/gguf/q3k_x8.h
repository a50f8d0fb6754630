// Q3_K repacked at load, losslessly, with 8 columns interleaved: Q6_K's arithmetic (q6k_x8.h: a
// signed scale per 16 k applied in integers, the quants' offset taken off once per block against
// the activations' byte sums per 16 k, one float step per 256-block) on 3-bit quants. The
// row-wise codec (blocks.h CodecQ3_K, int_gemm.h) pays a float convert, multiply and FMA per
// column and 16 k (two scales per group) and ran a 2048 x 2048 GEMV ~4x a repacked Q4_K one.
//
// Layout: per octet of columns (8o .. 8o + 7), per 256-block, Q3K_X8_BYTES bytes:
//   d[8]          fp16, the blocks' own (kquant_tiles.h halves8_ps widens them exactly), 16 bytes
//                 unused (kquant_offset_steps.h)
//   sc[16][8]     int8, [16-weight scale][column]: the 6-bit scales less 32, in [-32, 31]
//   per group j of 32 k (Q3K_X8_GROUP bytes each):
//     q2[2][8][4]  [pair of k-octets][column][byte]: the low 2 bits of q[8kk + t], q[8kk + 4 + t],
//                  q[8kk' + t], q[8kk' + 4 + t] (kk = 2p, kk' = 2p + 1) at bits 0, 2, 4, 6
//     hb[8][4]     [column][byte]: the third bits, q5k_x8.h's fifth-bit order: bit 4 + kk that of
//                  q[8kk + t], bit kk that of q[8kk + 4 + t]
// 928 bytes per 2048 weights (the file's blocks: 880, +5.5%). w = (d * sc) * (q - 4), q in [0, 7]
// (q = low | third << 2: gguf-py's ql - 4 * (1 - hmask bit)).
//
// Exact integers: OffsetSteps' (kquant_offset_steps.h), with smaller bounds: per (row, column)
// and 16 k, sum q * x (16 products of q <= 7 and |x| <= 127: <= 14224) times the int8 scale into
// the block's int32 sum (16 x 14224 x 32 < 2^23); the offset 4 * sum_s sc_s * (row's byte sum
// over s's 16 k) once per block (|.| < 2^19).
#pragma once

#include <cstdint>

#include "blocks.h"
#include "kquant_offset_steps.h"
#include "kquant_x8_header.h"

namespace cadence_kernels {
namespace gguf {

constexpr int64_t Q3K_X8_BYTES = 928;
constexpr int64_t Q3K_X8_HEADER = OFFSET_HEADER_BYTES;
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
      int8_t sc[16];
      q3k_scales(raw + 96, sc);
      repack_offset_header_column(raw + 108, sc, i, dst);
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

// How OffsetSteps (kquant_offset_steps.h) reads a repacked Q3_K block: k-octet kk = 2p + sub's
// low 2 bits from the pair's 2-bit register (right by 4 sub, and 2 more for the high positions),
// the third bit from the group's hb (q5k_x8.h's order: bit 4 + kk, bit kk) into bit 2.
struct Q3KUnpack {
  static constexpr int64_t BYTES = Q3K_X8_BYTES;
  static constexpr int OFFSET_SHIFT = 2;  // q - 4
  static constexpr int LINES = 2;
  static int64_t line(int j, int l) { return Q3K_X8_HEADER + j * Q3K_X8_GROUP + 64 * l; }
  static void unpack_256(const uint8_t* b, int j, int kk, __m256i& lo, __m256i& hi) {
    const int sub = kk % 2;
    const uint8_t* g = b + Q3K_X8_HEADER + j * Q3K_X8_GROUP;
    const __m256i cv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + kk / 2 * 32));
    const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 64));
    const __m256i three = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    lo = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(cv, 4 * sub), three),
                         _mm256_and_si256(_mm256_srli_epi16(hb, kk + 2), four));
    hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(cv, 4 * sub + 2), three),
                         _mm256_and_si256(_mm256_srli_epi16(_mm256_slli_epi16(hb, 2), kk), four));
  }
#ifdef CADENCE_GGUF_X16
  static void decode_16k(const uint8_t* b0, const uint8_t* b1, int j, int p, __m512i w[4]) {
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
#endif
};

#endif  // CADENCE_HAVE_AVX2

}  // namespace gguf
}  // namespace cadence_kernels
