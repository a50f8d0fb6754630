// Per-row bodies of the elementwise kernels (RMS norm, silu * up, rope + cache write), shared by
// the standalone kernels (norms.cpp, rope.cpp: rows spread over threads) and the fused decode
// stack (decode_stack.cpp: rows of one thread's share), so both round exactly alike.
#pragma once

#include "avx2/vec8.h"
#include "common.h"

namespace cadence_kernels {

// One row of RMS norm (HF Llama semantics: normalise in float32, cast to the dtype, then times
// the weight): x (optional add) += add rounded to T; y = weight * T(norm(x)) rounded to T.
template <typename T>
inline void rms_norm_row(T* x, const T* a, const T* w, T* y, int64_t H, float eps) {
  float ss = 0.f;
  int64_t i = 0;
#if defined(__AVX512F__)
  __m512 ssv = _mm512_setzero_ps();
  for (; i + 16 <= H; i += 16) {
    __m512 v = load16(x + i);
    if (a != nullptr) {
      v = round16(x, _mm512_add_ps(v, load16(a + i)));
      store16(x + i, v);
    }
    ssv = _mm512_fmadd_ps(v, v, ssv);
  }
  ss = _mm512_reduce_add_ps(ssv);
#elif CADENCE_HAVE_AVX2
  if constexpr (std::is_same_v<T, float>) {  // float32 rows, 8 lanes (bf16 keeps the scalar loop)
    __m256 ssv = _mm256_setzero_ps();
    for (; i + 8 <= H; i += 8) {
      __m256 v = _mm256_loadu_ps(x + i);
      if (a != nullptr) {
        v = _mm256_add_ps(v, _mm256_loadu_ps(a + i));
        _mm256_storeu_ps(x + i, v);
      }
      ssv = _mm256_fmadd_ps(v, v, ssv);
    }
    ss = avx2::hsum(ssv);
  }
#endif
  for (; i < H; ++i) {
    float v = to_float(x[i]);
    if (a != nullptr) {
      v = round_to<T>(v + to_float(a[i]));
      x[i] = from_float<T>(v);
    }
    ss += v * v;
  }
  const float inv = 1.f / std::sqrt(ss / static_cast<float>(H) + eps);
  i = 0;
#if defined(__AVX512F__)
  const __m512 invv = _mm512_set1_ps(inv);
  for (; i + 16 <= H; i += 16)
    store16(y + i, _mm512_mul_ps(load16(w + i), round16(y, _mm512_mul_ps(load16(x + i), invv))));
#elif CADENCE_HAVE_AVX2
  if constexpr (std::is_same_v<T, float>) {
    const __m256 invv = _mm256_set1_ps(inv);
    for (; i + 8 <= H; i += 8)
      _mm256_storeu_ps(y + i, _mm256_mul_ps(_mm256_loadu_ps(w + i), _mm256_mul_ps(_mm256_loadu_ps(x + i), invv)));
  }
#endif
  for (; i < H; ++i) y[i] = from_float<T>(to_float(w[i]) * round_to<T>(to_float(x[i]) * inv));
}

// One token's per-head q/k RMS norm (Qwen3, Gemma 3), in place before rope: row = [q heads | k
// heads | v heads] (each D wide); every q head times q_w [D], every k head times k_w [D]
// (rms_norm_row over the head, the model's eps), v untouched. The per-op path (rope_write_kv with
// norms) and the fused stacks call this same function, so they round alike.
template <typename T>
inline void qk_norm_row(T* row, const T* q_w, const T* k_w, int64_t Hq, int64_t Hkv, int64_t D, float eps) {
  for (int64_t head = 0; head < Hq + Hkv; ++head) {
    T* v = row + head * D;
    rms_norm_row<T>(v, nullptr, head < Hq ? q_w : k_w, v, D, eps);
  }
}

// One row of silu(gate) * up, rounded as eager torch: y[i] = T(T(silu(g[i])) * u[i]).
template <typename T>
inline void silu_mul_row(const T* g, const T* u, T* y, int64_t I) {
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= I; i += 16) {
    const __m512 a = load16(g + i);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), a));  // exp(-a)
    const __m512 act = round16(y, _mm512_div_ps(a, _mm512_add_ps(_mm512_set1_ps(1.f), e)));
    store16(y + i, _mm512_mul_ps(act, load16(u + i)));
  }
#elif CADENCE_HAVE_AVX2
  if constexpr (std::is_same_v<T, float>) {
    for (; i + 8 <= I; i += 8) {
      const __m256 a = _mm256_loadu_ps(g + i);
      const __m256 e = avx2::exp8(_mm256_sub_ps(_mm256_setzero_ps(), a));  // exp(-a)
      const __m256 act = _mm256_div_ps(a, _mm256_add_ps(_mm256_set1_ps(1.f), e));
      _mm256_storeu_ps(y + i, _mm256_mul_ps(act, _mm256_loadu_ps(u + i)));
    }
  }
#endif
  for (; i < I; ++i) {
    const float a = to_float(g[i]);
    const float act = round_to<T>(a / (1.f + std::exp(-a)));
    y[i] = from_float<T>(act * to_float(u[i]));
  }
}

// One float32 row of gelu_tanh(gate) * up (GeGLU: Gemma's MLP): gelu_tanh(a) = 0.5 a (1 + tanh(z)),
// z = sqrt(2 / pi) (a + 0.044715 a^3), computed as a / (1 + exp(-2 z)) (0.5 (1 + tanh(z)) is
// sigmoid(2 z)): one exp per value, as silu_mul_row. The per-op path (gelu_tanh_mul) and the GGUF
// stack call this function, so both give a row the same bits; torch's gelu differs in the last ulps.
inline void gelu_tanh_mul_row(const float* g, const float* u, float* y, int64_t I) {
  constexpr float K = -1.5957691216057308f;  // -2 sqrt(2 / pi)
  constexpr float C = 0.044715f;
  int64_t i = 0;
#if defined(__AVX512F__)
  for (; i + 16 <= I; i += 16) {
    const __m512 a = _mm512_loadu_ps(g + i);
    const __m512 z = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(K), a),
                                   _mm512_fmadd_ps(_mm512_set1_ps(C), _mm512_mul_ps(a, a), _mm512_set1_ps(1.f)));
    const __m512 act = _mm512_div_ps(a, _mm512_add_ps(_mm512_set1_ps(1.f), exp16(z)));
    _mm512_storeu_ps(y + i, _mm512_mul_ps(act, _mm512_loadu_ps(u + i)));
  }
#elif CADENCE_HAVE_AVX2
  for (; i + 8 <= I; i += 8) {
    const __m256 a = _mm256_loadu_ps(g + i);
    const __m256 z = _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(K), a),
                                   _mm256_fmadd_ps(_mm256_set1_ps(C), _mm256_mul_ps(a, a), _mm256_set1_ps(1.f)));
    const __m256 act = _mm256_div_ps(a, _mm256_add_ps(_mm256_set1_ps(1.f), avx2::exp8(z)));
    _mm256_storeu_ps(y + i, _mm256_mul_ps(act, _mm256_loadu_ps(u + i)));
  }
#endif
  for (; i < I; ++i) {
    const float a = g[i];
    const float z = (K * a) * std::fma(C, a * a, 1.f);
    y[i] = (a / (1.f + std::exp(z))) * u[i];
  }
}

// n values of a K or V row into a cache slot of storage type C: a copy where C is the row's
// type, else rounded to nearest even (float32 rows into a float16 or bf16 cache) exactly as
// torch's cast rounds them, so the torch write path (attention.write_kv) stores the same bits.
template <typename T, typename C>
inline void store_kv_row(C* dst, const T* src, int64_t n) {
  if constexpr (std::is_same_v<T, C>) {
    std::memcpy(dst, src, sizeof(T) * n);
  } else {
    static_assert(std::is_same_v<T, float>, "a 16-bit KV cache holds float32 rows only");
    int64_t i = 0;
#if defined(__F16C__)
    if constexpr (std::is_same_v<C, c10::Half>) {
      for (; i + 8 <= n; i += 8)
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
#endif
    for (; i < n; ++i) dst[i] = from_float<C>(src[i]);
  }
}

// One token of rope + cache write: row = [q heads | k heads | v heads] (each D wide) rotated in
// place (q and k: x * cos + rotate_half(x) * sin, each product and the sum rounded to T as the
// eager path does); then k and v are stored in the cache slot (kc, vc point at the slot's row),
// in the cache's storage type C (T, or float16 / bf16 for a float32 row: store_kv_row).
template <typename T, typename C = T>
inline void rope_write_row(T* row, const float* ct, const float* st, int64_t Hq, int64_t Hkv,
                           int64_t D, C* kc_slot, C* vc_slot) {
  const int64_t half = D / 2;
#if defined(__AVX512F__)
  // bf16 rows 16 dims at a time (the same roundings lane by lane; float32 keeps the scalar
  // loop, where the compiler may fuse a * c + b * s differently from eager torch).
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    constexpr int64_t MAX_HALF_VECS = 4;  // head_dim up to 128
    if (half % 16 == 0 && half / 16 <= MAX_HALF_VECS) {
      T* tag = nullptr;  // selects the bf16 rounding of round16
      const int64_t vecs = half / 16;
      __m512 c_lo[MAX_HALF_VECS], s_lo[MAX_HALF_VECS], c_hi[MAX_HALF_VECS], s_hi[MAX_HALF_VECS];
      for (int64_t i = 0; i < vecs; ++i) {
        c_lo[i] = round16(tag, _mm512_loadu_ps(ct + 16 * i));
        s_lo[i] = round16(tag, _mm512_loadu_ps(st + 16 * i));
        c_hi[i] = round16(tag, _mm512_loadu_ps(ct + half + 16 * i));
        s_hi[i] = round16(tag, _mm512_loadu_ps(st + half + 16 * i));
      }
      for (int64_t head = 0; head < Hq + Hkv; ++head) {
        T* v = row + head * D;
        for (int64_t i = 0; i < vecs; ++i) {
          const __m512 a = load16(v + 16 * i), b = load16(v + half + 16 * i);
          const __m512 lo = round16(tag, _mm512_add_ps(round16(tag, _mm512_mul_ps(a, c_lo[i])),
                                                       round16(tag, _mm512_mul_ps(_mm512_xor_ps(b, _mm512_set1_ps(-0.f)), s_lo[i]))));
          const __m512 hi = round16(tag, _mm512_add_ps(round16(tag, _mm512_mul_ps(b, c_hi[i])),
                                                       round16(tag, _mm512_mul_ps(a, s_hi[i]))));
          store16(v + 16 * i, lo);
          store16(v + half + 16 * i, hi);
        }
      }
      store_kv_row(kc_slot, row + Hq * D, Hkv * D);
      store_kv_row(vc_slot, row + (Hq + Hkv) * D, Hkv * D);
      return;
    }
  }
#endif
  for (int64_t head = 0; head < Hq + Hkv; ++head) {
    T* v = row + head * D;
    for (int64_t d = 0; d < half; ++d) {
      const float a = to_float(v[d]), b = to_float(v[d + half]);
      const float lo = round_to<T>(round_to<T>(a * round_to<T>(ct[d])) +
                                   round_to<T>(-b * round_to<T>(st[d])));
      const float hi = round_to<T>(round_to<T>(b * round_to<T>(ct[d + half])) +
                                   round_to<T>(a * round_to<T>(st[d + half])));
      v[d] = from_float<T>(lo);
      v[d + half] = from_float<T>(hi);
    }
  }
  store_kv_row(kc_slot, row + Hq * D, Hkv * D);
  store_kv_row(vc_slot, row + (Hq + Hkv) * D, Hkv * D);
}

}  // namespace cadence_kernels
