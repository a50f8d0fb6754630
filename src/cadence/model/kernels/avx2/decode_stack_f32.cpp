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
#include "decode_stack_f32.h"

#include <omp.h>

#include <memory>

#include "../common.h"
#include "../ops.h"
#include "../rows.h"
#include "../team.h"
#include "attention_f32.h"
#include "packed_gemm_f32.h"

namespace cadence_kernels {

namespace {

std::pair<int64_t, int64_t> share(int64_t total, int tid, int team) {
  return {total * tid / team, total * (tid + 1) / team};
}

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
    layer.qkv = pack(qkv[l], qkv_rows, hidden_, false, "qkv");
    if (!qkv_bias.empty() && qkv_bias[l].defined() && qkv_bias[l].numel() > 0)
      layer.qkv_bias = float_vector(qkv_bias[l], qkv_rows, "qkv bias");
    layer.o = pack(o[l], hidden_, num_heads * head_dim_, false, "o");
    layer.gate_up = pack(gate_up[l], 2 * intermediate_, hidden_, true, "gate_up");
    layer.down = pack(down[l], hidden_, intermediate_, false, "down");
    layer.input_norm = float_vector(input_norm[l], hidden_, "input_norm");
    layer.post_norm = float_vector(post_norm[l], hidden_, "post_norm");
    layers_.push_back(std::move(layer));
  }
#else
  TORCH_CHECK(false, "DecodeStackF32: built without AVX2/FMA");
#endif
}

void DecodeStackF32::attach_qk_norms(const std::vector<at::Tensor>& q_norm, const std::vector<at::Tensor>& k_norm) {
  TORCH_CHECK(q_norm.size() == layers_.size() && k_norm.size() == layers_.size(),
              "DecodeStackF32: one q_norm and one k_norm per layer");
  for (size_t l = 0; l < layers_.size(); ++l) {
    layers_[l].q_norm = float_vector(q_norm[l], head_dim_, "q_norm");
    layers_[l].k_norm = float_vector(k_norm[l], head_dim_, "k_norm");
  }
}

int64_t DecodeStackF32::weight_bytes() const {
  int64_t total = 0;
  for (const Layer& l : layers_)
    for (const Packed* p : {&l.qkv, &l.o, &l.gate_up, &l.down}) total += p->data.numel() + p->scales.numel() * p->scales.element_size();
  return total;
}

at::Tensor DecodeStackF32::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor kv,
                                   const at::Tensor& slots, const at::Tensor& block_tables, const at::Tensor& row_seq,
                                   const at::Tensor& ctx_lens, double scale) const {
#if CADENCE_HAVE_AVX2
  // The KV cache's storage type: float32, or float16 / bf16 (half the bytes attention streams).
  switch (kv.scalar_type()) {
    case at::kHalf: return forward_kv<c10::Half>(x, cos, sin, kv, slots, block_tables, row_seq, ctx_lens, scale);
    case at::kBFloat16:
      return forward_kv<c10::BFloat16>(x, cos, sin, kv, slots, block_tables, row_seq, ctx_lens, scale);
    default: return forward_kv<float>(x, cos, sin, kv, slots, block_tables, row_seq, ctx_lens, scale);
  }
#else
  TORCH_CHECK(false, "DecodeStackF32: built without AVX2/FMA");
  return x;
#endif
}

template <typename KV>
at::Tensor DecodeStackF32::forward_kv(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor kv,
                                      const at::Tensor& slots, const at::Tensor& block_tables, const at::Tensor& row_seq,
                                      const at::Tensor& ctx_lens, double scale) const {
#if CADENCE_HAVE_AVX2
  const int64_t T = x.size(0), H = hidden_, Hq = heads_, Hkv = kv_heads_, D = head_dim_;
  const int64_t I = intermediate_, L = num_layers(), G = Hq / Hkv;
  const int64_t qkv_width = (Hq + 2 * Hkv) * D;
  check_cpu_contiguous(x, "x");
  check_cpu_contiguous(kv, "kv");
  check_cpu_contiguous(block_tables, "block_tables");
  TORCH_CHECK(x.scalar_type() == at::kFloat && x.dim() == 2 && x.size(1) == H, "DecodeStackF32: x [T, H] float32");
  TORCH_CHECK(kv.dim() == 6 && kv.size(0) == L && kv.size(1) == 2 && kv.size(4) == Hkv && kv.size(5) == D,
              "DecodeStackF32: kv [layers, 2, blocks, block_size, Hkv, D] float32, float16 or bfloat16");
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat && cos.size(0) == T &&
                  cos.size(1) == D && sin.sizes() == cos.sizes(),
              "DecodeStackF32: cos, sin [T, D] float32");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt, "DecodeStackF32: block_tables int32");
  auto c = cos.contiguous(), s = sin.contiguous();
  auto sl = slots.to(at::kLong).contiguous();
  auto seq = row_seq.to(at::kLong).contiguous();
  auto lens = ctx_lens.to(at::kLong).contiguous();
  TORCH_CHECK(sl.numel() == T && seq.numel() == T && lens.numel() == T,
              "DecodeStackF32: one slot, row_seq and ctx_len per row");
  const int64_t blocks = kv.size(2), block_size = kv.size(3), max_blocks = block_tables.size(1);
  const int64_t* slp = sl.data_ptr<int64_t>();
  const int64_t* seqp = seq.data_ptr<int64_t>();
  const int64_t* lenp = lens.data_ptr<int64_t>();
  const int32_t* btp = block_tables.data_ptr<int32_t>();
  check_step_rows("DecodeStackF32", T, slp, seqp, lenp, btp, block_tables.size(0), max_blocks, blocks, block_size);
  const int64_t layer_stride = 2 * blocks * block_size * Hkv * D;
  KV* kvp = kv.data_ptr<KV>();
  const float* cp = c.data_ptr<float>();
  const float* sp = s.data_ptr<float>();

  // Attention items (row, span) and their partials.
  avx2::SpanItems plan(lenp, seqp, T, Hq, D);
  const int64_t items = plan.items();

  std::vector<float> qkv_buf(T * qkv_width), attn_buf(T * Hq * D), o_buf(T * H), act_buf(T * I), down_buf(T * H),
      gate_up_buf(T * 2 * I);
  auto out = at::empty({T, H}, x.options());

  const int team = solo_.team_for_step(std::max(1, at::get_num_threads()));
  std::atomic<bool> lost_core{false};
  std::unique_ptr<std::atomic<int64_t>[]> next_item(new std::atomic<int64_t>[L]);
  for (int64_t l = 0; l < L; ++l) next_item[l].store(0, std::memory_order_relaxed);
  const float fscale = static_cast<float>(scale);
  const float eps = static_cast<float>(eps_);
  TeamBarrier barrier(team);
  std::atomic<int> actual_team{0};

#pragma omp parallel num_threads(team)
  {
    if (omp_get_thread_num() == 0) actual_team.store(omp_get_num_threads());
#pragma omp barrier
    const bool full_team = actual_team.load() == team;
    const int tid = full_team ? omp_get_thread_num() : 0;
    const int nth = full_team ? team : 1;
    if (full_team || omp_get_thread_num() == 0) {
      const avx2::FlushDenormals ftz;
      const ThreadClock clock;
      std::array<int64_t, NUM_PHASES> phase_ns{};
      auto mark = std::chrono::steady_clock::now();
      auto lap = [&](int phase) {
        if (tid != 0) return;
        const auto now = std::chrono::steady_clock::now();
        phase_ns[phase] += std::chrono::duration_cast<std::chrono::nanoseconds>(now - mark).count();
        mark = now;
      };
      auto sync = [&]() {
        if (full_team && team > 1) barrier.wait();
      };
      std::vector<float> residual(T * H), normed(T * H), scores(Hq * avx2::ATTN_SPAN);
      std::memcpy(residual.data(), x.data_ptr<float>(), sizeof(float) * T * H);
      for (int64_t t = 0; t < T; ++t)
        rms_norm_row<float>(residual.data() + t * H, nullptr, layers_[0].input_norm.data_ptr<float>(),
                            normed.data() + t * H, H, eps);
      auto gemm = [&](const float* in, const Packed& w, int64_t N, const float* bias, float* dst) {
        const avx2::PackedWeight pw = packed_view(w.data, w.scales, format_, N);
        const auto [b0, b1] = share(avx2::packed_blocks(N), tid, nth);
        avx2::gemm_blocks(in, pw.K, T, pw, b0, b1,
                          [&](int64_t m0, int mr, int64_t bb, int nb, __m256 acc[avx2::MAX_MR][2 * avx2::MAX_NB]) {
                            avx2::store_tile(acc, m0, mr, bb, nb, N, bias, dst, N);
                          });
      };
      for (int64_t l = 0; l < L; ++l) {
        const Layer& w = layers_[l];
        KV* kc = kvp + l * layer_stride;
        KV* vc = kc + layer_stride / 2;
        // 1. qkv projection.
        gemm(normed.data(), w.qkv, qkv_width, w.qkv_bias.defined() ? w.qkv_bias.data_ptr<float>() : nullptr,
             qkv_buf.data());
        sync();
        lap(0);
        // 2. (q/k norms,) rope + cache write: rope_write_kv's row functions.
        {
          const auto [r0, r1] = share(T, tid, nth);
          for (int64_t t = r0; t < r1; ++t) {
            if (w.q_norm.defined())
              qk_norm_row<float>(qkv_buf.data() + t * qkv_width, w.q_norm.data_ptr<float>(),
                                 w.k_norm.data_ptr<float>(), Hq, Hkv, D, eps);
            rope_write_row<float, KV>(qkv_buf.data() + t * qkv_width, cp + t * D, sp + t * D, Hq, Hkv, D,
                                      kc + slp[t] * Hkv * D, vc + slp[t] * Hkv * D);
          }
        }
        sync();
        lap(1);
        // 3. attention partials, then the merge of each (row, head)'s spans.
        for (int64_t i = next_item[l].fetch_add(1); i < items; i = next_item[l].fetch_add(1)) {
          const int64_t t = plan.row[i];
          const auto [p0, p1] = plan.positions(i, lenp[t]);
          const float* q = qkv_buf.data() + t * qkv_width;
          const int32_t* table = btp + seqp[t] * max_blocks;
          if (D == 64)
            avx2::attend_span_f32<64, KV>(q, G, Hkv, kc, vc, table, block_size, p0, p1, fscale, scores.data(),
                                      plan.max_of(i), plan.sum_of(i), plan.acc_of(i), plan.copy[t]);
          else
            avx2::attend_span_f32<128, KV>(q, G, Hkv, kc, vc, table, block_size, p0, p1, fscale, scores.data(),
                                       plan.max_of(i), plan.sum_of(i), plan.acc_of(i), plan.copy[t]);
        }
        sync();
        {
          const auto [h0, h1] = share(T * Hq, tid, nth);
          std::vector<float> mx, sm;
          for (int64_t th = h0; th < h1; ++th)
            avx2::merge_row_head(plan, th / Hq, th % Hq, mx, sm, attn_buf.data() + th * D);
        }
        sync();
        lap(2);
        // 4. output projection; 5. residual + post-attention norm (own copy).
        gemm(attn_buf.data(), w.o, H, nullptr, o_buf.data());
        sync();
        lap(3);
        for (int64_t t = 0; t < T; ++t)
          rms_norm_row<float>(residual.data() + t * H, o_buf.data() + t * H, w.post_norm.data_ptr<float>(),
                              normed.data() + t * H, H, eps);
        lap(4);
        // 6. gate/up over this thread's block pairs, then silu * up over the same columns.
        {
          const avx2::PackedWeight pw = packed_view(w.gate_up.data, w.gate_up.scales, format_, 2 * I);
          const auto [p0, p1] = share(avx2::packed_blocks(2 * I) / 2, tid, nth);
          avx2::gemm_blocks(normed.data(), H, T, pw, 2 * p0, 2 * p1,
                            [&](int64_t m0, int mr, int64_t bb, int nb, __m256 acc[avx2::MAX_MR][2 * avx2::MAX_NB]) {
                              avx2::store_tile(acc, m0, mr, bb, nb, 2 * I, nullptr, gate_up_buf.data(), 2 * I);
                            });
          constexpr int64_t C = avx2::PACK_COLS;
          for (int64_t t = 0; t < T; ++t)
            for (int64_t j = p0; j < p1; ++j)
              silu_mul_row<float>(gate_up_buf.data() + t * 2 * I + j * 2 * C, gate_up_buf.data() + t * 2 * I + j * 2 * C + C,
                                  act_buf.data() + t * I + j * C, C);
        }
        sync();
        lap(5);
        // 7. down projection; 8. residual + next layer's input norm (or the final norm).
        gemm(act_buf.data(), w.down, H, nullptr, down_buf.data());
        sync();
        lap(6);
        const at::Tensor& next_norm = l + 1 < L ? layers_[l + 1].input_norm : final_norm_;
        for (int64_t t = 0; t < T; ++t)
          rms_norm_row<float>(residual.data() + t * H, down_buf.data() + t * H, next_norm.data_ptr<float>(),
                              normed.data() + t * H, H, eps);
        lap(7);
      }
      if (tid == 0) std::memcpy(out.data_ptr<float>(), normed.data(), sizeof(float) * T * H);
      if (team > 1 && clock.descheduled(0.75)) lost_core.store(true, std::memory_order_relaxed);
      if (tid == 0) {
        stats_.record(phase_ns, nth);
      }
    }
  }
  solo_.after_step(team, lost_core.load());
  return out;
#else
  TORCH_CHECK(false, "DecodeStackF32: built without AVX2/FMA");
  return x;
#endif
}

std::vector<double> DecodeStackF32::phase_seconds() const { return stats_.phase_seconds(); }

int DecodeStackF32::last_team() const { return stats_.last_team(); }

std::vector<at::Tensor> DecodeStackF32::packed_layer(int64_t l) const {
  TORCH_CHECK(l >= 0 && l < num_layers(), "DecodeStackF32.packed_layer: no layer ", l);
  const Layer& w = layers_[l];
  return {w.qkv.data, w.qkv.scales, w.o.data, w.o.scales, w.gate_up.data, w.gate_up.scales, w.down.data, w.down.scales};
}

}  // namespace cadence_kernels
