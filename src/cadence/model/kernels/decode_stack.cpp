// DecodeStack (see decode_stack.h): the whole decoder for a small batch in one parallel region.
//
// Phases of a layer, with a team barrier after each one that the next reads across threads:
//   1. qkv = normed @ Wqkv (+ bias)            column blocks split over threads
//   2. (q/k norms,) rope q, k; store k, v       rows split over threads
//   3. attention                                (row, context span) items split by cost; rows
//                                               cut into spans are merged after one more barrier
//   4. o = attn @ Wo                            column blocks
//   5. residual += o; normed = norm(residual)   every thread on its own copy (no barrier needed)
//   6. act = silu(gate) * up                    gate/up block pairs (packed interleaved)
//   7. d = act @ Wdown                          column blocks
//   8. residual += d; normed = norm(residual)   every thread on its own copy
// Each thread keeps a private residual and normed copy: the norms are tiny next to the GEMMs
// and recomputing them saves two barriers a layer. Rounding follows the eager bf16 path (every
// op's output rounded to bf16) through the same row helpers as the standalone kernels.
#include "decode_stack.h"

#include <atomic>
#include <memory>

#include "common.h"
#include "decode_attention.h"
#include "ops.h"
#include "packed_gemm.h"
#include "rows.h"
#include "stack_phases.h"
#include "team.h"

namespace cadence_kernels {

namespace {

const uint16_t* bits(const at::Tensor& t) {
  return reinterpret_cast<const uint16_t*>(t.data_ptr<c10::BFloat16>());
}

at::Tensor pack_checked(const at::Tensor& w, int64_t rows, int64_t cols, bool interleave,
                        const char* name) {
  TORCH_CHECK(w.scalar_type() == at::kBFloat16 && w.dim() == 2 && w.size(0) == rows &&
                  w.size(1) == cols,
              "DecodeStack: ", name, " must be bfloat16 [", rows, ", ", cols, "]");
  return pack_linear_bf16(w.contiguous(), interleave);
}

}  // namespace

DecodeStack::DecodeStack(const std::vector<at::Tensor>& qkv, const std::vector<at::Tensor>& qkv_bias,
                         const std::vector<at::Tensor>& o, const std::vector<at::Tensor>& gate_up,
                         const std::vector<at::Tensor>& down, const std::vector<at::Tensor>& input_norm,
                         const std::vector<at::Tensor>& post_norm, at::Tensor final_norm,
                         int64_t num_heads, int64_t num_kv_heads, double eps)
    : final_norm_(final_norm.contiguous()), heads_(num_heads), kv_heads_(num_kv_heads), eps_(eps) {
#if CADENCE_HAVE_AVX512BF16
  const size_t L = qkv.size();
  TORCH_CHECK(L > 0 && o.size() == L && gate_up.size() == L && down.size() == L &&
                  input_norm.size() == L && post_norm.size() == L &&
                  (qkv_bias.empty() || qkv_bias.size() == L),
              "DecodeStack: one weight of each kind per layer");
  hidden_ = final_norm_.numel();
  TORCH_CHECK(num_heads > 0 && num_kv_heads > 0 && num_heads % num_kv_heads == 0,
              "DecodeStack: num_heads must be a multiple of num_kv_heads");
  TORCH_CHECK(o[0].dim() == 2 && o[0].size(1) % num_heads == 0, "DecodeStack: o [H, Hq*D]");
  head_dim_ = o[0].size(1) / num_heads;
  TORCH_CHECK(decode_attention_supports(head_dim_), "DecodeStack: head_dim 64 or 128 only, got ", head_dim_);
  intermediate_ = down[0].size(1);
  TORCH_CHECK(intermediate_ % 32 == 0 && hidden_ % 2 == 0, "DecodeStack: intermediate size must be a multiple of 32");
  const int64_t qkv_rows = (num_heads + 2 * num_kv_heads) * head_dim_;
  TORCH_CHECK(final_norm_.scalar_type() == at::kBFloat16, "DecodeStack: bfloat16 weights only");
  for (size_t l = 0; l < L; ++l) {
    Layer layer;
    layer.qkv = pack_checked(qkv[l], qkv_rows, hidden_, false, "qkv");
    if (!qkv_bias.empty() && qkv_bias[l].defined() && qkv_bias[l].numel() > 0) {
      TORCH_CHECK(qkv_bias[l].numel() == qkv_rows && qkv_bias[l].scalar_type() == at::kBFloat16,
                  "DecodeStack: qkv bias [", qkv_rows, "] bfloat16");
      layer.qkv_bias = qkv_bias[l].contiguous();
    }
    layer.o = pack_checked(o[l], hidden_, num_heads * head_dim_, false, "o");
    layer.gate_up = pack_checked(gate_up[l], 2 * intermediate_, hidden_, true, "gate_up");
    layer.down = pack_checked(down[l], hidden_, intermediate_, false, "down");
    layer.input_norm = input_norm[l].contiguous();
    layer.post_norm = post_norm[l].contiguous();
    TORCH_CHECK(layer.input_norm.numel() == hidden_ && layer.post_norm.numel() == hidden_ &&
                    layer.input_norm.scalar_type() == at::kBFloat16 &&
                    layer.post_norm.scalar_type() == at::kBFloat16,
                "DecodeStack: norm weights [H] bfloat16");
    layers_.push_back(std::move(layer));
  }
#else
  TORCH_CHECK(false, "DecodeStack: built without AVX512-BF16");
#endif
}

at::Tensor DecodeStack::forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                                at::Tensor kv, const at::Tensor& slots,
                                const at::Tensor& block_tables, const at::Tensor& row_seq,
                                const at::Tensor& ctx_lens, double scale) const {
#if CADENCE_HAVE_AVX512BF16
  const int64_t H = hidden_, Hq = heads_, Hkv = kv_heads_, D = head_dim_;
  const int64_t I = intermediate_, L = num_layers();
  TORCH_CHECK(kv.scalar_type() == at::kBFloat16, "DecodeStack: kv bfloat16");
  const StepRows rows("DecodeStack", x, at::kBFloat16, H, cos, sin, kv, L, Hkv, D, slots, block_tables, row_seq, ctx_lens);
  const int64_t T = rows.T;
  c10::BFloat16* kvp = kv.data_ptr<c10::BFloat16>();

  StepActivations<uint16_t> buf(T, H, Hq, Hkv, D, I);
  auto out = at::empty({T, H}, x.options());

  // Team size: all threads, unless recent steps showed the team waiting on a descheduled
  // partner (a busy neighbour core): then one thread for a while, and a new probe after.
  auto step = step_team(at::get_num_threads());
  const int team = step.size();
  // Attention items (row, context span).
  SpanPlan plan(rows.lenp, T, team, Hq, Hkv, D);
  const int64_t items = plan.items();
  const bool split = plan.split();
  // Thread o owns items [owned_first[o], owned_first[o + 1]): contiguous ranges of near-equal
  // context cost.
  std::vector<int64_t> owned_first(team + 1, items);
  {
    int64_t total = 0;
    for (int64_t i = 0; i < items; ++i) total += plan.p1(i) - plan.p0(i);
    int64_t before = 0;
    int first_unset = 0;
    for (int64_t i = 0; i < items; ++i) {
      const int64_t cost = plan.p1(i) - plan.p0(i);
      const int owner = static_cast<int>(std::min<int64_t>(team - 1, (2 * before + cost) * team / (2 * total)));
      before += cost;
      for (; first_unset <= owner; ++first_unset) owned_first[first_unset] = i;
    }
  }
  // Per layer and thread, the items still to run, [head, tail) packed in one word: the owner
  // takes from the head (and prefetches the next head's keys), a thread done with its own range
  // takes from the tail of another's. The host often slows one vCPU for a while; with a fixed
  // split the other then waited at every layer's barrier (0.5-3 ms a step at b32-b64).
  std::unique_ptr<std::atomic<uint64_t>[]> item_ranges(new std::atomic<uint64_t>[L * team]);
  for (int64_t l = 0; l < L; ++l)
    for (int o = 0; o < team; ++o)
      item_ranges[l * team + o].store(pack_range(owned_first[o], owned_first[o + 1]), std::memory_order_relaxed);
  const float fscale = static_cast<float>(scale);
  const float eps = static_cast<float>(eps_);

  step.run([&](StepThread<NUM_PHASES>& thread) {
    const int tid = thread.tid, nth = thread.nth;
    std::vector<c10::BFloat16> residual(T * H), normed(T * H);
    std::vector<float> scratch;
    std::memcpy(residual.data(), x.data_ptr<c10::BFloat16>(), sizeof(uint16_t) * T * H);
    add_norm_rows<c10::BFloat16>(residual.data(), nullptr, layers_[0].input_norm.data_ptr<c10::BFloat16>(),
                                 normed.data(), T, H, eps);
    const uint16_t* normed_bits = reinterpret_cast<const uint16_t*>(normed.data());
    auto gemm = [&](const uint16_t* in, int64_t K, const at::Tensor& packed, int64_t N,
                    const uint16_t* bias, uint16_t* dst) {
      const auto [b0, b1] = thread.share(packed_blocks(N));
      packed_gemm_blocks(in, K, T, bits(packed), K, b0, b1,
                         [&](int64_t m0, int mr, int64_t bb, int nb, __m512 acc[GEMM_MR][GEMM_NB]) {
                           store_tile_bf16(acc, m0, mr, bb, nb, N, bias, dst, N);
                         });
    };
    for (int64_t l = 0; l < L; ++l) {
      const Layer& w = layers_[l];
      c10::BFloat16* kc = kvp + l * rows.layer_stride;
      c10::BFloat16* vc = kc + rows.layer_stride / 2;
      // 1. qkv projection.
      gemm(normed_bits, H, w.qkv, buf.qkv_width, w.qkv_bias.defined() ? bits(w.qkv_bias) : nullptr, buf.qkv.data());
      thread.sync();
      thread.lap(0);
      // 2. (q/k norms,) rope + cache write.
      const auto [r0, r1] = thread.share(T);
      rope_write_rows<c10::BFloat16, c10::BFloat16>(
          reinterpret_cast<c10::BFloat16*>(buf.qkv.data()), r0, r1, rows, rows.cp, rows.sp,
          w.q_norm.defined() ? w.q_norm.data_ptr<c10::BFloat16>() : nullptr,
          w.k_norm.defined() ? w.k_norm.data_ptr<c10::BFloat16>() : nullptr, Hq, Hkv, D, eps, kc, vc);
      thread.sync();
      thread.lap(1);
      // 3. attention. Which thread runs an item does not change its result.
      std::atomic<uint64_t>* ranges = item_ranges.get() + l * team;
      auto next_item = [&]() -> int64_t {
        int64_t i = take_item(ranges[tid], true);
        for (int o = 1; i < 0 && o < team; ++o) i = take_item(ranges[(tid + o) % team], false);
        return i;
      };
      const uint16_t* kc_bits = reinterpret_cast<const uint16_t*>(kc);
      const uint16_t* vc_bits = reinterpret_cast<const uint16_t*>(vc);
      for (int64_t i = next_item(); i >= 0; i = next_item()) {
        const int64_t t = plan.row(i);
        const int64_t j = peek_front(ranges[tid]);  // likely this thread's next item: its keys stream in meanwhile
        const NextSpan next{j >= 0 ? rows.table(plan.row(j)) : nullptr, j >= 0 ? plan.p0(j) : 0,
                            j >= 0 ? plan.p1(j) : 0};
        scratch.resize(attend_scratch_floats(Hq, D, plan.p1(i) - plan.p0(i)));
        dispatch_head_dim(D, [&](auto dim) {
          attend_span_bf16<decltype(dim)::value>(buf.qkv.data() + t * buf.qkv_width, Hq, Hkv, kc_bits, vc_bits,
                                                 rows.table(t), rows.block_size, plan.p0(i), plan.p1(i), fscale,
                                                 scratch.data(), plan.part(i), j >= 0 ? &next : nullptr);
        });
        if (!split) plan.merge_row(t, buf.attn.data() + t * Hq * D);
      }
      if (split) {
        thread.sync();
        for (int64_t t = r0; t < r1; ++t) plan.merge_row(t, buf.attn.data() + t * Hq * D);
      }
      thread.sync();
      thread.lap(2);
      // 4. output projection; 5. residual + post-attention norm (own copy).
      gemm(buf.attn.data(), Hq * D, w.o, H, nullptr, buf.o.data());
      thread.sync();
      thread.lap(3);
      add_norm_rows<c10::BFloat16>(residual.data(), reinterpret_cast<const c10::BFloat16*>(buf.o.data()),
                                   w.post_norm.data_ptr<c10::BFloat16>(), normed.data(), T, H, eps);
      thread.lap(4);
      // 6. gate/up, then silu * up over this thread's own columns: packed block 2j is gate
      //    columns [16j, 16j+16), 2j+1 the matching up columns, so buf.gate_up rows read
      //    [g 16 | u 16] pairs and a thread's range holds whole pairs. (silu inside the GEMM
      //    epilogue made the tile loop 1.6x slower: the big epilogue kept the accumulators
      //    out of registers.)
      {
        const auto [p0, p1] = thread.share(packed_blocks(2 * I) / 2);
        packed_gemm_blocks(normed_bits, H, T, bits(w.gate_up), H, 2 * p0, 2 * p1,
                           [&](int64_t m0, int mr, int64_t bb, int nb, __m512 acc[GEMM_MR][GEMM_NB]) {
                             store_tile_bf16(acc, m0, mr, bb, nb, 2 * I, nullptr, buf.gate_up.data(), 2 * I);
                           });
        const auto* gu = reinterpret_cast<const c10::BFloat16*>(buf.gate_up.data());
        auto* act = reinterpret_cast<c10::BFloat16*>(buf.act.data());
        for (int64_t t = 0; t < T; ++t)
          for (int64_t j = p0; j < p1; ++j)
            silu_mul_row<c10::BFloat16>(gu + t * 2 * I + j * 2 * PACK_COLS, gu + t * 2 * I + j * 2 * PACK_COLS + PACK_COLS,
                                        act + t * I + j * PACK_COLS, PACK_COLS);
      }
      thread.sync();
      thread.lap(5);
      // 7. down projection; 8. residual + next layer's input norm (or the final norm).
      gemm(buf.act.data(), I, w.down, H, nullptr, buf.down.data());
      thread.sync();
      thread.lap(6);
      const at::Tensor& next_norm = l + 1 < L ? layers_[l + 1].input_norm : final_norm_;
      add_norm_rows<c10::BFloat16>(residual.data(), reinterpret_cast<const c10::BFloat16*>(buf.down.data()),
                                   next_norm.data_ptr<c10::BFloat16>(), normed.data(), T, H, eps);
      thread.lap(7);
    }
    if (tid == 0) std::memcpy(out.data_ptr<c10::BFloat16>(), normed.data(), sizeof(uint16_t) * T * H);
  });
  return out;
#else
  TORCH_CHECK(false, "DecodeStack: built without AVX512-BF16");
  return x;
#endif
}

void DecodeStack::attach_qk_norms(const std::vector<at::Tensor>& q_norm, const std::vector<at::Tensor>& k_norm) {
  attach_qk_norm_weights(layers_, q_norm, k_norm, head_dim_, at::kBFloat16, "DecodeStack");
}

}  // namespace cadence_kernels
