// 8-lane float32 helpers of the AVX2 tier (AVX2 + FMA + F16C): partial loads and stores,
// horizontal sums, a vectorised exp and in-place softmax pieces, bf16 widening. Everything is
// inline; the whole header is empty where AVX2/FMA are not enabled.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define CADENCE_HAVE_AVX2 1
#else
#define CADENCE_HAVE_AVX2 0
#endif

namespace cadence_kernels {
namespace avx2 {

#if CADENCE_HAVE_AVX2

// Flush denormals to zero on this thread while in scope (restoring the caller's mode after):
// softmax weights of far-off positions and their products with values fall into the denormal
// range, where every FMA costs dozens of cycles (attention of random caches ran 30x slower).
class FlushDenormals {
 public:
  FlushDenormals() : saved_(_mm_getcsr()) { _mm_setcsr(saved_ | 0x8040); }  // FTZ | DAZ
  ~FlushDenormals() { _mm_setcsr(saved_); }
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  const unsigned saved_;
};

// Lane mask for the first n (0..8) lanes, for maskload/maskstore.
inline __m256i first_lanes(int64_t n) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), idx);
}
inline __m256 load_n(const float* p, int64_t n) {
  return n >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, first_lanes(n));
}
inline void store_n(float* p, __m256 v, int64_t n) {
  if (n >= 8) _mm256_storeu_ps(p, v);
  else _mm256_maskstore_ps(p, first_lanes(n), v);
}

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}
inline float hmax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Lane i of the result: the horizontal sum of v[i] (8 dot products finished at once).
inline __m256 transpose_sum8(const __m256 v[8]) {
  const __m256 a0 = _mm256_hadd_ps(v[0], v[1]);  // per 128 lane: v0 pairs, v1 pairs
  const __m256 a1 = _mm256_hadd_ps(v[2], v[3]);
  const __m256 a2 = _mm256_hadd_ps(v[4], v[5]);
  const __m256 a3 = _mm256_hadd_ps(v[6], v[7]);
  const __m256 b0 = _mm256_hadd_ps(a0, a1);  // per 128 lane: half-sums of v0, v1, v2, v3
  const __m256 b1 = _mm256_hadd_ps(a2, a3);  // of v4 .. v7
  const __m256 lo = _mm256_permute2f128_ps(b0, b1, 0x20);
  const __m256 hi = _mm256_permute2f128_ps(b0, b1, 0x31);
  return _mm256_add_ps(lo, hi);
}

// 8 bf16 values (bits) widened to float32.
inline __m256 load_bf16(const uint16_t* p) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

// exp(x) for softmax inputs (x <= 0 mostly; Cephes expf polynomial, ~1 ulp), 8 lanes.
inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
  x = _mm256_min_ps(x, _mm256_set1_ps(88.3f));
  const __m256 fx = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(fx, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  // 2^fx through the exponent bits (fx in [-126, 127] after the clamps above).
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fx), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(y, _mm256_castsi256_ps(e));
}

// In place: s[0:n] = exp(s[0:n] - max); returns {max, sum of the exps}.
inline std::pair<float, float> exp_shifted_inplace(float* s, int64_t n) {
  __m256 mx = _mm256_set1_ps(-INFINITY);
  for (int64_t i = 0; i < n; i += 8) {
    const int64_t left = n - i;
    const __m256 v = left >= 8 ? _mm256_loadu_ps(s + i)
                               : _mm256_blendv_ps(_mm256_set1_ps(-INFINITY), load_n(s + i, left),
                                                  _mm256_castsi256_ps(first_lanes(left)));
    mx = _mm256_max_ps(mx, v);
  }
  const float m = hmax(mx);
  const __m256 mv = _mm256_set1_ps(m);
  __m256 sum = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    const int64_t left = n - i;
    __m256 e = exp8(_mm256_sub_ps(load_n(s + i, left), mv));
    if (left < 8) e = _mm256_and_ps(e, _mm256_castsi256_ps(first_lanes(left)));
    store_n(s + i, e, left);
    sum = _mm256_add_ps(sum, e);
  }
  return {m, hsum(sum)};
}

#endif  // CADENCE_HAVE_AVX2

}  // namespace avx2
}  // namespace cadence_kernels
