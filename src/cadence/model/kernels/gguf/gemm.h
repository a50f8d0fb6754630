// The GGUF GEMMs of one column range, one function per family of types (each family compiles in
// its own file: gemm_blocks32.cpp, gemm_kquants.cpp, gemm_float.cpp); linear.cpp quantizes the
// activations, splits the columns over the threads and calls these.
#pragma once

#include <cstdint>

#include "../avx2/q8_gemm.h"

namespace cadence_kernels {
namespace gguf {

#if CADENCE_HAVE_AVX2

// One GEMM call: y[M, N] (ldo = N) = x[M, K] @ W^T, W [N, row_bytes] as the file stores it.
struct GemmArgs {
  int type;
  const uint8_t* w;
  int64_t row_bytes, N, K, M;
  const float* x;                    // float rows [M, K] (the float types)
  const uint16_t* x_bf16;            // x rounded to bf16 (BF16 weights on the avx512bf16 tier), else null
  const avx2::QuantizedRows* xq;     // the rows quantized per 32 k (the quantized types)
  float* out;
};

// Columns [n_begin, n_end) of y; false when `type` is not of the family.
bool gemm_blocks32_columns(const GemmArgs& g, int64_t n_begin, int64_t n_end);
bool gemm_kquant_columns(const GemmArgs& g, int64_t n_begin, int64_t n_end);
bool gemm_float_columns(const GemmArgs& g, int64_t n_begin, int64_t n_end);

#endif  // CADENCE_HAVE_AVX2

}  // namespace gguf
}  // namespace cadence_kernels
