// DecodeStack: every decoder layer of a bf16 Llama-family model (and Qwen3's, with its q/k norms) for a small batch of rows
// (decodes and short prefill chunks) in one C++ call, inside one OpenMP parallel region.
//
// Why: a decode step of a small model is ~300 small kernel calls. Called from Python each pays
// the interpreter and a thread wake-up (OMP_WAIT_POLICY=PASSIVE puts idle threads to sleep, which
// a busy neighbour core needs), so weights under a few MB were read by one thread only. Here the
// team stays awake for the whole forward: every GEMM is split over all threads by column blocks
// (packed weights, packed_gemm.h), attention by (row, context span), and the threads meet at a
// spinning barrier that yields the core after a short spin, so a descheduled partner does not
// stall the other for long. If a thread was off its core for over a quarter of the step (its CPU
// time against its wall time: a neighbour process holds that core) in two steps in a row, the
// next solo period (8 steps, doubling to 64 while it recurs: team.h) runs on one thread, then the team is tried again. (Barrier waiting alone
// is no such sign: a batch-1 step waits much of its short phases on uneven shares with both
// cores free.)
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <atomic>
#include <mutex>
#include <vector>

#include "team.h"

namespace cadence_kernels {

// Phases (StackTeam's phase_seconds): qkv, rope, attention, o, norm, gate/up, down, norm.
class DecodeStack : public StackTeam<8> {
 public:
  // Per-layer weights in Hugging Face layout (bf16, contiguous): qkv [Hq*D + 2*Hkv*D, H] (q, k,
  // v rows fused), qkv_bias (same count or empty), o [H, Hq*D], gate_up [2I, H] (gate rows then
  // up rows), down [H, I], norms [H]. They are packed once here; the tensors are not kept.
  DecodeStack(const std::vector<at::Tensor>& qkv, const std::vector<at::Tensor>& qkv_bias,
              const std::vector<at::Tensor>& o, const std::vector<at::Tensor>& gate_up,
              const std::vector<at::Tensor>& down, const std::vector<at::Tensor>& input_norm,
              const std::vector<at::Tensor>& post_norm, at::Tensor final_norm, int64_t num_heads,
              int64_t num_kv_heads, double eps);

  // x: [T, H] bf16 embeddings of the step's rows; cos, sin: [T, D] float32; kv: the cache
  // storage [layers, 2, blocks, block_size, Hkv, D] bf16; slots: [T] int64 cache slot of each
  // row; block_tables [S, max_blocks] int32; row_seq [T] int64 (block-table row of each row);
  // ctx_lens [T] int64 (row t attends over positions [0, ctx_lens[t]), its own included).
  // Writes this step's K/V into the cache; returns the final-norm hidden states [T, H] bf16.
  at::Tensor forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                     at::Tensor kv, const at::Tensor& slots, const at::Tensor& block_tables,
                     const at::Tensor& row_seq, const at::Tensor& ctx_lens, double scale) const;

  // Per-layer q and k RMS norm weights ([D] each, held as bf16; Qwen3), applied to each head of
  // the projections before rope as rope_write_kv's q_norm / k_norm do (qk_norm_row, the model's eps).
  void attach_qk_norms(const std::vector<at::Tensor>& q_norm, const std::vector<at::Tensor>& k_norm);
  bool has_qk_norms() const { return !layers_.empty() && layers_[0].q_norm.defined(); }

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }

 private:
  struct Layer {
    at::Tensor qkv, qkv_bias, o, gate_up, down;  // packed weights (bias plain, may be undefined)
    at::Tensor input_norm, post_norm;
    at::Tensor q_norm, k_norm;  // bf16 [D], undefined without q/k norms
  };
  std::vector<Layer> layers_;
  at::Tensor final_norm_;
  int64_t hidden_, heads_, kv_heads_, head_dim_, intermediate_;
  double eps_;
};

}  // namespace cadence_kernels
