// GGUF GEMMs of the 256-weight types: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS (int_gemm.h).
#include "gemm.h"
#include "int_gemm.h"

namespace cadence_kernels {
namespace gguf {

#if CADENCE_HAVE_AVX2

bool gemm_kquant_columns(const GemmArgs& g, int64_t n_begin, int64_t n_end) {
#define CADENCE_RUN(CODEC) \
  int_gemm_columns<CODEC>(*g.xq, g.half_sums, g.M, g.w, g.row_bytes, g.K, g.out, g.ldo, n_begin, n_end); \
  return true
  switch (g.type) {
    case Q2_K: CADENCE_RUN(CodecQ2_K);
    case Q3_K: CADENCE_RUN(CodecQ3_K);
    case Q4_K: CADENCE_RUN(CodecQ4_K);
    case Q5_K: CADENCE_RUN(CodecQ5_K);
    case Q6_K: CADENCE_RUN(CodecQ6_K);
    case IQ4_XS: CADENCE_RUN(CodecIQ4_XS);
    default: return false;
  }
#undef CADENCE_RUN
}

#endif  // CADENCE_HAVE_AVX2

}  // namespace gguf
}  // namespace cadence_kernels
