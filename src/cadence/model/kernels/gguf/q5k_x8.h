// Q5_K repacked at load, losslessly, with 8 columns interleaved: Q4_K's octets (q4k_x8.h) plus
// each weight's fifth bit. The row-wise codec (blocks.h CodecQ5_K, int_gemm.h) pays a float
// convert, multiply and FMA per column and group of 32 k and decodes the fifth bits of one column
// per register; here 8 columns share every register, and the groups' 6-bit scales and minimums
// apply in integers with the float work once per 256-block, exactly as repacked Q4_K does.
//
// Layout: per octet of columns (8o .. 8o + 7), per 256-block, Q5K_X8_BYTES bytes:
//   d[8], dmin[8], s[12][8]  Q4_K's 128-byte header (q4k_x8.h)
//   per group j (Q5K_X8_GROUP bytes each, the group's bytes together: one stream per octet):
//     q[4][8][4]   [k-octet][column][byte]: byte t of k-octet kk holds the low 4 bits of
//                  q[8kk + t] in its low nibble and of q[8kk + 4 + t] in its high one (Q4_K's)
//     hb[8][4]     [column][byte]: byte c * 4 + t holds the fifth bits of k-octet kk's two
//                  values of that byte position: bit 4 + kk the low nibble's (q[8kk + t]), bit kk
//                  the high nibble's (q[8kk + 4 + t])
// 1408 bytes per 2048 weights, the file's own count. w = (d * sc) * q5 - (dmin * mn),
// q5 in [0, 31], the values gguf-py's dequantization gives. With that bit order the fifth bits of
// k-octet kk reach bit 4 of each byte by one 16-bit shift each (right by kk for the low nibbles,
// left by 4 - kk for the high ones; neither moves a bit across a byte into bit 4).
//
// Exact integers: MinSteps' (kquant_min_steps.h) with the fifth-bit unpack of Q5KUnpack below;
// a q5 byte times an activation byte is <= 31 * 127, so the tiles apply each group's scale per two
// k-octets (8 products per lane: <= 31496, an int16) where Q4_K's do per four.
#pragma once

#include <cstdint>

#include "blocks.h"
#include "kquant_min_steps.h"
#include "kquant_x8_header.h"

namespace cadence_kernels {
namespace gguf {

constexpr int64_t Q5K_X8_BYTES = 1408;
constexpr int64_t Q5K_X8_GROUP = 160;  // 128 bytes of nibbles, 32 of fifth bits
constexpr int64_t Q5K_X8_HEADER = MIN_HEADER_BYTES;

#if CADENCE_HAVE_AVX2

// Octet o of a Q5_K weight (row-wise blocks of 176 bytes: d, dmin, 12 scale bytes, 32 qh, 128 qs;
// row_bytes per column) into `out` (K / 256 * Q5K_X8_BYTES bytes).
inline void repack_q5k_x8_octet(const uint8_t* w, int64_t row_bytes, int64_t K, int64_t o, uint8_t* out) {
  for (int64_t blk = 0; blk < K / 256; ++blk) {
    uint8_t* dst = out + blk * Q5K_X8_BYTES;
    for (int i = 0; i < 8; ++i) {
      const uint8_t* raw = w + (8 * o + i) * row_bytes + blk * 176;
      repack_min_header_column(raw, i, dst);
      const uint8_t* qh = raw + 16;
      for (int j = 0; j < 8; ++j) {
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

// How MinSteps (kquant_min_steps.h) reads a repacked Q5_K block: Q4_K's nibbles of k-octet kk,
// each byte's bit 4 merged in from the group's fifth bits (one shift and mask each; on the AVX-512
// tiers (v & 0x0F) | bit in one vpternlogd).
struct Q5KUnpack {
  static constexpr int64_t BYTES = Q5K_X8_BYTES;
  static constexpr int CHUNK = 2;  // 8 products per lane of q5 <= 31 and |x| <= 127: <= 31496 (16 would not fit int16)
  static constexpr int AVX2_GEMV_OCTETS = 4;  // 16 registers: four octets' sums, nibbles and fifth bits
  static constexpr int LINES = 3;
  static int64_t line(int j, int l) { return Q5K_X8_HEADER + j * Q5K_X8_GROUP + 64 * l; }
  static void unpack_256(const uint8_t* b, int j, int kk, __m256i& lo, __m256i& hi) {
    const uint8_t* g = b + Q5K_X8_HEADER + j * Q5K_X8_GROUP;
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + kk * 32));
    const __m256i hb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + 128));
    const __m256i low4 = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10);
    lo = _mm256_or_si256(_mm256_and_si256(v, low4), _mm256_and_si256(_mm256_srli_epi16(hb, kk), bit4));
    hi = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), low4), _mm256_and_si256(_mm256_slli_epi16(hb, 4 - kk), bit4));
  }
#ifdef CADENCE_GGUF_X16
  static void unpack_512(const uint8_t* b0, const uint8_t* b1, int j, int kk, __m512i& lo, __m512i& hi) {
    const int64_t at = Q5K_X8_HEADER + j * Q5K_X8_GROUP;
    const __m512i v = load_pair(b0 + at + kk * 32, b1 + at + kk * 32), hb = load_pair(b0 + at + 128, b1 + at + 128);
    const __m512i low4 = _mm512_set1_epi8(0x0F), bit4 = _mm512_set1_epi8(0x10);
    // (v & 0x0F) | t: ternary logic on (v, t, 0x0F per byte), t holding bit 4 only.
    lo = _mm512_ternarylogic_epi32(v, _mm512_and_si512(_mm512_srli_epi16(hb, kk), bit4), low4, 0xEC);
    hi = _mm512_ternarylogic_epi32(_mm512_srli_epi16(v, 4), _mm512_and_si512(_mm512_slli_epi16(hb, 4 - kk), bit4), low4, 0xEC);
  }
#endif
};

#endif  // CADENCE_HAVE_AVX2

}  // namespace gguf
}  // namespace cadence_kernels
