// The header of a K-quant block repacked with 8 columns interleaved (q3k/q4k/q5k/q6k_x8.h): per
// column i of the octet, the block's fp16 scale(s) as the file stores them (the tiles widen them
// exactly with vcvtph2ps) and its sub-block scales, each laid out [scale][column] so that one load
// reads that scale of all 8 columns. One writer per pair of formats whose headers match, so the
// two layouts of a pair cannot drift apart.
#pragma once

#include <cstdint>
#include <cstring>

#include "kquant_min_steps.h"
#include "kquant_offset_steps.h"

namespace cadence_kernels {
namespace gguf {

// Q4_K and Q5_K (MinSteps): `raw` is column i's block, which opens with d, dmin (fp16) and the 12
// bytes of packed 6-bit scales and minimums; they are kept packed, [byte][column]
// (kquant_min_steps.h unpacks a group's 8 columns with three 64-bit ops).
inline void repack_min_header_column(const uint8_t* raw, int i, uint8_t* dst) {
  std::memcpy(dst + 2 * i, raw, 2);                        // d (fp16)
  std::memcpy(dst + MIN_HEADER_DMIN + 2 * i, raw + 2, 2);  // dmin (fp16)
  for (int byte = 0; byte < 12; ++byte) dst[MIN_HEADER_SCALES + 8 * byte + i] = raw[4 + byte];
}

// Q6_K and Q3_K (OffsetSteps): column i's block scale d (fp16, at `d_half`) and its 16 signed
// scales (one per 16 weights), [scale][column]; bytes 16..31 of the header are unused.
inline void repack_offset_header_column(const uint8_t* d_half, const int8_t* sc, int i, uint8_t* dst) {
  std::memcpy(dst + 2 * i, d_half, 2);
  if (i == 0) std::memset(dst + 16, 0, OFFSET_HEADER_SCALES - 16);
  for (int s = 0; s < 16; ++s) dst[OFFSET_HEADER_SCALES + s * 8 + i] = static_cast<uint8_t>(sc[s]);
}

}  // namespace gguf
}  // namespace cadence_kernels
