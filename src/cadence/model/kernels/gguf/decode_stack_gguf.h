// DecodeStackGGUF: every decoder layer of a Llama-family model computed natively from a GGUF file
// (`--quantization gguf`) for a small batch of rows in one C++ call: the GGUF counterpart of
// DecodeStackF32 (avx2/decode_stack_f32.h), whose team, barriers, attention and row functions it
// shares. Its GEMMs are the per-op path's GGUF column kernels (gemm.h: the 8-column repacked Q4_K /
// Q6_K tiles, the row-wise codecs of every other type) on the weights as the model holds them (the
// file's memory-mapped blocks, or their repacked copies): nothing is copied or re-quantized.
//
// Every row gets the same arithmetic as on the per-op path (gguf_linear_many, rms_norm,
// add_rms_norm, rope_write_kv with its optional q/k norms, paged_attention, silu_mul): the same activation quantization
// (per 256 k for the K-quants, per 32 for the other quantized types), the same column kernels
// (a column's bits never depend on the thread split or the rows beside it), the same per-row
// norm, rope, silu and attention functions. So the stack and the per-op path give the same bits,
// and a row's result does not depend on its batch.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>

#include <array>
#include <memory>
#include <vector>

#include "../page_pool.h"
#include "../team.h"

namespace cadence_kernels {

// Phases (StackTeam's phase_seconds): the 8 of DecodeStackF32, then the LM head (and argmax).
class DecodeStackGGUF : public StackTeam<9> {
 public:
  // One entry per projection, 7 per layer in the order q, k, v, o, gate, up, down: each weight's
  // row-wise blocks ([N, row_bytes] uint8, or empty where `packed` holds every column), its ggml
  // type, its repacked octets (gguf_repack's output, or none) and its float32 bias (or none).
  // Shapes: q [Hq*D, H], k and v [Hkv*D, H], o [H, Hq*D], gate and up [I, H], down [H, I]. The
  // tensors are referenced, not copied.
  DecodeStackGGUF(const std::vector<at::Tensor>& blocks, const std::vector<int64_t>& types,
                  const std::vector<c10::optional<at::Tensor>>& packed,
                  const std::vector<c10::optional<at::Tensor>>& biases, const std::vector<at::Tensor>& input_norm,
                  const std::vector<at::Tensor>& post_norm, at::Tensor final_norm, int64_t num_heads,
                  int64_t num_kv_heads, int64_t head_dim, int64_t intermediate, double eps);

  // The model's LM head [N = vocab, H] (its blocks, type, repacked octets and bias as for a
  // projection above), for forward's `logits`: referenced, not copied.
  void attach_head(const at::Tensor& blocks, int64_t type, const c10::optional<at::Tensor>& packed,
                   const c10::optional<at::Tensor>& bias, int64_t N);
  // Gemma's pieces (set after construction; without them the layers are Llama ones):
  // sandwich norms: per layer the norms [H] of the attention output (post_attention_layernorm)
  // and of the MLP output (post_feedforward_layernorm), applied before each residual add; the
  // constructor's post_norm is then the MLP's pre-norm (pre_feedforward_layernorm).
  void attach_sandwich_norms(const std::vector<at::Tensor>& attn_out, const std::vector<at::Tensor>& mlp_out);
  // The MLP's gate activation gelu_tanh (GeGLU: gelu_tanh_mul_row) instead of silu.
  void use_gelu_tanh() { gelu_ = true; }
  // Per layer: the attention window (0 = full attention; a query sees the keys at positions
  // > its own - window) and whether the layer rotates with forward's cos_local / sin_local (a
  // sliding layer's own rope base, Gemma 3) instead of cos / sin.
  void set_layer_attention(const std::vector<int64_t>& windows, const std::vector<bool>& local_rope);
  // Per-layer q and k RMS norm weights (float32 [head_dim] each; Qwen3, Gemma 3), applied to each head of
  // the projections before rope as rope_write_kv's q_norm / k_norm do (qk_norm_row, the model's
  // eps): without them no q/k norms.
  void attach_qk_norms(const std::vector<at::Tensor>& q_norm, const std::vector<at::Tensor>& k_norm);
  bool has_qk_norms() const { return !layers_.empty() && layers_[0].q_norm.defined(); }
  // The attached head's N (the vocabulary), 0 without one.
  int64_t head_size() const { return head_.N; }
  // An uninitialised [T, head_size] float32 tensor for forward's `logits`, on pages kept mapped
  // from one step's logits to the next (page_pool.h: fresh ones cost a 32-row step of a 128k
  // vocabulary ~1000 page faults inside the head's GEMM).
  at::Tensor new_logits(int64_t T) const { return PagePool::take(logits_pool_, T, head_.N); }

  // As DecodeStackF32::forward: x [T, H] float32 embeddings; cos, sin [T, D]; kv [layers, 2,
  // blocks, block_size, Hkv, D] float32, float16 or bf16; slots, block_tables, row_seq, ctx_lens. Writes this
  // step's K/V; returns the final-norm hidden states [T, H] float32.
  // logits ([T, vocab] float32, with a head attached): filled with the LM head's output on those
  // hidden states in the same parallel region (a decode step's largest GEMM without a second
  // region's wake-up), the bits gguf_linear gives; argmax ([T] int64, with logits): each row's
  // torch.argmax of them (the first index of the maximum, a NaN's first index if any).
  // cos_local, sin_local ([T, D]): the rope of the layers set_layer_attention marks local.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor kv,
                     const at::Tensor& slots, const at::Tensor& block_tables, const at::Tensor& row_seq,
                     const at::Tensor& ctx_lens, double scale, const c10::optional<at::Tensor>& logits,
                     const c10::optional<at::Tensor>& argmax, const c10::optional<at::Tensor>& cos_local,
                     const c10::optional<at::Tensor>& sin_local) const;

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  // Bytes the GEMMs read per step (the packed copies and the row-wise blocks they use).
  int64_t weight_bytes() const;

  // One projection: what the column kernels read.
  struct Matrix {
    at::Tensor blocks, packed, bias;  // packed, bias: undefined when absent
    int type = 0;
    int64_t N = 0, K = 0, row_bytes = 0;
  };

 private:
  // forward with the cache's storage type KV (float, c10::Half or c10::BFloat16).
  template <typename KV>
  at::Tensor forward_kv(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor kv,
                        const at::Tensor& slots, const at::Tensor& block_tables, const at::Tensor& row_seq,
                        const at::Tensor& ctx_lens, double scale, float* logits, int64_t* argmax,
                        const float* cos_local, const float* sin_local) const;
  struct Layer {
    Matrix q, k, v, o, gate, up, down;
    at::Tensor input_norm, post_norm;  // float32 [H]
    at::Tensor attn_out_norm, mlp_out_norm;  // float32 [H], undefined without sandwich norms
    int64_t window = 0;       // attention window, 0 = full
    bool local_rope = false;  // rotates with cos_local / sin_local
    at::Tensor q_norm, k_norm;               // float32 [D], undefined without q/k norms
  };
  std::vector<Layer> layers_;
  at::Tensor final_norm_;
  Matrix head_;  // N = 0 until attach_head
  std::shared_ptr<PagePool> logits_pool_ = PagePool::create();
  int64_t hidden_, heads_, kv_heads_, head_dim_, intermediate_;
  double eps_;
  bool gelu_ = false;
};

}  // namespace cadence_kernels
