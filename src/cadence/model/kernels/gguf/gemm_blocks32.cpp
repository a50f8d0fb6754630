// GGUF GEMMs of the 32-weight block types: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL (int_gemm.h).
#include "gemm.h"
#include "int_gemm.h"

namespace cadence_kernels {
namespace gguf {

#if CADENCE_HAVE_AVX2

bool gemm_blocks32_columns(const GemmArgs& g, int64_t n_begin, int64_t n_end) {
#define CADENCE_RUN(CODEC) \
  int_gemm_columns<CODEC>(*g.xq, g.half_sums, g.M, g.w, g.row_bytes, g.K, g.out, g.ldo, n_begin, n_end); \
  return true
  switch (g.type) {
    case Q4_0: CADENCE_RUN(CodecQ4_0);
    case Q4_1: CADENCE_RUN(CodecQ4_1);
    case Q5_0: CADENCE_RUN(CodecQ5_0);
    case Q5_1: CADENCE_RUN(CodecQ5_1);
    case Q8_0: CADENCE_RUN(CodecQ8_0);
    case IQ4_NL: CADENCE_RUN(CodecIQ4_NL);
    default: return false;
  }
#undef CADENCE_RUN
}

#endif  // CADENCE_HAVE_AVX2

}  // namespace gguf
}  // namespace cadence_kernels
