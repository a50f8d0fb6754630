// Arguments and work distribution of the causal prefill attention kernels (bf16:
// prefill_attention.cpp, float32: avx2/prefill_attention_f32.cpp): one set of checks, one way to
// find a context position's K/V row (contiguous [L, Hkv, D] or paged [num_blocks, block_size, Hkv,
// D] through a block table), one way to hand out work items.
#pragma once

#include <atomic>

#include "common.h"

namespace cadence_kernels {

struct PrefillArgs {
  int64_t n, Hq, D, Hkv, block_size, L;
  bool paged;
  at::Tensor table;  // int32 [blocks], contiguous (paged only)
  const int32_t* tdata = nullptr;
  // Element offset of context position t's row (head 0) in a K/V tensor with strides s0, s1.
  int64_t row_offset(int64_t t, int64_t s0, int64_t s1) const {
    return paged ? tdata[t / block_size] * s0 + (t % block_size) * s1 : t * s0;
  }
};

// Checks q [n, Hq, D], keys/values (contiguous [L, Hkv, D] or caches with a block table, then
// L = ctx_len) of scalar type `dtype`; head_dim 64 or 128. `name` prefixes every error.
inline PrefillArgs check_prefill_args(const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                                      const c10::optional<at::Tensor>& block_table, int64_t ctx_len,
                                      at::ScalarType dtype, const char* name) {
  TORCH_CHECK(q.device().is_cpu() && keys.device().is_cpu() && values.device().is_cpu(), name,
              ": CPU tensors only");
  TORCH_CHECK(q.scalar_type() == dtype && keys.scalar_type() == dtype && values.scalar_type() == dtype, name,
              ": ", dtype == at::kBFloat16 ? "bfloat16" : "float32", " q, keys and values only");
  TORCH_CHECK(keys.sizes() == values.sizes(), name, ": keys and values differ in shape");
  PrefillArgs a;
  a.paged = block_table.has_value();
  TORCH_CHECK(q.dim() == 3 && keys.dim() == (a.paged ? 4 : 3), name,
              ": q [n, Hq, D] and keys, values [L, Hkv, D], or with a block table "
              "the caches [num_blocks, block_size, Hkv, D]");
  a.n = q.size(0);
  a.Hq = q.size(1);
  a.D = q.size(2);
  a.Hkv = keys.size(-2);
  a.block_size = a.paged ? keys.size(1) : 1;
  a.L = a.paged ? ctx_len : keys.size(0);
  TORCH_CHECK(keys.size(-1) == a.D, name, ": q and keys differ in head_dim");
  TORCH_CHECK(a.D == 64 || a.D == 128, name, ": head_dim 64 or 128 only, got ", a.D);
  TORCH_CHECK(a.Hkv > 0 && a.Hq % a.Hkv == 0, name, ": query heads (", a.Hq, ") not a multiple of KV heads (",
              a.Hkv, ")");
  TORCH_CHECK(a.paged || ctx_len < 0 || ctx_len == a.L, name, ": ctx_len (", ctx_len,
              ") differs from keys' length (", a.L, ")");
  TORCH_CHECK(a.L >= a.n, name, ": context (", a.L, ") shorter than the chunk (", a.n, ")");
  if (a.paged) {
    a.table = block_table->contiguous();
    TORCH_CHECK(a.table.device().is_cpu() && a.table.scalar_type() == at::kInt && a.table.dim() == 1, name,
                ": block_table must be a 1-D int32 CPU tensor");
    TORCH_CHECK(a.block_size > 0 && a.table.size(0) * a.block_size >= a.L, name, ": block_table (",
                a.table.size(0), " blocks of ", a.block_size, ") shorter than ctx_len (", a.L, ")");
    a.tdata = a.table.data_ptr<int32_t>();
    for (int64_t i = 0; i < (a.L + a.block_size - 1) / a.block_size; ++i)
      TORCH_CHECK(a.tdata[i] >= 0 && a.tdata[i] < keys.size(0), name, ": block_table entry ", a.tdata[i],
                  " out of range [0, ", keys.size(0), ")");
  }
  return a;
}

// Runs fn(i) for every item i in [0, items), handed out dynamically from item 0 on (callers
// number the costliest first), so a thread slowed by a busy neighbour takes fewer of them;
// serial: all on the calling thread.
template <typename Fn>
inline void for_items_dynamic(int64_t items, bool serial, Fn&& fn) {
  std::atomic<int64_t> next{0};
  const int64_t workers = serial ? 1 : std::min<int64_t>(at::get_num_threads(), items);
  at::parallel_for(0, workers, 1, [&](int64_t begin, int64_t end) {
    for (int64_t w = begin; w < end; ++w)
      for (int64_t i = next.fetch_add(1); i < items; i = next.fetch_add(1)) fn(i);
  });
}

}  // namespace cadence_kernels
