// Phase 3 of a layer in the float32 fused stacks (DecodeStackF32, DecodeStackGGUF): every row's
// attention over the paged cache as (row, span) items (attention_f32.h), taken dynamically by
// the team (longest first: SpanItems::by_length), then each (row, query head)'s span partials
// merged. Which thread runs an item or a merge does not change its bits (the items and their
// merge order depend on the rows' context lengths only).
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "../stack_phases.h"
#include "../team.h"
#include "attention_f32.h"

namespace cadence_kernels {
namespace avx2 {

// Per layer, the number of attention items taken so far (each 0 before the step).
class LayerItemCounters {
 public:
  explicit LayerItemCounters(int64_t layers) : next_(new std::atomic<int64_t>[layers]) {
    for (int64_t l = 0; l < layers; ++l) next_[l].store(0, std::memory_order_relaxed);
  }
  std::atomic<int64_t>& operator[](int64_t l) const { return next_[l]; }

 private:
  std::unique_ptr<std::atomic<int64_t>[]> next_;
};

#if CADENCE_HAVE_AVX2

// qkv [T, (Hq + 2 Hkv) D] (q heads first); kc, vc: the layer's K and V caches; next_item: the
// layer's item counter (0 before the phase); scores: this thread's [Hq * ATTN_SPAN] scratch;
// out attn [T, Hq * D]. Ends with the team synchronised: attn is complete on every thread.
template <typename KV, int PHASES>
inline void attention_phase_f32(StepThread<PHASES>& thread, SpanItems& plan, std::atomic<int64_t>& next_item,
                                const float* qkv, int64_t Hq, int64_t Hkv, int64_t D, const KV* kc, const KV* vc,
                                const StepRows& rows, float scale, std::vector<float>& scores, float* attn) {
  const int64_t qkv_width = (Hq + 2 * Hkv) * D, G = Hq / Hkv, items = plan.items();
  // Each thread claims its next item before computing the current one, whose value pass then
  // prefetches the next one's K rows (NextKRows).
  for (int64_t k = next_item.fetch_add(1); k < items;) {
    const int64_t next = next_item.fetch_add(1);
    const int64_t i = plan.by_length[k], t = plan.row[i];
    const auto [p0, p1] = plan.positions(i, rows.lenp[t]);
    NextKRows<KV> next_k;
    if (next < items) {
      const int64_t ni = plan.by_length[next], nt = plan.row[ni];
      const auto [n0, n1] = plan.positions(ni, rows.lenp[nt]);
      next_k = NextKRows<KV>(kc, rows.table(nt), rows.block_size, Hkv * D, n0, n1);
    }
    dispatch_f32_head_dim(D, [&](auto dim) {
      attend_span_f32<decltype(dim)::value, KV>(qkv + t * qkv_width, G, Hkv, kc, vc, rows.table(t), rows.block_size,
                                                p0, p1, scale, scores.data(), plan.max_of(i), plan.sum_of(i),
                                                plan.acc_of(i), plan.copy[t], next_k);
    });
    k = next;
  }
  thread.sync();
  const auto [h0, h1] = thread.share(rows.T * Hq);
  std::vector<float> mx, sm;
  for (int64_t th = h0; th < h1; ++th) merge_row_head(plan, th / Hq, th % Hq, mx, sm, attn + th * D);
  thread.sync();
}

#endif  // CADENCE_HAVE_AVX2

}  // namespace avx2
}  // namespace cadence_kernels
