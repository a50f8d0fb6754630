// The K-quants repacked with 8 columns interleaved (Q3_K: q3k_x8.h, Q4_K: q4k_x8.h, Q5_K:
// q5k_x8.h, Q6_K: q6k_x8.h): the repack at load and the GEMM (kquant_x8_columns.h: kquant_tiles.h's
// tiles on the format's family steps, kquant_min_steps.h for Q4_K / Q5_K, kquant_offset_steps.h
// for Q6_K / Q3_K).
#include <ATen/Parallel.h>

#include "gemm.h"
#include "kquant_x8_columns.h"
#include "q3k_x8.h"
#include "q4k_x8.h"
#include "q5k_x8.h"
#include "q6k_x8.h"

namespace cadence_kernels {
namespace gguf {

int64_t x8_block_bytes(int type) {
  switch (type) {
    case Q3_K: return Q3K_X8_BYTES;
    case Q4_K: return Q4K_X8_BYTES;
    case Q5_K: return Q5K_X8_BYTES;
    case Q6_K: return Q6K_X8_BYTES;
    default: return 0;
  }
}

#if CADENCE_HAVE_AVX2

void x8_repack(int type, const uint8_t* w, int64_t N, int64_t K, uint8_t* out) {
  const int64_t octet_bytes = K / 256 * x8_block_bytes(type), row_bytes = K / 256 * block_size(type).bytes;
  at::parallel_for(0, N / 8, 16, [&](int64_t begin, int64_t end) {
    for (int64_t o = begin; o < end; ++o) {
      if (type == Q4_K) repack_q4k_x8_octet(w, row_bytes, K, o, out + o * octet_bytes);
      else if (type == Q5_K) repack_q5k_x8_octet(w, row_bytes, K, o, out + o * octet_bytes);
      else if (type == Q3_K) repack_q3k_x8_octet(w, row_bytes, K, o, out + o * octet_bytes);
      else repack_q6k_x8_octet(w, row_bytes, K, o, out + o * octet_bytes);
    }
  });
}

void x8_gemm_columns(const GemmArgs& g, const uint8_t* packed, int64_t o_begin, int64_t o_end) {
  const auto run = [&](auto steps) {
    kquant_x8_columns<decltype(steps)>(*g.xq, g.half_sums, g.M, packed, g.K, g.out, g.ldo, o_begin, o_end);
  };
  if (g.type == Q4_K) run(MinSteps<Q4KUnpack>{});
  else if (g.type == Q5_K) run(MinSteps<Q5KUnpack>{});
  else if (g.type == Q3_K) run(OffsetSteps<Q3KUnpack>{});
  else run(OffsetSteps<Q6KUnpack>{});
}

#endif  // CADENCE_HAVE_AVX2

}  // namespace gguf
}  // namespace cadence_kernels
