// Shared helpers of the C++ CPU kernels: bf16 <-> float conversion with torch's rounding,
// 16-lane AVX-512 loads/stores, a vectorised exp and an in-place softmax, and argument checks.
// Every kernel file includes this; everything here is inline (one definition per program).
#pragma once

// Only the ATen headers the kernels use (not torch/extension.h): each file compiles in seconds.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(__AVX512BF16__) && defined(__AVX512F__)
#define CADENCE_HAVE_AVX512BF16 1
#else
#define CADENCE_HAVE_AVX512BF16 0
#endif

namespace cadence_kernels {

inline float to_float(float x) { return x; }
inline float to_float(c10::BFloat16 x) {
  uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// float16 (a 16-bit KV cache of the float32 path): torch's own conversion, exact.
inline float to_float(c10::Half x) { return static_cast<float>(x); }

template <typename T> inline T from_float(float x);
template <> inline float from_float<float>(float x) { return x; }
template <> inline c10::BFloat16 from_float<c10::BFloat16>(float x) {
  // Round to nearest even, as torch's float -> bfloat16 cast does.
  return c10::BFloat16(x);
}
template <> inline c10::Half from_float<c10::Half>(float x) {
  // Round to nearest even, as torch's float -> float16 cast does.
  return c10::Half(x);
}

// Rounds a float through the storage type (a no-op for float32): reproduces the model dtype's
// rounding between ops, as the eager torch path has it.
template <typename T> inline float round_to(float x) { return to_float(from_float<T>(x)); }

// Elementwise kernels run on one thread unless the tensor is large (prefill): for a decode
// batch a parallel region costs more than the work, and far more when a neighbour process
// holds one of the cores (the region waits for the descheduled thread).
constexpr int64_t PARALLEL_MIN_ELEMENTS = 1 << 16;

inline int64_t row_grain(int64_t rows, int64_t width) {
  return rows * width < PARALLEL_MIN_ELEMENTS ? rows : std::max<int64_t>(1, 4096 / std::max<int64_t>(width, 1));
}

inline void check_cpu_contiguous(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

#if defined(__AVX512F__)
// 16 float lanes from 16 consecutive elements of T.
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

inline __m512 load16(const c10::Half* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// The first lanes of `mask` from T (zeros elsewhere).
inline __m512 load16_masked(const c10::BFloat16* p, __mmask16 mask) {
  const __m256i bits = _mm256_maskz_loadu_epi16(mask, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
// Round to nearest even (NaN stays NaN), as torch's cast does: bits + 0x7fff + lsb, whose high
// half is the bf16 (the low half is garbage).
inline __m512i bf16_rounded_bits(__m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  return _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
}
inline void store16(c10::BFloat16* p, __m512 v) {
  const __m512i rounded = _mm512_srli_epi32(bf16_rounded_bits(v), 16);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(rounded));
}
// v rounded through T (identity for float); for bf16 the same bits as store16 then load16, in
// registers.
inline __m512 round16(float*, __m512 v) { return v; }
inline __m512 round16(c10::BFloat16*, __m512 v) {
  return _mm512_castsi512_ps(_mm512_and_si512(bf16_rounded_bits(v), _mm512_set1_epi32(static_cast<int32_t>(0xffff0000u))));
}

// exp(x) for x <= 0-ish softmax inputs (Cephes expf polynomial, ~1 ulp), 16 lanes at a time.
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
  const __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(y, fx);
}

// In place: s[0:n] = exp(s[0:n] - max); returns {max, sum of the exps} (softmax before the
// division; split attention keeps both to merge its spans).
inline std::pair<float, float> exp_shifted_inplace(float* s, int64_t n) {
  __m512 mx = _mm512_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + i));
  float m = _mm512_reduce_max_ps(mx);
  for (; i < n; ++i) m = s[i] > m ? s[i] : m;
  const __m512 mv = _mm512_set1_ps(m);
  __m512 sum = _mm512_setzero_ps();
  for (i = 0; i + 16 <= n; i += 16) {
    const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + i), mv));
    _mm512_storeu_ps(s + i, e);
    sum = _mm512_add_ps(sum, e);
  }
  if (i < n) {
    const __mmask16 mask = (__mmask16)((1u << (n - i)) - 1);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, s + i), mv));
    _mm512_mask_storeu_ps(s + i, mask, e);
    sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(mask, e));
  }
  return {m, _mm512_reduce_add_ps(sum)};
}

// In place: s[0:n] = softmax(s[0:n]).
inline void softmax_inplace(float* s, int64_t n) {
  const float total = exp_shifted_inplace(s, n).second;
  int64_t i = 0;
  const __m512 inv = _mm512_set1_ps(1.f / total);
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(s + i, _mm512_mul_ps(_mm512_loadu_ps(s + i), inv));
  if (i < n) {
    const __mmask16 mask = (__mmask16)((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(s + i, mask, _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, s + i), inv));
  }
}
#endif

}  // namespace cadence_kernels
