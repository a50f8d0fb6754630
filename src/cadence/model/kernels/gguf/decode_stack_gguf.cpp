// DecodeStackGGUF (see decode_stack_gguf.h): the whole decoder of a GGUF-native model for a small
// float32 batch in one parallel region, phase for phase as DecodeStackF32 (a team barrier after
// each phase whose output the next one reads across threads):
// The GEMV phases (1, 4, 6, 7, 9) split their bytes by the team's ThreadSplit (team.h): parts
// fitted to the rates the threads streamed at in earlier steps, equal at first.
//   1. qkv = normed @ [Wq | Wk | Wv] (+ bias)   8-column groups split over threads by bytes
//   2. (q/k norms,) rope q, k in place; store k, v in cache   rows split over threads
//   3. attention partials; then their merge      (row, span) items, taken dynamically
//   4. o = attn @ Wo                             groups by bytes
//   5. residual += o; normed = norm(residual)    every thread on its own copy (no barrier)
//   6. gate, up, then silu(gate) * up            16-column units of both, by bytes
//   7. d = act @ Wdown                           groups by bytes
//   8. residual += d; normed = norm(residual)    every thread on its own copy
// Gemma's layers (set after construction): sandwich norms (5 and 8 norm o and d first, on every
// thread's own copy, as the per-op path's rms_norm then add_rms_norm), gelu_tanh for silu,
// sliding-window layers (their own span plan) on their own rope table.
//   9. (with a head and `logits`) logits = normed @ Whead^T, groups by bytes; then each thread's
//      1 / nth of every row's argmax, merged by thread 0
// Each thread quantizes a GEMM's input rows itself (its own copy, as it norms its own copy of the
// residual): a row of 2048-8192 k takes 1-4 us, less than a barrier would cost.
#include "decode_stack_gguf.h"

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "../avx2/attention_f32.h"
#include "../avx2/stack_attention_f32.h"
#include "../common.h"
#include "../ops.h"
#include "../rows.h"
#include "../stack_phases.h"
#include "../team.h"
#include "blocks.h"
#include "gemm.h"
#include "quantize.h"

namespace cadence_kernels {

namespace {

using Matrix = DecodeStackGGUF::Matrix;

constexpr int64_t COLS = 8;        // columns per unit of a GEMM's thread split (linear.cpp's)
constexpr int64_t PAIR_COLS = 16;  // gate/up: whole 16-lane vectors of silu_mul_row per thread
// The GEMV phases (qkv, o, gate_up, down, head), split by the stack's fitted ThreadSplit.
constexpr uint32_t BALANCED_PHASES = 1u << 0 | 1u << 3 | 1u << 5 | 1u << 6 | 1u << 8;

bool is_float_type(int type) { return type == gguf::F32 || type == gguf::F16 || type == gguf::BF16; }

at::Tensor float_vector(const at::Tensor& t, int64_t n, const char* name) {
  TORCH_CHECK(t.numel() == n, "DecodeStackGGUF: ", name, " must have ", n, " elements");
  return t.to(at::kFloat).contiguous();
}

Matrix matrix(const at::Tensor& blocks, int64_t type, const c10::optional<at::Tensor>& packed,
              const c10::optional<at::Tensor>& bias, int64_t N, int64_t K, const char* name) {
  const gguf::BlockSize size = gguf::block_size(static_cast<int>(type));
  TORCH_CHECK(size.elements > 0, "DecodeStackGGUF: ", name, ": unsupported ggml type ", type);
  TORCH_CHECK(K > 0 && N > 0 && K % size.elements == 0, "DecodeStackGGUF: ", name,
              ": K = ", K, " is not a multiple of the type's blocks");
  Matrix m;
  m.type = static_cast<int>(type);
  m.N = N;
  m.K = K;
  m.row_bytes = K / size.elements * size.bytes;
  const bool has_packed = packed.has_value() && packed->defined();
  TORCH_CHECK(blocks.device().is_cpu() && blocks.is_contiguous() && blocks.scalar_type() == at::kByte &&
                  (blocks.numel() == N * m.row_bytes || (blocks.numel() == 0 && has_packed && N % 8 == 0)),
              "DecodeStackGGUF: ", name, ": blocks must be contiguous uint8 of ", N, " x ", m.row_bytes, " bytes");
  if (has_packed) {
    const int64_t octet_block = gguf::x8_block_bytes(m.type);
    TORCH_CHECK(octet_block > 0 && packed->is_contiguous() && packed->scalar_type() == at::kByte &&
                    packed->numel() == N / 8 * (K / 256 * octet_block),
                "DecodeStackGGUF: ", name, ": packed must be gguf_repack's output for this weight");
    m.packed = *packed;
  }
  if (bias.has_value() && bias->defined()) m.bias = float_vector(*bias, N, "bias");
  m.blocks = blocks;
  return m;
}

#if CADENCE_HAVE_AVX2

// One GEMM input [T, K] in the forms its weights read (linear.cpp's, computed the same way):
// quantized per 32 and/or per 256 k, the per-16-k byte sums of repacked Q6_K and Q2_K, bf16-rounded.
struct Activations {
  avx2::QuantizedRows q32, q256;
  std::vector<int32_t> half_sums;
  std::vector<uint16_t> bf16;

  void prepare(const float* x, int64_t T, int64_t K, std::initializer_list<const Matrix*> weights) {
    bool need_32 = false, need_256 = false, need_half_sums = false, need_bf16 = false;
    for (const Matrix* w : weights) {
      if (is_float_type(w->type)) {
        need_bf16 |= w->type == gguf::BF16;
      } else if (gguf::shares_scale_per_256(w->type)) {
        need_256 = true;
        need_half_sums |= gguf::reads_half_sums(w->type, w->packed.defined());
      } else {
        need_32 = true;
      }
    }
    if (need_32) quantize(x, T, K, false, q32);
    if (need_256) quantize(x, T, K, true, q256);
    if (need_half_sums) {
      half_sums.resize(static_cast<size_t>(T * (K / 16)));
      gguf::byte_sums_per_16(q256, 0, T * (K / 16), half_sums.data());
    }
#if defined(__AVX512BF16__) && defined(__AVX512F__)
    if (need_bf16) {
      bf16.resize(static_cast<size_t>(T * K));
      for (int64_t i = 0; i < T * K; ++i) bf16[i] = c10::BFloat16(x[i]).x;  // round to nearest even
    }
#endif
  }

  static void quantize(const float* x, int64_t T, int64_t K, bool per_256, avx2::QuantizedRows& out) {
    const int64_t groups = K / avx2::Q8_GROUP;
    out.K = K;
    out.q.resize(static_cast<size_t>(T * K));
    out.mag.resize(static_cast<size_t>(T * K));
    out.scale.resize(static_cast<size_t>(T * groups));
    out.sum.resize(static_cast<size_t>(T * groups));
    if (per_256) out.group_sum.resize(static_cast<size_t>(T * groups));
    for (int64_t m = 0; m < T; ++m) {
      if (per_256)
        gguf::quantize_row_q8_per_256(x + m * K, K, out.q.data() + m * K, out.mag.data() + m * K,
                                      out.scale.data() + m * groups, out.sum.data() + m * groups,
                                      out.group_sum.data() + m * groups);
      else
        avx2::quantize_row_q8(x + m * K, K, out.q.data() + m * K, out.mag.data() + m * K,
                              out.scale.data() + m * groups, out.sum.data() + m * groups);
    }
  }

  // The GEMM arguments of weight w on these activations (x: the float rows), writing its
  // column 0 at out with row stride ldo.
  gguf::GemmArgs args(const Matrix& w, const float* x, int64_t T, float* out, int64_t ldo) const {
    gguf::GemmArgs g{w.type, w.blocks.data_ptr<uint8_t>(), w.row_bytes, w.N, w.K, T, ldo, x,
                     bf16.empty() ? nullptr : bf16.data(),
                     is_float_type(w.type) ? nullptr : (gguf::shares_scale_per_256(w.type) ? &q256 : &q32), out};
    g.half_sums = half_sums.empty() ? nullptr : half_sums.data();
    return g;
  }
};

// Columns of 8-column groups [begin, end) of weight w, every row (linear.cpp's run_groups).
void run_groups(const Matrix& w, const gguf::GemmArgs& g, int64_t begin, int64_t end) {
  const int64_t n0 = begin * COLS, n1 = std::min(w.N, end * COLS);
  if (n1 <= n0) return;
  int64_t rowwise = n0;
  if (w.packed.defined()) {
    const int64_t octets_end = std::min(end, w.N / 8);
    if (octets_end > begin) gguf::x8_gemm_columns(g, w.packed.data_ptr<uint8_t>(), begin, octets_end);
    rowwise = std::max(n0, octets_end * 8);
  }
  if (rowwise < n1) {
    // Every supported type belongs to one family (checked at construction).
    (void)(gguf::gemm_blocks32_columns(g, rowwise, n1) || gguf::gemm_kquant_columns(g, rowwise, n1) ||
           gguf::gemm_float_columns(g, rowwise, n1));
  }
  if (w.bias.defined()) {
    const float* b = w.bias.data_ptr<float>();
    for (int64_t m = 0; m < g.M; ++m)
      for (int64_t n = n0; n < n1; ++n) g.out[m * g.ldo + n] += b[n];
  }
}

// This thread's share of weights that read one input, their outputs side by side in out [T, ldo]:
// the 8-column groups whose first byte (counting every weight's groups in order) falls in the
// thread's part of all their bytes (StepThread::part: 1 / nth each as linear.cpp's split, or the
// stack's fitted ThreadSplit); the last thread takes every group to the end.
template <typename Thread>
void gemm_share(std::initializer_list<const Matrix*> weights, const Activations& acts, const float* x, int64_t T,
                float* out, int64_t ldo, const Thread& thread) {
  double total = 0.0;
  for (const Matrix* w : weights) total += static_cast<double>(COLS * w->row_bytes) * ((w->N + COLS - 1) / COLS);
  const auto [lo_part, hi_part] = thread.part();
  const double lo = total * lo_part, hi = total * hi_part;
  const bool last = thread.tid + 1 == thread.nth;
  double start = 0.0;
  int64_t col = 0;
  for (const Matrix* w : weights) {
    const int64_t groups = (w->N + COLS - 1) / COLS;
    const double group_bytes = static_cast<double>(COLS * w->row_bytes);
    const auto first_at_or_after = [&](double bound) {
      const double g = std::ceil((bound - start) / group_bytes);
      return std::clamp<int64_t>(static_cast<int64_t>(g), 0, groups);
    };
    const int64_t begin = first_at_or_after(lo), end = last ? groups : first_at_or_after(hi);
    if (end > begin) run_groups(*w, acts.args(*w, x, T, out + col, ldo), begin, end);
    start += group_bytes * groups;
    col += w->N;
  }
}

#endif  // CADENCE_HAVE_AVX2

}  // namespace

DecodeStackGGUF::DecodeStackGGUF(const std::vector<at::Tensor>& blocks, const std::vector<int64_t>& types,
                                 const std::vector<c10::optional<at::Tensor>>& packed,
                                 const std::vector<c10::optional<at::Tensor>>& biases,
                                 const std::vector<at::Tensor>& input_norm, const std::vector<at::Tensor>& post_norm,
                                 at::Tensor final_norm, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                                 int64_t intermediate, double eps)
    : heads_(num_heads), kv_heads_(num_kv_heads), head_dim_(head_dim), intermediate_(intermediate), eps_(eps) {
#if CADENCE_HAVE_AVX2
  const size_t L = input_norm.size();
  TORCH_CHECK(L > 0 && post_norm.size() == L && blocks.size() == 7 * L && types.size() == 7 * L &&
                  packed.size() == 7 * L && biases.size() == 7 * L,
              "DecodeStackGGUF: 7 weights (q, k, v, o, gate, up, down) and 2 norms per layer");
  TORCH_CHECK(num_heads > 0 && num_kv_heads > 0 && num_heads % num_kv_heads == 0,
              "DecodeStackGGUF: num_heads must be a multiple of num_kv_heads");
  TORCH_CHECK(avx2::f32_head_dim(head_dim), "DecodeStackGGUF: head_dim 64, 128 or 256 only, got ", head_dim);
  hidden_ = final_norm.numel();
  final_norm_ = float_vector(final_norm, hidden_, "final_norm");
  const int64_t H = hidden_, Q = num_heads * head_dim, KV = num_kv_heads * head_dim, I = intermediate;
  for (size_t l = 0; l < L; ++l) {
    const size_t i = 7 * l;
    auto at = [&](size_t j, int64_t N, int64_t K, const char* name) {
      return matrix(blocks[i + j], types[i + j], packed[i + j], biases[i + j], N, K, name);
    };
    Layer layer;
    layer.q = at(0, Q, H, "q");
    layer.k = at(1, KV, H, "k");
    layer.v = at(2, KV, H, "v");
    layer.o = at(3, H, Q, "o");
    layer.gate = at(4, I, H, "gate");
    layer.up = at(5, I, H, "up");
    layer.down = at(6, H, I, "down");
    layer.input_norm = float_vector(input_norm[l], H, "input_norm");
    layer.post_norm = float_vector(post_norm[l], H, "post_norm");
    layers_.push_back(std::move(layer));
  }
#else
  TORCH_CHECK(false, "DecodeStackGGUF: built without AVX2/FMA");
#endif
}

void DecodeStackGGUF::attach_head(const at::Tensor& blocks, int64_t type, const c10::optional<at::Tensor>& packed,
                                  const c10::optional<at::Tensor>& bias, int64_t N) {
#if CADENCE_HAVE_AVX2
  TORCH_CHECK(!layers_.empty(), "DecodeStackGGUF: attach_head after construction");
  head_ = matrix(blocks, type, packed, bias, N, hidden_, "head");
#else
  TORCH_CHECK(false, "DecodeStackGGUF: built without AVX2/FMA");
#endif
}

void DecodeStackGGUF::attach_sandwich_norms(const std::vector<at::Tensor>& attn_out,
                                            const std::vector<at::Tensor>& mlp_out) {
  TORCH_CHECK(attn_out.size() == layers_.size() && mlp_out.size() == layers_.size(),
              "DecodeStackGGUF: one attention-output and one MLP-output norm per layer");
  for (size_t l = 0; l < layers_.size(); ++l) {
    layers_[l].attn_out_norm = float_vector(attn_out[l], hidden_, "attn_out_norm");
    layers_[l].mlp_out_norm = float_vector(mlp_out[l], hidden_, "mlp_out_norm");
  }
}

void DecodeStackGGUF::set_layer_attention(const std::vector<int64_t>& windows, const std::vector<bool>& local_rope) {
  TORCH_CHECK(windows.size() == layers_.size() && local_rope.size() == layers_.size(),
              "DecodeStackGGUF: one window and one local-rope flag per layer");
  for (size_t l = 0; l < layers_.size(); ++l) {
    TORCH_CHECK(windows[l] >= 0, "DecodeStackGGUF: a window is positive, or 0 for full attention");
    layers_[l].window = windows[l];
    layers_[l].local_rope = local_rope[l];
  }
}

void DecodeStackGGUF::attach_qk_norms(const std::vector<at::Tensor>& q_norm, const std::vector<at::Tensor>& k_norm) {
  attach_qk_norm_weights(layers_, q_norm, k_norm, head_dim_, at::kFloat, "DecodeStackGGUF");
}

int64_t DecodeStackGGUF::weight_bytes() const {
  int64_t total = 0;
  for (const Layer& l : layers_)
    for (const Matrix* m : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down})
      total += m->packed.defined() ? m->packed.numel() + (m->N % 8) * m->row_bytes : m->blocks.numel();
  return total;
}

at::Tensor DecodeStackGGUF::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor kv,
                                    const at::Tensor& slots, const at::Tensor& block_tables,
                                    const at::Tensor& row_seq, const at::Tensor& ctx_lens, double scale,
                                    const c10::optional<at::Tensor>& logits,
                                    const c10::optional<at::Tensor>& argmax,
                                    const c10::optional<at::Tensor>& cos_local,
                                    const c10::optional<at::Tensor>& sin_local) const {
#if CADENCE_HAVE_AVX2
  const int64_t T = x.dim() == 2 ? x.size(0) : 0;
  bool any_local = false;
  for (const Layer& l : layers_) any_local |= l.local_rope;
  at::Tensor cl, sl_;
  if (any_local) {
    TORCH_CHECK(cos_local.has_value() && cos_local->defined() && sin_local.has_value() && sin_local->defined(),
                "DecodeStackGGUF: layers with the local rope need cos_local and sin_local");
    TORCH_CHECK(cos_local->scalar_type() == at::kFloat && sin_local->scalar_type() == at::kFloat &&
                    cos_local->sizes() == cos.sizes() && sin_local->sizes() == cos.sizes(),
                "DecodeStackGGUF: cos_local, sin_local [T, D] float32");
    cl = cos_local->contiguous();
    sl_ = sin_local->contiguous();
  }
  const float* clp = any_local ? cl.data_ptr<float>() : nullptr;
  const float* slp_ = any_local ? sl_.data_ptr<float>() : nullptr;
  const HeadOutputs head("DecodeStackGGUF", logits, argmax, T, head_.N);
  float* lp = head.logits;
  int64_t* ap = head.argmax;
  // The KV cache's storage type: float32, or float16 / bf16 (--kv-cache-dtype; attention_f32.h).
  switch (kv.scalar_type()) {
    case at::kHalf:
      return forward_kv<c10::Half>(x, cos, sin, kv, slots, block_tables, row_seq, ctx_lens, scale, lp, ap, clp, slp_);
    case at::kBFloat16:
      return forward_kv<c10::BFloat16>(x, cos, sin, kv, slots, block_tables, row_seq, ctx_lens, scale, lp, ap, clp, slp_);
    default: return forward_kv<float>(x, cos, sin, kv, slots, block_tables, row_seq, ctx_lens, scale, lp, ap, clp, slp_);
  }
#else
  TORCH_CHECK(false, "DecodeStackGGUF: built without AVX2/FMA");
  return x;
#endif
}

#if CADENCE_HAVE_AVX2  // forward_kv is instantiated by forward's AVX2 branch only
template <typename KV>
at::Tensor DecodeStackGGUF::forward_kv(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                       at::Tensor kv, const at::Tensor& slots, const at::Tensor& block_tables,
                                       const at::Tensor& row_seq, const at::Tensor& ctx_lens, double scale,
                                       float* logits, int64_t* argmax, const float* cos_local,
                                       const float* sin_local) const {
  const int64_t H = hidden_, Hq = heads_, Hkv = kv_heads_, D = head_dim_;
  const int64_t I = intermediate_, L = num_layers();
  const StepRows rows("DecodeStackGGUF", x, at::kFloat, H, cos, sin, kv, L, Hkv, D, slots, block_tables, row_seq, ctx_lens);
  const int64_t T = rows.T;
  KV* kvp = kv.data_ptr<KV>();
  const float fscale = static_cast<float>(scale);
  const float eps = static_cast<float>(eps_);

  // One span plan per distinct attention window (0: full layers; Gemma's sliding layers share one).
  std::vector<int64_t> plan_window{0};
  std::vector<int64_t> layer_plan(L, 0);
  for (int64_t l = 0; l < L; ++l) {
    const int64_t win = layers_[l].window;
    const auto it = std::find(plan_window.begin(), plan_window.end(), win);
    layer_plan[l] = it - plan_window.begin();
    if (it == plan_window.end()) plan_window.push_back(win);
  }
  std::vector<avx2::SpanItems> plans;
  plans.reserve(plan_window.size());
  for (const int64_t win : plan_window) plans.emplace_back(rows.lenp, rows.seqp, T, Hq, D, win);

  StepActivations<float> buf(T, H, Hq, Hkv, D, I);
  auto out = at::empty({T, H}, x.options());

  auto team = step_team(at::get_num_threads());
  const avx2::LayerItemCounters next_item(L);
  const int64_t V = head_.N;
  // Each thread's argmax of its 1 / nth of every row's logits: [team][T] indices into the row.
  std::vector<int64_t> span_best(argmax != nullptr ? team.size() * T : 0);

  team.run([&](StepThread<NUM_PHASES>& thread) {
    const int tid = thread.tid, nth = thread.nth;
    const avx2::FlushDenormals ftz;
    std::vector<float> residual(T * H), normed(T * H), scores(Hq * avx2::ATTN_SPAN);
    // A sandwich norm's output (the normed o or d rows), this thread's own copy.
    std::vector<float> sublayer_out(layers_[0].attn_out_norm.defined() ? T * H : 0);
    // A sublayer's output [T, H] as the residual adds it: itself, or with a sandwich norm that
    // norm of each row (rms_norm_row into this thread's copy, as the per-op path's rms_norm).
    auto sublayer = [&](float* out, const at::Tensor& norm) -> const float* {
      if (!norm.defined()) return out;
      add_norm_rows<float>(out, nullptr, norm.data_ptr<float>(), sublayer_out.data(), T, H, eps);
      return sublayer_out.data();
    };
    Activations acts;
    std::memcpy(residual.data(), x.data_ptr<float>(), sizeof(float) * T * H);
    add_norm_rows<float>(residual.data(), nullptr, layers_[0].input_norm.data_ptr<float>(), normed.data(), T, H, eps);
    for (int64_t l = 0; l < L; ++l) {
      const Layer& w = layers_[l];
      KV* kc = kvp + l * rows.layer_stride;
      KV* vc = kc + rows.layer_stride / 2;
      // 1. q, k, v side by side.
      acts.prepare(normed.data(), T, H, {&w.q, &w.k, &w.v});
      gemm_share({&w.q, &w.k, &w.v}, acts, normed.data(), T, buf.qkv.data(), buf.qkv_width, thread);
      thread.sync();
      thread.lap(0);
      // 2. (q/k norms,) rope (a local layer's own) + cache write.
      const auto [r0, r1] = thread.share(T);
      rope_write_rows<float, KV>(buf.qkv.data(), r0, r1, rows, w.local_rope ? cos_local : rows.cp,
                                 w.local_rope ? sin_local : rows.sp,
                                 w.q_norm.defined() ? w.q_norm.data_ptr<float>() : nullptr,
                                 w.k_norm.defined() ? w.k_norm.data_ptr<float>() : nullptr, Hq, Hkv, D, eps, kc, vc);
      thread.sync();
      thread.lap(1);
      // 3. attention partials, then the merge of each (row, head)'s spans.
      avx2::attention_phase_f32<KV>(thread, plans[layer_plan[l]], next_item[l], buf.qkv.data(), Hq, Hkv, D, kc, vc,
                                    rows, fscale, scores, buf.attn.data());
      thread.lap(2);
      // 4. output projection; 5. residual + post-attention norm (own copy).
      acts.prepare(buf.attn.data(), T, Hq * D, {&w.o});
      gemm_share({&w.o}, acts, buf.attn.data(), T, buf.o.data(), H, thread);
      thread.sync();
      thread.lap(3);
      add_norm_rows<float>(residual.data(), sublayer(buf.o.data(), w.attn_out_norm), w.post_norm.data_ptr<float>(),
                           normed.data(), T, H, eps);
      thread.lap(4);
      // 6. gate and up over this thread's 16-column units (the same columns of both), then silu * up
      // over them: buf.gate_up rows are [gate | up] as gguf_linear_many writes them.
      {
        acts.prepare(normed.data(), T, H, {&w.gate, &w.up});
        const int64_t units = (I + PAIR_COLS - 1) / PAIR_COLS, groups = (I + COLS - 1) / COLS;
        const auto [u0, u1] = thread.balanced_share(units);
        const int64_t g0 = u0 * (PAIR_COLS / COLS), g1 = std::min(groups, u1 * (PAIR_COLS / COLS));
        if (g1 > g0) {
          run_groups(w.gate, acts.args(w.gate, normed.data(), T, buf.gate_up.data(), 2 * I), g0, g1);
          run_groups(w.up, acts.args(w.up, normed.data(), T, buf.gate_up.data() + I, 2 * I), g0, g1);
          const int64_t c0 = u0 * PAIR_COLS, c1 = std::min(I, u1 * PAIR_COLS);
          for (int64_t t = 0; t < T; ++t)
            if (gelu_)
              gelu_tanh_mul_row(buf.gate_up.data() + t * 2 * I + c0, buf.gate_up.data() + t * 2 * I + I + c0,
                                buf.act.data() + t * I + c0, c1 - c0);
            else
              silu_mul_row<float>(buf.gate_up.data() + t * 2 * I + c0, buf.gate_up.data() + t * 2 * I + I + c0,
                                  buf.act.data() + t * I + c0, c1 - c0);
        }
      }
      thread.sync();
      thread.lap(5);
      // 7. down projection; 8. residual + next layer's input norm (or the final norm).
      acts.prepare(buf.act.data(), T, I, {&w.down});
      gemm_share({&w.down}, acts, buf.act.data(), T, buf.down.data(), H, thread);
      thread.sync();
      thread.lap(6);
      const at::Tensor& next_norm = l + 1 < L ? layers_[l + 1].input_norm : final_norm_;
      add_norm_rows<float>(residual.data(), sublayer(buf.down.data(), w.mlp_out_norm), next_norm.data_ptr<float>(),
                           normed.data(), T, H, eps);
      thread.lap(7);
    }
    if (logits != nullptr) {
      // 9. The LM head on every thread's own copy of the final-norm rows (the same bits on each).
      acts.prepare(normed.data(), T, H, {&head_});
      gemm_share({&head_}, acts, normed.data(), T, logits, V, thread);
      thread.sync();
      if (argmax != nullptr) {
        // torch.argmax per row: each thread the first NaN or the first maximum of its span, then
        // thread 0 merges the spans in order (an earlier span's NaN, else the largest value, the
        // earlier span on a tie).
        const auto [c0, c1] = thread.share(V);
        for (int64_t t = 0; t < T; ++t)
          span_best[tid * T + t] = c1 > c0 ? c0 + argmax_row(logits + t * V + c0, c1 - c0) : -1;
        thread.sync();
        if (tid == 0) {
          for (int64_t t = 0; t < T; ++t) {
            const float* row = logits + t * V;
            int64_t best = -1;
            for (int i = 0; i < nth; ++i) {
              const int64_t c = span_best[i * T + t];
              if (c < 0) continue;
              if (std::isnan(row[c])) {
                best = c;
                break;
              }
              if (best < 0 || row[c] > row[best]) best = c;
            }
            argmax[t] = best;
          }
        }
      }
      thread.lap(8);
    }
    if (tid == 0) std::memcpy(out.data_ptr<float>(), normed.data(), sizeof(float) * T * H);
  }, BALANCED_PHASES);
  return out;
}
#endif  // CADENCE_HAVE_AVX2

}  // namespace cadence_kernels
