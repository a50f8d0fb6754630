// DecodeStackF32 (see decode_stack_f32.h): the whole decoder for a small float32 batch in one
// parallel region. Phases of a layer, with a team barrier after each one the next reads across
// threads (as the bf16 stack, decode_stack.cpp):
//   1. qkv = normed @ Wqkv (+ bias)            column blocks split over threads
//   2. (q/k norms,) rope q, k; store k, v       rows split over threads
//   3. attention partials; then their merge     (row, span) items, taken dynamically
//   4. o = attn @ Wo                            column blocks
//   5. residual += o; normed = norm(residual)   every thread on its own copy (no barrier)
//   6. gate/up, then silu * up                  gate/up block pairs (packed interleaved)
//   7. d = act @ Wdown                          column blocks
//   8. residual += d; normed = norm(residual)   every thread on its own copy
// and after the last layer, with an attached head and `logits`:
//   9. logits = normed @ Whead^T                column blocks; each row's argmax: per-thread
//                                               trackers, merged by thread 0
#include "decode_stack_f32.h"

#include <memory>

#include "../common.h"
#include "../ops.h"
#include "../rows.h"
#include "../stack_phases.h"
#include "../team.h"
#include "attention_f32.h"
#include "packed_gemm_f32.h"
#include "stack_attention_f32.h"

namespace cadence_kernels {

namespace {

at::Tensor float_vector(const at::Tensor& t, int64_t n, const char* name) {
  TORCH_CHECK(t.numel() == n, "DecodeStackF32: ", name, " must have ", n, " elements");
  return t.to(at::kFloat).contiguous();
}

}  // namespace

DecodeStackF32::DecodeStackF32(const std::vector<at::Tensor>& qkv, const std::vector<at::Tensor>& qkv_bias,
                               const std::vector<at::Tensor>& o, const std::vector<at::Tensor>& gate_up,
                               const std::vector<at::Tensor>& down, const std::vector<at::Tensor>& input_norm,
                               const std::vector<at::Tensor>& post_norm, at::Tensor final_norm, int64_t num_heads,
                               int64_t num_kv_heads, double eps, int64_t format)
    : heads_(num_heads), kv_heads_(num_kv_heads), format_(format), eps_(eps) {
#if CADENCE_HAVE_AVX2
  const size_t L = qkv.size();
  TORCH_CHECK(L > 0 && o.size() == L && gate_up.size() == L && down.size() == L && input_norm.size() == L &&
                  post_norm.size() == L && (qkv_bias.empty() || qkv_bias.size() == L),
              "DecodeStackF32: one weight of each kind per layer");
  hidden_ = final_norm.numel();
  final_norm_ = float_vector(final_norm, hidden_, "final_norm");
  TORCH_CHECK(num_heads > 0 && num_kv_heads > 0 && num_heads % num_kv_heads == 0,
              "DecodeStackF32: num_heads must be a multiple of num_kv_heads");
  TORCH_CHECK(o[0].dim() == 2 && o[0].size(1) % num_heads == 0, "DecodeStackF32: o [H, Hq*D]");
  head_dim_ = o[0].size(1) / num_heads;
  TORCH_CHECK(head_dim_ == 64 || head_dim_ == 128, "DecodeStackF32: head_dim 64 or 128 only, got ", head_dim_);
  intermediate_ = down[0].size(1);
  TORCH_CHECK(intermediate_ % 32 == 0, "DecodeStackF32: intermediate size must be a multiple of 32");
  const int64_t qkv_rows = (num_heads + 2 * num_kv_heads) * head_dim_;
  auto pack = [&](const at::Tensor& w, int64_t rows, int64_t cols, bool interleave, const char* name) {
    TORCH_CHECK(w.dim() == 2 && w.size(0) == rows && w.size(1) == cols, "DecodeStackF32: ", name, " must be [",
                rows, ", ", cols, "]");
    auto [data, scales] = pack_weight_f32(w, format, interleave);
    return Packed{data, scales};
  };
  for (size_t l = 0; l < L; ++l) {
    Layer layer;
    layer.input_norm = float_vector(input_norm[l], hidden_, "input_norm");
    layer.post_norm = float_vector(post_norm[l], hidden_, "post_norm");
    layer.qkv = pack(qkv[l], qkv_rows, hidden_, false, "qkv");
    if (!qkv_bias.empty() && qkv_bias[l].defined() && qkv_bias[l].numel() > 0)
      layer.qkv_bias = float_vector(qkv_bias[l], qkv_rows, "qkv bias");
    layer.o = pack(o[l], hidden_, num_heads * head_dim_, false, "o");
    layer.gate_up = pack(gate_up[l], 2 * intermediate_, hidden_, true, "gate_up");
    layer.down = pack(down[l], hidden_, intermediate_, false, "down");
    layers_.push_back(std::move(layer));
  }
#else
  TORCH_CHECK(false, "DecodeStackF32: built without AVX2/FMA");
#endif
}

void DecodeStackF32::attach_head(const at::Tensor& data, const at::Tensor& scales, int64_t format, int64_t N) {
  TORCH_CHECK(!layers_.empty(), "DecodeStackF32: attach_head after construction");
  const avx2::PackedWeight view = packed_view(data, scales, format, N);  // checks the packing
  TORCH_CHECK(view.K == hidden_, "DecodeStackF32: the head's K is ", view.K, ", the hidden size ", hidden_);
  head_ = Packed{data, scales};
  head_N_ = N;
  head_format_ = format;
}

void DecodeStackF32::attach_qk_norms(const std::vector<at::Tensor>& q_norm, const std::vector<at::Tensor>& k_norm) {
  attach_qk_norm_weights(layers_, q_norm, k_norm, head_dim_, at::kFloat, "DecodeStackF32");
}

int64_t DecodeStackF32::weight_bytes() const {
  int64_t total = 0;
  for (const Layer& l : layers_)
    for (const Packed* p : {&l.qkv, &l.o, &l.gate_up, &l.down}) total += p->data.numel() + p->scales.numel() * p->scales.element_size();
  return total;
}

at::Tensor DecodeStackF32::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor kv,
                                   const at::Tensor& slots, const at::Tensor& block_tables, const at::Tensor& row_seq,
                                   const at::Tensor& ctx_lens, double scale, const c10::optional<at::Tensor>& logits,
                                   const c10::optional<at::Tensor>& argmax) const {
#if CADENCE_HAVE_AVX2
  const HeadOutputs head("DecodeStackF32", logits, argmax, x.dim() == 2 ? x.size(0) : 0, head_N_);
  float* lp = head.logits;
  int64_t* ap = head.argmax;
  // The KV cache's storage type: float32, or float16 / bf16 (half the bytes attention streams).
  switch (kv.scalar_type()) {
    case at::kHalf:
      return forward_kv<c10::Half>(x, cos, sin, kv, slots, block_tables, row_seq, ctx_lens, scale, lp, ap);
    case at::kBFloat16:
      return forward_kv<c10::BFloat16>(x, cos, sin, kv, slots, block_tables, row_seq, ctx_lens, scale, lp, ap);
    default: return forward_kv<float>(x, cos, sin, kv, slots, block_tables, row_seq, ctx_lens, scale, lp, ap);
  }
#else
  TORCH_CHECK(false, "DecodeStackF32: built without AVX2/FMA");
  return x;
#endif
}

#if CADENCE_HAVE_AVX2  // forward_kv is instantiated by forward's AVX2 branch only
template <typename KV>
at::Tensor DecodeStackF32::forward_kv(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor kv,
                                      const at::Tensor& slots, const at::Tensor& block_tables, const at::Tensor& row_seq,
                                      const at::Tensor& ctx_lens, double scale, float* logits,
                                      int64_t* argmax) const {
  const int64_t H = hidden_, Hq = heads_, Hkv = kv_heads_, D = head_dim_;
  const int64_t I = intermediate_, L = num_layers();
  const StepRows rows("DecodeStackF32", x, at::kFloat, H, cos, sin, kv, L, Hkv, D, slots, block_tables, row_seq, ctx_lens);
  const int64_t T = rows.T;
  KV* kvp = kv.data_ptr<KV>();

  // Attention items (row, span) and their partials.
  avx2::SpanItems plan(rows.lenp, rows.seqp, T, Hq, D);

  StepActivations<float> buf(T, H, Hq, Hkv, D, I);
  auto out = at::empty({T, H}, x.options());

  auto team = step_team(at::get_num_threads());
  const avx2::LayerItemCounters next_item(L);
  const float fscale = static_cast<float>(scale);
  const float eps = static_cast<float>(eps_);
  // The head's argmax trackers: [team][T], each thread's over its column blocks (as
  // linear_packed_f32 keeps them per thread).
  std::vector<avx2::LaneArgmax8> trackers(argmax != nullptr ? team.size() * T : 0);

  team.run([&](StepThread<NUM_PHASES>& thread) {
    const avx2::FlushDenormals ftz;
    std::vector<float> residual(T * H), normed(T * H), scores(Hq * avx2::ATTN_SPAN);
    std::memcpy(residual.data(), x.data_ptr<float>(), sizeof(float) * T * H);
    add_norm_rows<float>(residual.data(), nullptr, layers_[0].input_norm.data_ptr<float>(), normed.data(), T, H, eps);
    auto gemm = [&](const float* in, const Packed& w, int64_t N, const float* bias, float* dst) {
      const avx2::PackedWeight pw = packed_view(w.data, w.scales, format_, N);
      const auto [b0, b1] = thread.share(avx2::packed_blocks(N));
      avx2::gemm_blocks(in, pw.K, T, pw, b0, b1,
                        [&](int64_t m0, int mr, int64_t bb, int nb, __m256 acc[avx2::MAX_MR][2 * avx2::MAX_NB]) {
                          avx2::store_tile(acc, m0, mr, bb, nb, N, bias, dst, N);
                        });
    };
    for (int64_t l = 0; l < L; ++l) {
      const Layer& w = layers_[l];
      KV* kc = kvp + l * rows.layer_stride;
      KV* vc = kc + rows.layer_stride / 2;
      // 1. qkv projection.
      gemm(normed.data(), w.qkv, buf.qkv_width, w.qkv_bias.defined() ? w.qkv_bias.data_ptr<float>() : nullptr,
           buf.qkv.data());
      thread.sync();
      thread.lap(0);
      // 2. (q/k norms,) rope + cache write.
      const auto [r0, r1] = thread.share(T);
      rope_write_rows<float, KV>(buf.qkv.data(), r0, r1, rows, rows.cp, rows.sp,
                                 w.q_norm.defined() ? w.q_norm.data_ptr<float>() : nullptr,
                                 w.k_norm.defined() ? w.k_norm.data_ptr<float>() : nullptr, Hq, Hkv, D, eps, kc, vc);
      thread.sync();
      thread.lap(1);
      // 3. attention partials, then the merge of each (row, head)'s spans.
      avx2::attention_phase_f32<KV>(thread, plan, next_item[l], buf.qkv.data(), Hq, Hkv, D, kc, vc, rows, fscale,
                                    scores, buf.attn.data());
      thread.lap(2);
      // 4. output projection; 5. residual + post-attention norm (own copy).
      gemm(buf.attn.data(), w.o, H, nullptr, buf.o.data());
      thread.sync();
      thread.lap(3);
      add_norm_rows<float>(residual.data(), buf.o.data(), w.post_norm.data_ptr<float>(), normed.data(), T, H, eps);
      thread.lap(4);
      // 6. gate/up over this thread's block pairs, then silu * up over the same columns.
      {
        const avx2::PackedWeight pw = packed_view(w.gate_up.data, w.gate_up.scales, format_, 2 * I);
        const auto [p0, p1] = thread.share(avx2::packed_blocks(2 * I) / 2);
        avx2::gemm_blocks(normed.data(), H, T, pw, 2 * p0, 2 * p1,
                          [&](int64_t m0, int mr, int64_t bb, int nb, __m256 acc[avx2::MAX_MR][2 * avx2::MAX_NB]) {
                            avx2::store_tile(acc, m0, mr, bb, nb, 2 * I, nullptr, buf.gate_up.data(), 2 * I);
                          });
        constexpr int64_t C = avx2::PACK_COLS;
        for (int64_t t = 0; t < T; ++t)
          for (int64_t j = p0; j < p1; ++j)
            silu_mul_row<float>(buf.gate_up.data() + t * 2 * I + j * 2 * C, buf.gate_up.data() + t * 2 * I + j * 2 * C + C,
                                buf.act.data() + t * I + j * C, C);
      }
      thread.sync();
      thread.lap(5);
      // 7. down projection; 8. residual + next layer's input norm (or the final norm).
      gemm(buf.act.data(), w.down, H, nullptr, buf.down.data());
      thread.sync();
      thread.lap(6);
      const at::Tensor& next_norm = l + 1 < L ? layers_[l + 1].input_norm : final_norm_;
      add_norm_rows<float>(residual.data(), buf.down.data(), next_norm.data_ptr<float>(), normed.data(), T, H, eps);
      thread.lap(7);
    }
    if (logits != nullptr) {
      // 9. The LM head over this thread's column blocks of every final-norm row (each thread has
      // the same bits of them), the argmax trackers fed from the stored tiles as in
      // linear_packed_f32; thread 0 merges them once every column is written.
      const avx2::PackedWeight pw = packed_view(head_.data, head_.scales, head_format_, head_N_);
      const auto [b0, b1] = thread.share(avx2::packed_blocks(head_N_));
      avx2::LaneArgmax8* mine = argmax != nullptr ? trackers.data() + thread.tid * T : nullptr;
      avx2::gemm_blocks(normed.data(), H, T, pw, b0, b1,
                        [&](int64_t m0, int mr, int64_t bb, int nb, __m256 acc[avx2::MAX_MR][2 * avx2::MAX_NB]) {
                          avx2::for_tile_pieces(acc, m0, mr, bb, nb, head_N_, nullptr,
                                                [&](int64_t row, int64_t col, int64_t n, __m256 v) {
                                                  avx2::store_n(logits + row * head_N_ + col, v, n);
                                                  if (mine != nullptr) mine[row].update(v, col, n);
                                                });
                        });
      thread.sync();
      if (argmax != nullptr && thread.tid == 0) {
        for (int64_t t = 0; t < T; ++t) {
          argmax[t] = avx2::lane_argmax_merge(trackers.data() + t, thread.nth, T);
          if (argmax[t] < 0) argmax[t] = argmax_row(logits + t * head_N_, head_N_);  // saw a NaN
        }
      }
      thread.lap(8);
    }
    if (thread.tid == 0) std::memcpy(out.data_ptr<float>(), normed.data(), sizeof(float) * T * H);
  });
  return out;
}
#endif  // CADENCE_HAVE_AVX2

std::vector<at::Tensor> DecodeStackF32::packed_layer(int64_t l) const {
  TORCH_CHECK(l >= 0 && l < num_layers(), "DecodeStackF32.packed_layer: no layer ", l);
  const Layer& w = layers_[l];
  return {w.qkv.data, w.qkv.scales, w.o.data, w.o.scales, w.gate_up.data, w.gate_up.scales, w.down.data, w.down.scales};
}

}  // namespace cadence_kernels
