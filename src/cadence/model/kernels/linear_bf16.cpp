// linear_bf16: y = x @ w.T for bf16 with few rows (decode), with AVX512-BF16 dot products;
// torch's bf16 GEMM is several times slower than memory bandwidth there.
#include "common.h"
#include "ops.h"

namespace cadence_kernels {

// ---------------------------------------------------------------------------------------------
// linear_bf16: x [M, K] bf16, w [N, K] bf16 -> [M, N] bf16 (float32 accumulation).
bool has_avx512bf16() { return CADENCE_HAVE_AVX512BF16 != 0; }

std::string kernel_tier() {
#if CADENCE_HAVE_AVX512BF16
  return "avx512bf16";
#elif defined(__AVX512F__)
  return "avx512";
#elif defined(__AVX2__) && defined(__FMA__)
  return "avx2";
#else
  return "generic";
#endif
}

constexpr int64_t PARALLEL_MIN_WEIGHT_BYTES = 2 << 20;

#if CADENCE_HAVE_AVX512BF16
// MR activation rows times one weight row over K. The weight row is read front to back (the
// hardware prefetcher follows one sequential stream per thread far better than interleaved short
// rows), with two accumulators per activation row to halve the dependency chain.
template <int MR>
inline void dot_row(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t K, float* acc_out) {
  __m512 acc0[MR], acc1[MR];
  for (int i = 0; i < MR; ++i) acc0[i] = acc1[i] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 64 <= K; k += 64) {
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(w + k);
    const __m512bh w1 = (__m512bh)_mm512_loadu_si512(w + k + 32);
    for (int i = 0; i < MR; ++i) {
      acc0[i] = _mm512_dpbf16_ps(acc0[i], (__m512bh)_mm512_loadu_si512(x + i * ldx + k), w0);
      acc1[i] = _mm512_dpbf16_ps(acc1[i], (__m512bh)_mm512_loadu_si512(x + i * ldx + k + 32), w1);
    }
  }
  for (; k < K; k += 32) {
    const int64_t left = K - k;
    const __mmask32 mask = left >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << left) - 1);
    const __m512bh w0 = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + k);
    for (int i = 0; i < MR; ++i)
      acc0[i] = _mm512_dpbf16_ps(acc0[i], (__m512bh)_mm512_maskz_loadu_epi16(mask, x + i * ldx + k), w0);
  }
  for (int i = 0; i < MR; ++i) acc_out[i] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[i], acc1[i]));
}
#endif

at::Tensor linear_bf16(at::Tensor x, at::Tensor w) {
  check_cpu_contiguous(x, "x");
  check_cpu_contiguous(w, "w");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16,
              "linear_bf16: bfloat16 only");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "linear_bf16: x [M, K], w [N, K]");
#if CADENCE_HAVE_AVX512BF16
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  auto out = at::empty({M, N}, x.options());
  const uint16_t* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<c10::BFloat16>());
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<c10::BFloat16>());
  uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>());
  // Parallel over output columns: each weight row is read from memory once per call (the few
  // activation rows stay in L1), each thread streaming a contiguous range of rows. Weights
  // under PARALLEL_MIN_WEIGHT_BYTES stream on the calling thread: a second thread adds less
  // bandwidth than waking it costs.
  const int64_t grain = N * K * 2 < PARALLEL_MIN_WEIGHT_BYTES ? N + 1 : 16;
  at::parallel_for(0, N, grain, [&](int64_t begin, int64_t end) {
    float acc[4];
    for (int64_t n = begin; n < end; ++n) {
      const uint16_t* wr = wp + n * K;
      int64_t m = 0;
      for (; m + 4 <= M; m += 4) {
        dot_row<4>(xp + m * K, K, wr, K, acc);
        for (int i = 0; i < 4; ++i) op[(m + i) * N + n] = c10::BFloat16(acc[i]).x;
      }
      const int64_t rest = M - m;
      if (rest == 3) dot_row<3>(xp + m * K, K, wr, K, acc);
      else if (rest == 2) dot_row<2>(xp + m * K, K, wr, K, acc);
      else if (rest == 1) dot_row<1>(xp + m * K, K, wr, K, acc);
      for (int i = 0; i < rest; ++i) op[(m + i) * N + n] = c10::BFloat16(acc[i]).x;
    }
  });
  return out;
#else
  TORCH_CHECK(false, "linear_bf16: built without AVX512-BF16");
  return x;
#endif
}

}  // namespace cadence_kernels
