// DecodeStackF32: every decoder layer of a Llama-family model for a small batch of rows in one
// C++ call, computing in float32 on weights stored compressed (float32, bf16 or int8; see
// packed_gemm_f32.h): the fused decode path of CPUs without native bf16 (the AVX2 tier).
//
// Same design as the bf16 DecodeStack (decode_stack.h): one OpenMP team stays awake for the whole
// forward; GEMMs are split over threads by column blocks, attention by (row, span)
// items (attention_f32.h); threads meet at a spinning barrier that yields; after two steps in a
// row in which a thread was pushed off its core, a solo period (team.h) runs on one thread. Activations
// are float32; the KV cache float32, float16 or bf16.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "../page_pool.h"
#include "../team.h"

namespace cadence_kernels {

// Phases (StackTeam's phase_seconds): those of DecodeStack, then the LM head (and argmax).
class DecodeStackF32 : public StackTeam<9> {
 public:
  // Per-layer weights in Hugging Face layout (float32 or bf16): qkv [Hq*D + 2*Hkv*D, H], qkv_bias
  // (same count, or empty), o [H, Hq*D], gate_up [2I, H], down [H, I], norms [H]. Packed here in
  // `format` (0 float32, 1 bf16, 2 int8); the tensors are not kept.
  DecodeStackF32(const std::vector<at::Tensor>& qkv, const std::vector<at::Tensor>& qkv_bias,
                 const std::vector<at::Tensor>& o, const std::vector<at::Tensor>& gate_up,
                 const std::vector<at::Tensor>& down, const std::vector<at::Tensor>& input_norm,
                 const std::vector<at::Tensor>& post_norm, at::Tensor final_norm, int64_t num_heads,
                 int64_t num_kv_heads, double eps, int64_t format);

  // x: [T, H] float32 embeddings; cos, sin: [T, D] float32; kv: [layers, 2, blocks, block_size,
  // Hkv, D] float32, float16 or bfloat16 (K/V stored rounded to it, attention computes in float32); slots [T] int64; block_tables [S, max_blocks] int32; row_seq [T] int64;
  // ctx_lens [T] int64 (row t attends over [0, ctx_lens[t]), itself included). Writes this step's
  // K/V into the cache; returns the final-norm hidden states [T, H] float32.
  // With `logits` ([T, head_size] float32; attach_head first): also the LM head over the
  // final-norm rows into it, and with `argmax` ([T] int64) each row's torch.argmax, in the same
  // parallel region.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor kv,
                     const at::Tensor& slots, const at::Tensor& block_tables, const at::Tensor& row_seq,
                     const at::Tensor& ctx_lens, double scale, const c10::optional<at::Tensor>& logits = c10::nullopt,
                     const c10::optional<at::Tensor>& argmax = c10::nullopt) const;

  // Per-layer q and k RMS norm weights ([D] each; Qwen3), applied to each head of the projections
  // before rope as rope_write_kv's q_norm / k_norm do (qk_norm_row, the model's eps).
  void attach_qk_norms(const std::vector<at::Tensor>& q_norm, const std::vector<at::Tensor>& k_norm);
  bool has_qk_norms() const { return !layers_.empty() && layers_[0].q_norm.defined(); }

  // The model's LM head [N = vocab, H], packed as linear_packed_f32 takes it (data, scales,
  // format: the model's packed head, referenced, not copied), for forward's `logits`: a decode
  // step's logits and their argmax in the stack's own parallel region, the bits
  // linear_packed_f32 gives, without waking the team a second time.
  void attach_head(const at::Tensor& data, const at::Tensor& scales, int64_t format, int64_t N);
  // The attached head's N (the vocabulary), 0 without one.
  int64_t head_size() const { return head_N_; }
  // An uninitialised [T, head_size] float32 tensor for forward's `logits`, on pages kept mapped
  // from one step's logits to the next (page_pool.h).
  at::Tensor new_logits(int64_t T) const { return PagePool::take(logits_pool_, T, head_N_); }

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  int64_t weight_format() const { return format_; }
  // Bytes of packed weights (what one step streams from memory at batch 1).
  int64_t weight_bytes() const;
  // Layer l's packed (data, scales) of qkv, o, gate_up (halves interleaved by 16 columns), down:
  // the per-op path's GEMMs of small row counts run on them (linear_packed_f32) without a
  // second packed copy of the weights.
  std::vector<at::Tensor> packed_layer(int64_t l) const;

 private:
  // forward with the cache's storage type KV (float, c10::Half or c10::BFloat16).
  // With logits (and argmax) non-null, the head runs after the last layer.
  template <typename KV>
  at::Tensor forward_kv(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor kv,
                        const at::Tensor& slots, const at::Tensor& block_tables, const at::Tensor& row_seq,
                        const at::Tensor& ctx_lens, double scale, float* logits, int64_t* argmax) const;

  struct Packed {
    at::Tensor data, scales;
  };
  struct Layer {
    Packed qkv, o, gate_up, down;
    at::Tensor qkv_bias, input_norm, post_norm;  // float32
    at::Tensor q_norm, k_norm;                   // float32 [D], undefined without q/k norms
  };
  std::vector<Layer> layers_;
  at::Tensor final_norm_;
  Packed head_;  // undefined until attach_head
  int64_t head_N_ = 0, head_format_ = 0;
  std::shared_ptr<PagePool> logits_pool_ = PagePool::create();
  int64_t hidden_, heads_, kv_heads_, head_dim_, intermediate_, format_;
  double eps_;
};

}  // namespace cadence_kernels
