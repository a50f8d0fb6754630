// The GGUF GEMMs of one column range, one function per family of types (each family compiles in
// its own file: gemm_blocks32.cpp, gemm_kquants.cpp, gemm_float.cpp, gemm_x8.cpp); linear.cpp quantizes the
// activations, splits the columns over the threads and calls these.
#pragma once

#include <cstdint>

#include "../avx2/q8_gemm.h"

namespace cadence_kernels {
namespace gguf {

// Bytes per octet of columns and 256-block of the 8-column layouts (0: none for the type).
int64_t x8_block_bytes(int type);

#if CADENCE_HAVE_AVX2

// One GEMM call: y[M, N] (row m at out + m * ldo) = x[M, K] @ W^T, W [N, row_bytes] as the
// file stores it.
struct GemmArgs {
  int type;
  const uint8_t* w;
  int64_t row_bytes, N, K, M, ldo;
  const float* x;                    // float rows [M, K] (the float types)
  const uint16_t* x_bf16;            // x rounded to bf16 (BF16 weights on the avx512bf16 tier), else null
  const avx2::QuantizedRows* xq;     // the rows quantized per 32 k (the quantized types)
  float* out;
  const int32_t* half_sums = nullptr;  // [M][K / 16] sums of xq's bytes per 16 k (repacked Q6_K / Q3_K, Q2_K)
};

// Columns [n_begin, n_end) of y; false when `type` is not of the family.
bool gemm_blocks32_columns(const GemmArgs& g, int64_t n_begin, int64_t n_end);
bool gemm_kquant_columns(const GemmArgs& g, int64_t n_begin, int64_t n_end);
bool gemm_float_columns(const GemmArgs& g, int64_t n_begin, int64_t n_end);

// Q3_K, Q4_K, Q5_K and Q6_K with 8 columns interleaved (q3k_x8.h .. q6k_x8.h; gemm_x8.cpp): bytes per
// octet and 256-block (0: the type has no such layout), the repack of the whole octets (N / 8
// of them) into `out` (N / 8 * K / 256 * x8_block_bytes), and the GEMM of octets [o_begin, o_end).
void x8_repack(int type, const uint8_t* w, int64_t N, int64_t K, uint8_t* out);
void x8_gemm_columns(const GemmArgs& g, const uint8_t* packed, int64_t o_begin, int64_t o_end);

#endif  // CADENCE_HAVE_AVX2

}  // namespace gguf
}  // namespace cadence_kernels
