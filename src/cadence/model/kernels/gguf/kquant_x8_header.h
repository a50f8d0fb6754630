// The header of a K-quant block repacked with 8 columns interleaved (q3k/q4k/q5k/q6k_x8.h): per
// column i of the octet, the block's fp16 scale(s) as float32 and its sub-block scales, each laid
// out [scale][column] so that one load reads that scale of all 8 columns. One writer per pair of
// formats whose headers match, so the two layouts of a pair cannot drift apart.
#pragma once

#include <cstdint>
#include <cstring>

#include "blocks.h"

namespace cadence_kernels {
namespace gguf {

// Q4_K and Q5_K (MinSteps): `raw` is column i's block, which opens with d, dmin (fp16) and the 12
// bytes of packed 6-bit scales and minimums. Writes d[8], dmin[8] float32, sc[8][8], mn[8][8]
// uint8 (the 192 header bytes), the scales unpacked as gguf-py unpacks them.
inline void repack_min_header_column(const uint8_t* raw, int i, uint8_t* dst) {
  const float d = half_at(raw), dmin = half_at(raw + 2);
  std::memcpy(dst + 4 * i, &d, 4);
  std::memcpy(dst + 32 + 4 * i, &dmin, 4);
  const uint8_t* s = raw + 4;
  for (int j = 0; j < 8; ++j) {
    dst[64 + j * 8 + i] = static_cast<uint8_t>(j < 4 ? s[j] & 63 : (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4));
    dst[128 + j * 8 + i] = static_cast<uint8_t>(j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4));
  }
}

// Q6_K and Q3_K (OffsetSteps): column i's block scale d and its 16 signed scales (one per 16
// weights). Writes d[8] float32 and sc[16][8] int8 (the 160 header bytes).
inline void repack_offset_header_column(float d, const int8_t* sc, int i, uint8_t* dst) {
  std::memcpy(dst + 4 * i, &d, 4);
  for (int s = 0; s < 16; ++s) dst[32 + s * 8 + i] = static_cast<uint8_t>(sc[s]);
}

}  // namespace gguf
}  // namespace cadence_kernels
