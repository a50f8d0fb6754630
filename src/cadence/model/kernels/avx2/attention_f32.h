// Decode attention over a float32 paged cache (the AVX2 tier's fused stack): the query heads of
// one KV head of one row over a span of its context, read straight from the cache blocks.
//
// Work items are (row, KV head, span) with spans cut at fixed multiples of ATTN_SPAN positions, so
// the items, their partial sums and the merge order depend only on each row's context length:
// never on the batch, the thread count or which thread runs an item (batch-invariant results).
// Each item returns unnormalised partials (max, sum of exp, weighted value sum) per query head;
// merge_partials combines a row's spans (flash-decoding).
#pragma once

#include <algorithm>
#include <cstdint>

#include "vec8.h"

namespace cadence_kernels {
namespace avx2 {

constexpr int64_t ATTN_SPAN = 256;  // positions per item: its K and V (64 KB each at D = 64) stay in L2

inline int64_t num_spans(int64_t ctx_len) { return (ctx_len + ATTN_SPAN - 1) / ATTN_SPAN; }

#if CADENCE_HAVE_AVX2

// q: the G query heads [G, D] of KV head kh of one row; kc, vc: the layer's caches [blocks,
// block_size, Hkv, D]; positions [p0, p1) of the sequence with block table `table`. scores:
// G * ATTN_SPAN floats of scratch. Writes max[G], sum[G], acc[G, D].
template <int D>
void attend_span_f32(const float* q, int64_t G, int64_t kh, int64_t Hkv, const float* kc, const float* vc,
                     const int32_t* table, int64_t block_size, int64_t p0, int64_t p1, float scale,
                     float* scores, float* max_out, float* sum_out, float* acc_out) {
  static_assert(D % 8 == 0, "head_dim must be a multiple of 8");
  constexpr int DC = D / 8;
  const int64_t stride = Hkv * D;
  const int64_t span = p1 - p0;
  auto row_of = [&](const float* base, int64_t pos) {
    return base + (static_cast<int64_t>(table[pos / block_size]) * block_size + pos % block_size) * stride + kh * D;
  };
  // Pass 1: scores[g, p - p0] = scale * q_g . k_p, 8 positions at a time.
  const float* krows[8];
  for (int64_t g0 = p0; g0 < p1; g0 += 8) {
    const int count = static_cast<int>(std::min<int64_t>(8, p1 - g0));
    for (int j = 0; j < 8; ++j) krows[j] = row_of(kc, g0 + std::min(j, count - 1));
    for (int64_t g = 0; g < G; ++g) {
      const float* qg = q + g * D;
      __m256 dots[8];
      for (int j = 0; j < 8; ++j) dots[j] = _mm256_setzero_ps();
      for (int c = 0; c < DC; ++c) {
        const __m256 qv = _mm256_loadu_ps(qg + 8 * c);
        for (int j = 0; j < 8; ++j) dots[j] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(krows[j] + 8 * c), dots[j]);
      }
      store_n(scores + g * ATTN_SPAN + (g0 - p0), _mm256_mul_ps(transpose_sum8(dots), _mm256_set1_ps(scale)), count);
    }
  }
  // Pass 2: p = exp(s - max) in place, per head.
  for (int64_t g = 0; g < G; ++g) {
    const auto [m, total] = exp_shifted_inplace(scores + g * ATTN_SPAN, span);
    max_out[g] = m;
    sum_out[g] = total;
  }
  // Pass 3: acc[g] = sum_p p[g, p] * v_p (V rows from L1/L2, re-read per head).
  for (int64_t g = 0; g < G; ++g) {
    __m256 acc[DC];
    for (int c = 0; c < DC; ++c) acc[c] = _mm256_setzero_ps();
    const float* pg = scores + g * ATTN_SPAN;
    for (int64_t pos = p0; pos < p1; ++pos) {
      const float* vrow = row_of(vc, pos);
      const __m256 pv = _mm256_set1_ps(pg[pos - p0]);
      for (int c = 0; c < DC; ++c) acc[c] = _mm256_fmadd_ps(pv, _mm256_loadu_ps(vrow + 8 * c), acc[c]);
    }
    for (int c = 0; c < DC; ++c) _mm256_storeu_ps(acc_out + g * D + 8 * c, acc[c]);
  }
}

// out[D] = softmax-weighted values of one query head from its spans' partials (max[s], sum[s],
// acc[s * acc_stride + d]), merged in span order.
inline void merge_partials(const float* max, const float* sum, const float* acc, int64_t acc_stride,
                           int64_t spans, int64_t D, float* out) {
  float m = -INFINITY;
  for (int64_t s = 0; s < spans; ++s) m = std::max(m, max[s]);
  float total = 0.f;
  for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(out + d, _mm256_setzero_ps());
  for (int64_t s = 0; s < spans; ++s) {
    const float w = std::exp(max[s] - m);
    total += w * sum[s];
    const __m256 wv = _mm256_set1_ps(w);
    for (int64_t d = 0; d < D; d += 8)
      _mm256_storeu_ps(out + d, _mm256_fmadd_ps(wv, _mm256_loadu_ps(acc + s * acc_stride + d), _mm256_loadu_ps(out + d)));
  }
  const __m256 inv = _mm256_set1_ps(1.f / total);
  for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(out + d, _mm256_mul_ps(_mm256_loadu_ps(out + d), inv));
}

#endif  // CADENCE_HAVE_AVX2

}  // namespace avx2
}  // namespace cadence_kernels
