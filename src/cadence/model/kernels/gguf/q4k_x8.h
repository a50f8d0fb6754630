// Q4_K repacked at load, losslessly, with 8 columns interleaved (llama.cpp's repack idea): the
// row-wise kernel (int_gemm.h) spends a float convert, multiply and FMA per column and group of
// 32 k; with the columns in the lanes of one register, that work is shared by 8 columns, and a
// decode step runs ~8x fewer instructions per weight.
//
// Layout: per octet of columns (8o .. 8o + 7), per 256-block, Q4K_X8_BYTES bytes:
//   d[8], dmin[8]     fp16, the blocks' own (kquant_tiles.h halves8_ps widens them exactly)
//   s[12][8]          uint8, [byte][column]: the file's 12 bytes of 6-bit scales and minimums
//                     (kquant_min_steps.h group_scales / group_mins unpack them)
//   q[8][4][8][4]     [group][k-octet][column][byte]: byte t of k-octet kk holds q[8kk + t] in
//                     its low nibble and q[8kk + 4 + t] in its high one (q4_gemm.h's layout)
// 1152 bytes per 2048 weights, the file's own count (with d, dmin widened to float32 and the scales
// and minimums a byte each: 1216, 5.6% more bytes streamed per decode step). w = (d * sc) * q - (dmin * mn), the
// values gguf-py's dequantization gives. Columns past the last whole octet stay row-wise. The
// tiles and the GEMM: MinSteps<Q4KUnpack> (kquant_min_steps.h, kquant_x8_columns.h).
#pragma once

#include <cstdint>

#include "blocks.h"
#include "kquant_min_steps.h"
#include "kquant_x8_header.h"

namespace cadence_kernels {
namespace gguf {

constexpr int64_t Q4K_X8_BYTES = 1152;
constexpr int64_t Q4K_X8_HEADER = MIN_HEADER_BYTES;

#if CADENCE_HAVE_AVX2

// Octet o of a Q4_K weight (row-wise blocks, row_bytes per column) into `out`
// (K / 256 * Q4K_X8_BYTES bytes).
inline void repack_q4k_x8_octet(const uint8_t* w, int64_t row_bytes, int64_t K, int64_t o, uint8_t* out) {
  for (int64_t blk = 0; blk < K / 256; ++blk) {
    uint8_t* dst = out + blk * Q4K_X8_BYTES;
    uint8_t* q = dst + Q4K_X8_HEADER;
    for (int i = 0; i < 8; ++i) {
      const uint8_t* raw = w + (8 * o + i) * row_bytes + blk * 144;
      repack_min_header_column(raw, i, dst);
      for (int j = 0; j < 8; ++j) {
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

// How MinSteps (kquant_min_steps.h) reads a repacked Q4_K block: k-octet kk of group j is one
// 32-byte load, its low nibbles the q of positions 8kk + t, its high ones those of 8kk + 4 + t.
struct Q4KUnpack {
  static constexpr int64_t BYTES = Q4K_X8_BYTES;
  static constexpr int CHUNK = 4;  // a group's 16 products per lane, q <= 15 and |x| <= 127: <= 30480
  static constexpr int AVX2_GEMV_OCTETS = 8;
  static constexpr int LINES = 2;
  static int64_t line(int j, int l) { return Q4K_X8_HEADER + j * 128 + 64 * l; }
  static void unpack_256(const uint8_t* b, int j, int kk, __m256i& lo, __m256i& hi) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + Q4K_X8_HEADER + j * 128 + kk * 32));
    lo = _mm256_and_si256(v, _mm256_set1_epi8(0x0F));
    hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), _mm256_set1_epi8(0x0F));
  }
#ifdef CADENCE_GGUF_X16
  static void unpack_512(const uint8_t* b0, const uint8_t* b1, int j, int kk, __m512i& lo, __m512i& hi) {
    const int64_t at = Q4K_X8_HEADER + j * 128 + kk * 32;
    const __m512i v = load_pair(b0 + at, b1 + at);
    lo = _mm512_and_si512(v, _mm512_set1_epi8(0x0F));
    hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), _mm512_set1_epi8(0x0F));
  }
#endif
};

#endif  // CADENCE_HAVE_AVX2

}  // namespace gguf
}  // namespace cadence_kernels
