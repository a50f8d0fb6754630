// rms_norm, add_rms_norm and silu_mul: the elementwise steps between the GEMMs, rounded as the
// eager torch path rounds them.
#include "common.h"
#include "ops.h"
#include "rows.h"

namespace cadence_kernels {

// ---------------------------------------------------------------------------------------------
// RMS norm (HF Llama semantics: normalise in float32, cast to the dtype, then times the weight).
// residual (optional) += x, rounded to T; out = weight * T(norm(residual)) rounded to T.
template <typename T>
void rms_norm_rows(T* resid, const T* add, const T* w, T* out, int64_t rows, int64_t H, float eps) {
  at::parallel_for(0, rows, row_grain(rows, H), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r)
      rms_norm_row<T>(resid + r * H, add == nullptr ? nullptr : add + r * H, w, out + r * H, H, eps);
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
    for (int64_t r = begin; r < end; ++r) silu_mul_row<T>(gu + r * 2 * I, gu + r * 2 * I + I, out + r * I, I);
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

// gelu_tanh_mul: gate_up [T, 2 I] float32 (gate then up) -> [T, I] = gelu_tanh(gate) * up
// (gelu_tanh_mul_row, the GGUF decode stack's function).
at::Tensor gelu_tanh_mul(at::Tensor gate_up) {
  check_cpu_contiguous(gate_up, "gate_up");
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.size(1) % 2 == 0 && gate_up.scalar_type() == at::kFloat,
              "gelu_tanh_mul: gate_up [T, 2 I] float32");
  const int64_t rows = gate_up.size(0), I = gate_up.size(1) / 2;
  auto out = at::empty({rows, I}, gate_up.options());
  const float* gu = gate_up.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, rows, row_grain(rows, 2 * I), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) gelu_tanh_mul_row(gu + r * 2 * I, gu + r * 2 * I + I, o + r * I, I);
  });
  return out;
}

}  // namespace cadence_kernels
