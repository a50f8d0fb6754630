// argmax_rows: index of the largest value of every row of a float32 matrix, as torch.argmax(-1)
// (first index of the maximum; a NaN counts as the maximum, its first index wins). Greedy
// sampling of a 64-row decode batch reads 12 MB of logits: this runs both cores at memory speed
// where torch's reduction takes ~3x longer, time the engine spends outside the forward.
#include "common.h"
#include "ops.h"

namespace cadence_kernels {

int64_t argmax_row(const float* x, int64_t n) {
  int64_t i = 0;
#if defined(__AVX512F__)
  // Pass 1: the maximum (or the first NaN).
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    if (_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q)) {
      const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
      return i + __builtin_ctz(nan);
    }
    mx = _mm512_max_ps(mx, v);
  }
  float m = _mm512_reduce_max_ps(mx);
  for (int64_t j = i; j < n; ++j) {
    if (std::isnan(x[j])) return j;
    m = x[j] > m ? x[j] : m;
  }
  // Pass 2: its first index.
  const __m512 mv = _mm512_set1_ps(m);
  for (i = 0; i + 16 <= n; i += 16) {
    const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), mv, _CMP_EQ_OQ);
    if (hit) return i + __builtin_ctz(hit);
  }
  for (; i < n; ++i)
    if (x[i] == m) return i;
  return 0;
#else
  int64_t best = 0;
  for (i = 0; i < n; ++i) {
    if (std::isnan(x[i])) return i;
    if (x[i] > x[best]) best = i;
  }
  return best;
#endif
}

at::Tensor argmax_rows(at::Tensor logits) {
  check_cpu_contiguous(logits, "logits");
  TORCH_CHECK(logits.scalar_type() == at::kFloat && logits.dim() == 2 && logits.size(1) > 0,
              "argmax_rows: logits [rows, n > 0] float32");
  const int64_t rows = logits.size(0), n = logits.size(1);
  auto out = at::empty({rows}, logits.options().dtype(at::kLong));
  const float* x = logits.data_ptr<float>();
  int64_t* o = out.data_ptr<int64_t>();
  // One row (200 KB for a 50k vocabulary) is not worth waking a second thread.
  at::parallel_for(0, rows, rows * n < (1 << 18) ? rows + 1 : 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) o[r] = argmax_row(x + r * n, n);
  });
  return out;
}

}  // namespace cadence_kernels
