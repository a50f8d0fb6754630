// rms_norm, add_rms_norm and silu_mul: the elementwise steps between the GEMMs, rounded as the
// eager torch path rounds them.
#include "common.h"
#include "ops.h"

namespace cadence_kernels {

// ---------------------------------------------------------------------------------------------
// RMS norm (HF Llama semantics: normalise in float32, cast to the dtype, then times the weight).
// residual (optional) += x, rounded to T; out = weight * T(norm(residual)) rounded to T.
template <typename T>
void rms_norm_rows(T* resid, const T* add, const T* w, T* out, int64_t rows, int64_t H, float eps) {
  at::parallel_for(0, rows, row_grain(rows, H), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      T* x = resid + r * H;
      const T* a = add == nullptr ? nullptr : add + r * H;
      T* y = out + r * H;
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
#endif
      for (; i < H; ++i) y[i] = from_float<T>(to_float(w[i]) * round_to<T>(to_float(x[i]) * inv));
    }
  });
}

void check_norm_args(const at::Tensor& x, const at::Tensor& w) {
  check_cpu_contiguous(x, "x");
  check_cpu_contiguous(w, "weight");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 1 && x.size(1) == w.size(0), "rms_norm: x [rows, H], weight [H]");
  TORCH_CHECK(x.scalar_type() == w.scalar_type(), "rms_norm: x and weight must share a dtype");
}

at::Tensor rms_norm(at::Tensor x, at::Tensor w, double eps) {
  check_norm_args(x, w);
  auto out = at::empty_like(x);
  if (x.scalar_type() == at::kFloat) {
    rms_norm_rows<float>(x.data_ptr<float>(), nullptr, w.data_ptr<float>(), out.data_ptr<float>(), x.size(0), x.size(1), eps);
  } else if (x.scalar_type() == at::kBFloat16) {
    rms_norm_rows<c10::BFloat16>(x.data_ptr<c10::BFloat16>(), nullptr, w.data_ptr<c10::BFloat16>(),
                                 out.data_ptr<c10::BFloat16>(), x.size(0), x.size(1), eps);
  } else {
    TORCH_CHECK(false, "rms_norm: float32 or bfloat16 only");
  }
  return out;
}

// residual += x in place; returns rms_norm(residual) * w.
at::Tensor add_rms_norm(at::Tensor residual, at::Tensor x, at::Tensor w, double eps) {
  check_norm_args(residual, w);
  check_cpu_contiguous(x, "x");
  TORCH_CHECK(x.sizes() == residual.sizes() && x.scalar_type() == residual.scalar_type(),
              "add_rms_norm: residual and x must match");
  auto out = at::empty_like(x);
  if (x.scalar_type() == at::kFloat) {
    rms_norm_rows<float>(residual.data_ptr<float>(), x.data_ptr<float>(), w.data_ptr<float>(),
                         out.data_ptr<float>(), x.size(0), x.size(1), eps);
  } else if (x.scalar_type() == at::kBFloat16) {
    rms_norm_rows<c10::BFloat16>(residual.data_ptr<c10::BFloat16>(), x.data_ptr<c10::BFloat16>(),
                                 w.data_ptr<c10::BFloat16>(), out.data_ptr<c10::BFloat16>(),
                                 x.size(0), x.size(1), eps);
  } else {
    TORCH_CHECK(false, "add_rms_norm: float32 or bfloat16 only");
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// silu_mul: gate_up [T, 2 I] (gate then up) -> [T, I] = silu(gate) * up, rounded as eager torch.
template <typename T>
void silu_mul_impl(const T* gu, T* out, int64_t rows, int64_t I) {
  at::parallel_for(0, rows, row_grain(rows, 2 * I), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* g = gu + r * 2 * I;
      const T* u = g + I;
      T* y = out + r * I;
      int64_t i = 0;
#if defined(__AVX512F__)
      for (; i + 16 <= I; i += 16) {
        const __m512 a = load16(g + i);
        const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), a));  // exp(-a)
        const __m512 act = round16(y, _mm512_div_ps(a, _mm512_add_ps(_mm512_set1_ps(1.f), e)));
        store16(y + i, _mm512_mul_ps(act, load16(u + i)));
      }
#endif
      for (; i < I; ++i) {
        const float a = to_float(g[i]);
        const float act = round_to<T>(a / (1.f + std::exp(-a)));
        y[i] = from_float<T>(act * to_float(u[i]));
      }
    }
  });
}

at::Tensor silu_mul(at::Tensor gate_up) {
  check_cpu_contiguous(gate_up, "gate_up");
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.size(1) % 2 == 0, "silu_mul: gate_up [T, 2 I]");
  const int64_t rows = gate_up.size(0), I = gate_up.size(1) / 2;
  auto out = at::empty({rows, I}, gate_up.options());
  if (gate_up.scalar_type() == at::kFloat) {
    silu_mul_impl<float>(gate_up.data_ptr<float>(), out.data_ptr<float>(), rows, I);
  } else if (gate_up.scalar_type() == at::kBFloat16) {
    silu_mul_impl<c10::BFloat16>(gate_up.data_ptr<c10::BFloat16>(), out.data_ptr<c10::BFloat16>(), rows, I);
  } else {
    TORCH_CHECK(false, "silu_mul: float32 or bfloat16 only");
  }
  return out;
}

}  // namespace cadence_kernels
