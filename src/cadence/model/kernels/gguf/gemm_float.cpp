// GGUF GEMMs of the float types: F32, F16, BF16 (float_gemm.h).
#include "float_gemm.h"
#include "gemm.h"

namespace cadence_kernels {
namespace gguf {

#if CADENCE_HAVE_AVX2

bool gemm_float_columns(const GemmArgs& g, int64_t n_begin, int64_t n_end) {
#define CADENCE_RUN(TYPE) \
  float_gemm_columns<TYPE>(g.x, g.K, g.x_bf16, g.M, g.w, g.row_bytes, g.K, g.out, g.ldo, n_begin, n_end); \
  return true
  switch (g.type) {
    case F32: CADENCE_RUN(F32);
    case F16: CADENCE_RUN(F16);
    case BF16: CADENCE_RUN(BF16);
    default: return false;
  }
#undef CADENCE_RUN
}

#endif  // CADENCE_HAVE_AVX2

}  // namespace gguf
}  // namespace cadence_kernels
