// rope_write_kv: rotate q and k of a fused qkv projection in place (HF rotate_half layout) and
// store k, v at their cache slots; with q/k norm weights (Qwen3, Gemma 3), each q and k head is
// RMS-normed first (qk_norm_row: the fused stacks' own function, so both paths round alike).
#include "common.h"
#include "ops.h"
#include "rows.h"

namespace cadence_kernels {

// ---------------------------------------------------------------------------------------------
// rope_write_kv
// qkv: [T, (Hq + 2 Hkv) * D] (q heads, then k heads, then v heads), rotated in place;
// cos, sin: [T, D] float32; k_cache, v_cache: [num_blocks, block_size, Hkv, D]; slots: [T] int64;
// q_w, k_w: [D] in qkv's dtype, or both null (no q/k norm).
template <typename T, typename C>
void rope_write_kv_impl(at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                        int64_t Hq, int64_t Hkv, at::Tensor& k_cache, at::Tensor& v_cache,
                        const at::Tensor& slots, const T* q_w, const T* k_w, float eps) {
  const int64_t T_ = qkv.size(0), D = k_cache.size(3);
  const int64_t width = (Hq + 2 * Hkv) * D;
  T* x = qkv.data_ptr<T>();
  const float* c = cos.data_ptr<float>();
  const float* s = sin.data_ptr<float>();
  C* kc = k_cache.data_ptr<C>();
  C* vc = v_cache.data_ptr<C>();
  const int64_t* sl = slots.data_ptr<int64_t>();
  at::parallel_for(0, T_, row_grain(T_, width), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      if (q_w != nullptr) qk_norm_row<T>(x + t * width, q_w, k_w, Hq, Hkv, D, eps);
      rope_write_row<T, C>(x + t * width, c + t * D, s + t * D, Hq, Hkv, D, kc + sl[t] * Hkv * D,
                           vc + sl[t] * Hkv * D);
    }
  });
}

void rope_write_kv(at::Tensor qkv, at::Tensor cos, at::Tensor sin, int64_t num_heads,
                   int64_t num_kv_heads, at::Tensor k_cache, at::Tensor v_cache,
                   at::Tensor slots, c10::optional<at::Tensor> q_norm, c10::optional<at::Tensor> k_norm,
                   double eps) {
  check_cpu_contiguous(qkv, "qkv");
  check_cpu_contiguous(k_cache, "k_cache");
  check_cpu_contiguous(v_cache, "v_cache");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat,
              "rope_write_kv: cos/sin must be float32");
  auto c = cos.contiguous(), s = sin.contiguous();
  auto sl = slots.to(at::kLong).contiguous();
  const int64_t D = k_cache.size(3);
  TORCH_CHECK(qkv.size(1) == (num_heads + 2 * num_kv_heads) * D && c.size(1) == D &&
                  c.size(0) == qkv.size(0) && sl.numel() == qkv.size(0) &&
                  k_cache.size(2) == num_kv_heads,
              "rope_write_kv: shape mismatch");
  // A float32 qkv may go into a float32, float16 or bf16 cache (a 16-bit KV cache of the
  // float32 path); a bf16 qkv into a bf16 cache.
  const auto cache_type = k_cache.scalar_type();
  TORCH_CHECK(v_cache.sizes() == k_cache.sizes() && v_cache.scalar_type() == cache_type &&
                  (qkv.scalar_type() == cache_type ||
                   (qkv.scalar_type() == at::kFloat && (cache_type == at::kHalf || cache_type == at::kBFloat16))),
              "rope_write_kv: caches must share a shape and dtype: qkv's, or float16 / bfloat16 under a float32 qkv");
  {
    const int64_t num_slots = k_cache.size(0) * k_cache.size(1);
    const int64_t* sp = sl.data_ptr<int64_t>();
    for (int64_t t = 0; t < sl.numel(); ++t)
      TORCH_CHECK(sp[t] >= 0 && sp[t] < num_slots, "rope_write_kv: slot ", sp[t], " outside cache of ", num_slots);
  }
  const bool has_q = q_norm.has_value() && q_norm->defined(), has_k = k_norm.has_value() && k_norm->defined();
  TORCH_CHECK(has_q == has_k, "rope_write_kv: q_norm and k_norm come together");
  if (has_q) {
    TORCH_CHECK(q_norm->is_contiguous() && k_norm->is_contiguous() && q_norm->numel() == D && k_norm->numel() == D &&
                    q_norm->scalar_type() == qkv.scalar_type() && k_norm->scalar_type() == qkv.scalar_type(),
                "rope_write_kv: q_norm, k_norm [head_dim] contiguous in qkv's dtype");
    TORCH_CHECK(eps > 0, "rope_write_kv: q/k norms need a positive eps");
  }
  const float feps = static_cast<float>(eps);
  if (qkv.scalar_type() == at::kFloat) {
    const float* qw = has_q ? q_norm->data_ptr<float>() : nullptr;
    const float* kw = has_q ? k_norm->data_ptr<float>() : nullptr;
    if (cache_type == at::kHalf)
      rope_write_kv_impl<float, c10::Half>(qkv, c, s, num_heads, num_kv_heads, k_cache, v_cache, sl, qw, kw, feps);
    else if (cache_type == at::kBFloat16)
      rope_write_kv_impl<float, c10::BFloat16>(qkv, c, s, num_heads, num_kv_heads, k_cache, v_cache, sl, qw, kw,
                                               feps);
    else
      rope_write_kv_impl<float, float>(qkv, c, s, num_heads, num_kv_heads, k_cache, v_cache, sl, qw, kw, feps);
  } else if (qkv.scalar_type() == at::kBFloat16) {
    const c10::BFloat16* qw = has_q ? q_norm->data_ptr<c10::BFloat16>() : nullptr;
    const c10::BFloat16* kw = has_q ? k_norm->data_ptr<c10::BFloat16>() : nullptr;
    rope_write_kv_impl<c10::BFloat16, c10::BFloat16>(qkv, c, s, num_heads, num_kv_heads, k_cache, v_cache, sl, qw,
                                                     kw, feps);
  } else {
    TORCH_CHECK(false, "rope_write_kv: float32 or bfloat16 only");
  }
}

}  // namespace cadence_kernels
