// Entry points of the CPU kernels, bound to Python in bindings.cpp.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>
#include <tuple>
#include <vector>

namespace cadence_kernels {

at::Tensor paged_attention(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache,
                              at::Tensor block_tables, at::Tensor row_seq,
                              at::Tensor ctx_lens, double scale, int64_t window);
void rope_write_kv(at::Tensor qkv, at::Tensor cos, at::Tensor sin, int64_t num_heads,
                   int64_t num_kv_heads, at::Tensor k_cache, at::Tensor v_cache,
                   at::Tensor slots, c10::optional<at::Tensor> q_norm, c10::optional<at::Tensor> k_norm,
                   double eps);
at::Tensor rms_norm(at::Tensor x, at::Tensor w, double eps);
at::Tensor add_rms_norm(at::Tensor residual, at::Tensor x, at::Tensor w, double eps);
at::Tensor silu_mul(at::Tensor gate_up);
at::Tensor gelu_tanh_mul(at::Tensor gate_up);
bool has_avx512bf16();
// The instruction-set tier this build was compiled for (isa.py names).
std::string kernel_tier();
// FLOP/s (2 per byte product) of the tier's int8 dot-product micro kernel on every thread (int_dot_peak.cpp).
double int8_dot_peak(int64_t iterations);
at::Tensor linear_bf16(at::Tensor x, at::Tensor w);
at::Tensor prefill_attention(at::Tensor q, at::Tensor keys, at::Tensor values, double scale, c10::optional<at::Tensor> block_table, int64_t ctx_len);
// float32 causal flash attention of a prefill chunk (AVX2 tier, avx2/prefill_attention_f32.cpp).
at::Tensor prefill_attention_f32(at::Tensor q, at::Tensor keys, at::Tensor values, double scale,
                                 c10::optional<at::Tensor> block_table, int64_t ctx_len);
at::Tensor argmax_rows(at::Tensor logits);
at::Tensor pack_linear_bf16(at::Tensor w, bool interleave_halves);
at::Tensor linear_packed_bf16(at::Tensor x, at::Tensor packed, int64_t N, c10::optional<at::Tensor> bias,
                              bool float_out, c10::optional<at::Tensor> argmax_out);
// float32-compute linear on compressed packed weights (avx2/linear_f32.cpp): format 0 float32,
// 1 bf16, 2 int8 (per 16 columns x 32 k scales); returns (data, scales).
std::tuple<at::Tensor, at::Tensor> pack_weight_f32(at::Tensor w, int64_t format, bool interleave_halves);
// x [M, K] float32 -> the values the int8 GEMM multiplies: each row quantized per group of 32
// (q8_gemm.h) and dequantized (the torch paths of an int8 model feed their GEMMs these).
at::Tensor quantize_activations_q8(at::Tensor x);
at::Tensor linear_packed_f32(at::Tensor x, at::Tensor data, at::Tensor scales, int64_t format, int64_t N,
                             c10::optional<at::Tensor> bias, c10::optional<at::Tensor> argmax_out);
// y = x @ W^T (+ bias) on a GGUF weight's blocks as stored ([N, K / block * block bytes] uint8),
// ggml `type` F32/F16/BF16/Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q2_K/Q3_K/Q4_K/Q5_K/Q6_K/IQ4_NL/IQ4_XS (gguf/linear.cpp).
// packed: gguf_repack's copy of a Q3_K / Q4_K / Q5_K / Q6_K weight (8 columns interleaved), used for the whole octets.
at::Tensor gguf_linear(at::Tensor x, at::Tensor blocks, int64_t type, int64_t N, int64_t K,
                       c10::optional<at::Tensor> bias, c10::optional<at::Tensor> packed);
// Several GGUF weights of the same input (each its own type, N, bias, packed) in one call: their
// outputs side by side, [M, sum N]; the activations quantized once, one parallel region.
at::Tensor gguf_linear_many(at::Tensor x, const std::vector<at::Tensor>& blocks, const std::vector<int64_t>& types,
                            const std::vector<int64_t>& Ns, int64_t K,
                            const std::vector<c10::optional<at::Tensor>>& biases,
                            const std::vector<c10::optional<at::Tensor>>& packed);
// A Q3_K, Q4_K, Q5_K or Q6_K weight's whole octets of columns repacked losslessly with 8 columns
// interleaved ([N / 8, K / 256 * 928, 1152, 1408 or 1696] uint8, gguf/q3k_x8.h .. q6k_x8.h).
at::Tensor gguf_repack(at::Tensor blocks, int64_t type, int64_t N, int64_t K);
namespace avx2 { struct PackedWeight; }
// A view of pack_weight_f32's output for the GEMM (checks shapes against format and N).
avx2::PackedWeight packed_view(const at::Tensor& data, const at::Tensor& scales, int64_t format, int64_t N);
// Rows `ids` ([T] int64) of a Q4_K, Q6_K or Q8_0 weight's blocks ([N, K / block * block bytes] uint8)
// as float32 [T, K]: gguf-py's dequantized values bit for bit (gguf/embedding.cpp).
at::Tensor gguf_embedding(at::Tensor blocks, int64_t type, at::Tensor ids, int64_t K);
// torch.argmax of one float32 row of n > 0 values (argmax.cpp).
int64_t argmax_row(const float* x, int64_t n);

}  // namespace cadence_kernels
