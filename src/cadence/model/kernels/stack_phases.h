// What the fused decode stacks (decode_stack.cpp: bf16; avx2/decode_stack_f32.cpp: float32 on
// compressed weights; gguf/decode_stack_gguf.cpp: GGUF blocks) do alike around their GEMMs, written
// once so that they check, norm and rotate alike: a step's row inputs (StepRows), the per-layer
// q/k norm weights, phase 2 of a layer ((q/k norms,) rope, cache write) and the residual + RMS
// norm of phases 5 and 8. Every row goes through rows.h's functions, as on the per-op path.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

#include "common.h"
#include "rows.h"
#include "team.h"

namespace cadence_kernels {

// A step's inputs besides the embeddings as every stack's forward takes them, checked and held:
// cos, sin [T, D] float32; kv [layers, 2, blocks, block_size, Hkv, D] (its element type is the
// caller's to check); slots [T], row_seq [T], ctx_lens [T] (any integer type, held as int64);
// block_tables [S, max_blocks] int32; x: [T, H] of x_type.
struct StepRows {
  at::Tensor cos, sin, slots, row_seq, ctx_lens;  // contiguous copies where the inputs were not
  const float* cp;
  const float* sp;
  const int64_t* slp;
  const int64_t* seqp;
  const int64_t* lenp;
  const int32_t* btp;
  int64_t T, blocks, block_size, max_blocks;
  int64_t layer_stride;  // cache elements per layer (its K and V halves)

  StepRows(const char* who, const at::Tensor& x, at::ScalarType x_type, int64_t H, const at::Tensor& cos_, const at::Tensor& sin_,
           const at::Tensor& kv, int64_t L, int64_t Hkv, int64_t D, const at::Tensor& slots_,
           const at::Tensor& block_tables, const at::Tensor& row_seq_, const at::Tensor& ctx_lens_) {
    check_cpu_contiguous(x, "x");
    check_cpu_contiguous(kv, "kv");
    check_cpu_contiguous(block_tables, "block_tables");
    TORCH_CHECK(x.scalar_type() == x_type && x.dim() == 2 && x.size(1) == H, who, ": x [T, H] ", x_type);
    T = x.size(0);
    TORCH_CHECK(kv.dim() == 6 && kv.size(0) == L && kv.size(1) == 2 && kv.size(4) == Hkv && kv.size(5) == D, who,
                ": kv [layers, 2, blocks, block_size, Hkv, D]");
    TORCH_CHECK(cos_.scalar_type() == at::kFloat && sin_.scalar_type() == at::kFloat && cos_.size(0) == T &&
                    cos_.size(1) == D && sin_.sizes() == cos_.sizes(),
                who, ": cos, sin [T, D] float32");
    TORCH_CHECK(block_tables.scalar_type() == at::kInt, who, ": block_tables int32");
    cos = cos_.contiguous();
    sin = sin_.contiguous();
    slots = slots_.to(at::kLong).contiguous();
    row_seq = row_seq_.to(at::kLong).contiguous();
    ctx_lens = ctx_lens_.to(at::kLong).contiguous();
    TORCH_CHECK(slots.numel() == T && row_seq.numel() == T && ctx_lens.numel() == T, who,
                ": one slot, row_seq and ctx_len per row");
    blocks = kv.size(2);
    block_size = kv.size(3);
    max_blocks = block_tables.size(1);
    slp = slots.data_ptr<int64_t>();
    seqp = row_seq.data_ptr<int64_t>();
    lenp = ctx_lens.data_ptr<int64_t>();
    btp = block_tables.data_ptr<int32_t>();
    check_step_rows(who, T, slp, seqp, lenp, btp, block_tables.size(0), max_blocks, blocks, block_size);
    layer_stride = 2 * blocks * block_size * Hkv * D;
    cp = cos.data_ptr<float>();
    sp = sin.data_ptr<float>();
  }
  // Row t's block table.
  const int32_t* table(int64_t t) const { return btp + seqp[t] * max_blocks; }
};

// The LM head's outputs of a stack's forward (GGUF and float32 stacks), checked: logits [T, N]
// float32 (N: the attached head's size, 0 without one) and each row's argmax [T] int64; null
// where not given (argmax needs logits).
struct HeadOutputs {
  float* logits = nullptr;
  int64_t* argmax = nullptr;

  HeadOutputs(const char* who, const c10::optional<at::Tensor>& logits_, const c10::optional<at::Tensor>& argmax_,
              int64_t T, int64_t N) {
    if (logits_.has_value() && logits_->defined()) {
      TORCH_CHECK(N > 0, who, ": logits need attach_head first");
      check_cpu_contiguous(*logits_, "logits");
      TORCH_CHECK(logits_->scalar_type() == at::kFloat && logits_->dim() == 2 && logits_->size(0) == T &&
                      logits_->size(1) == N,
                  who, ": logits [T, ", N, "] float32");
      logits = logits_->data_ptr<float>();
    }
    if (argmax_.has_value() && argmax_->defined()) {
      TORCH_CHECK(logits != nullptr, who, ": argmax needs logits");
      check_cpu_contiguous(*argmax_, "argmax");
      TORCH_CHECK(argmax_->scalar_type() == at::kLong && argmax_->numel() == T, who, ": argmax [T] int64");
      argmax = argmax_->data_ptr<int64_t>();
    }
  }
};

// A step's activations that the team shares (each thread writes its share of columns or rows),
// E per value (float, or bf16 bits): qkv [T, (Hq + 2 Hkv) D], attn [T, Hq D] (attention's output),
// o [T, H], gate_up [T, 2 I], act [T, I] (silu(gate) * up), down [T, H].
template <typename E>
struct StepActivations {
  StepActivations(int64_t T, int64_t H, int64_t Hq, int64_t Hkv, int64_t D, int64_t I)
      : qkv_width((Hq + 2 * Hkv) * D), qkv(T * qkv_width), attn(T * Hq * D), o(T * H), gate_up(T * 2 * I),
        act(T * I), down(T * H) {}
  const int64_t qkv_width;
  std::vector<E> qkv, attn, o, gate_up, act, down;
};

// Per-layer q and k RMS norm weights ([D] each; Qwen3) in the stack's element type, into each
// layer's q_norm and k_norm (a stack's attach_qk_norms).
template <typename Layer>
void attach_qk_norm_weights(std::vector<Layer>& layers, const std::vector<at::Tensor>& q_norm,
                            const std::vector<at::Tensor>& k_norm, int64_t D, at::ScalarType type, const char* who) {
  TORCH_CHECK(q_norm.size() == layers.size() && k_norm.size() == layers.size(), who,
              ": one q_norm and one k_norm per layer");
  for (size_t l = 0; l < layers.size(); ++l) {
    TORCH_CHECK(q_norm[l].numel() == D && k_norm[l].numel() == D, who, ": q_norm, k_norm must have ", D,
                " elements");
    layers[l].q_norm = q_norm[l].to(type).contiguous();
    layers[l].k_norm = k_norm[l].to(type).contiguous();
  }
}

// Phase 2 of a layer over rows [r0, r1) of qkv [T, (Hq + 2 Hkv) D]: with q/k norm weights (q_norm,
// k_norm [D], or null) each q and k head RMS-normed (qk_norm_row), then q and k rotated by the
// rows' cos, sin [T, D] and k, v stored at the rows' slots of kc, vc, the layer's K and V caches
// (rope_write_row): the per-op rope_write_kv's row functions, so both round alike.
template <typename T, typename KV>
inline void rope_write_rows(T* qkv, int64_t r0, int64_t r1, const StepRows& rows, const float* cos,
                            const float* sin, const T* q_norm, const T* k_norm, int64_t Hq, int64_t Hkv,
                            int64_t D, float eps, KV* kc, KV* vc) {
  const int64_t width = (Hq + 2 * Hkv) * D;
  for (int64_t t = r0; t < r1; ++t) {
    if (q_norm != nullptr) qk_norm_row<T>(qkv + t * width, q_norm, k_norm, Hq, Hkv, D, eps);
    rope_write_row<T, KV>(qkv + t * width, cos + t * D, sin + t * D, Hq, Hkv, D, kc + rows.slp[t] * Hkv * D,
                          vc + rows.slp[t] * Hkv * D);
  }
}

// Phases 5 and 8 (and the first layer's input norm) on this thread's own copy of every row of
// residual, normed [T, H]: residual += add (rounded to T; no add where add is null), then
// normed = w * norm(residual) (rms_norm_row, the per-op add_rms_norm's row).
template <typename T>
inline void add_norm_rows(T* residual, const T* add, const T* w, T* normed, int64_t T_rows, int64_t H, float eps) {
  for (int64_t t = 0; t < T_rows; ++t)
    rms_norm_row<T>(residual + t * H, add != nullptr ? add + t * H : nullptr, w, normed + t * H, H, eps);
}

}  // namespace cadence_kernels
