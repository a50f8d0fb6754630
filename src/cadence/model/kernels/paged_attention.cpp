// paged_attention: one query row per token over its own context [0, ctx_len), read straight
// from the paged cache through its block table (no gather, no copy).
#include "common.h"
#include "decode_attention.h"
#include "prefill_args.h"
#include "ops.h"

#include <numeric>

#include "avx2/attention_f32.h"

namespace cadence_kernels {

#if defined(__AVX512F__)

template <typename T>
inline void prefetch_block_rows(const T* base, int32_t block, int64_t block_size,
                                int64_t token_stride, int64_t row_bytes) {
  const char* start = reinterpret_cast<const char*>(base + static_cast<int64_t>(block) * block_size * token_stride);
  for (int64_t off = 0; off < block_size; ++off)
    for (int64_t byte = 0; byte < row_bytes; byte += 64)
      _mm_prefetch(start + off * token_stride * sizeof(T) + byte, _MM_HINT_T0);
}

// One (query row, KV head) item with head_dim = 16 * C: G query heads over ctx positions.
// Loops run per query head (g outer) so the accumulators stay in registers; the sequence's K/V
// for this head is read from memory on g = 0 and from cache after.
template <typename T, int C>
void attend_item_avx512(const float* qf, int64_t G, const T* kbase, const T* vbase,
                        const int32_t* table, int64_t block_size, int64_t ctx,
                        int64_t token_stride, float* scores, float* acc_out) {
  constexpr int64_t D = 16 * C;
  const int64_t nblocks = (ctx + block_size - 1) / block_size;
  for (int64_t g = 0; g < G; ++g) {
    __m512 qv[C];
    for (int c = 0; c < C; ++c) qv[c] = _mm512_loadu_ps(qf + g * D + 16 * c);
    float* s = scores + g * ctx;
    for (int64_t b = 0; b < nblocks; ++b) {
      const T* kblock = kbase + static_cast<int64_t>(table[b]) * block_size * token_stride;
      const int64_t count = std::min<int64_t>(block_size, ctx - b * block_size);
      // Blocks are scattered, so the hardware prefetcher cannot run ahead across them: fetch
      // the next block's K and V rows of this head while computing on this one (first pass).
      if (g == 0 && b + 1 < nblocks) {
        prefetch_block_rows(kbase, table[b + 1], block_size, token_stride, D * sizeof(T));
        prefetch_block_rows(vbase, table[b + 1], block_size, token_stride, D * sizeof(T));
      }
      for (int64_t off = 0; off < count; ++off) {
        const T* krow = kblock + off * token_stride;
        __m512 dot = _mm512_mul_ps(qv[0], load16(krow));
        for (int c = 1; c < C; ++c) dot = _mm512_fmadd_ps(qv[c], load16(krow + 16 * c), dot);
        s[b * block_size + off] = _mm512_reduce_add_ps(dot);
      }
    }
    softmax_inplace(s, ctx);
    __m512 acc[C];
    for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nblocks; ++b) {
      const T* vblock = vbase + static_cast<int64_t>(table[b]) * block_size * token_stride;
      const int64_t count = std::min<int64_t>(block_size, ctx - b * block_size);
      for (int64_t off = 0; off < count; ++off) {
        const T* vrow = vblock + off * token_stride;
        const __m512 p = _mm512_set1_ps(s[b * block_size + off]);
        for (int c = 0; c < C; ++c) acc[c] = _mm512_fmadd_ps(p, load16(vrow + 16 * c), acc[c]);
      }
    }
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc_out + g * D + 16 * c, acc[c]);
  }
}

// Same as attend_item_avx512 with the G query heads of one KV head known at compile time: one
// pass over K and one over V serve all of them (accumulators for every head in registers).
template <typename T, int C, int G>
void attend_item_grouped(const float* qf, const T* kbase, const T* vbase, const int32_t* table,
                         int64_t block_size, int64_t ctx, int64_t token_stride, float* scores,
                         float* acc_out) {
  constexpr int64_t D = 16 * C;
  const int64_t nblocks = (ctx + block_size - 1) / block_size;
  __m512 qv[G][C];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) qv[g][c] = _mm512_loadu_ps(qf + g * D + 16 * c);
  for (int64_t b = 0; b < nblocks; ++b) {
    const T* kblock = kbase + static_cast<int64_t>(table[b]) * block_size * token_stride;
    const int64_t count = std::min<int64_t>(block_size, ctx - b * block_size);
    if (b + 1 < nblocks) {
      prefetch_block_rows(kbase, table[b + 1], block_size, token_stride, D * sizeof(T));
      prefetch_block_rows(vbase, table[b + 1], block_size, token_stride, D * sizeof(T));
    }
    for (int64_t off = 0; off < count; ++off) {
      const T* krow = kblock + off * token_stride;
      __m512 kv[C];
      for (int c = 0; c < C; ++c) kv[c] = load16(krow + 16 * c);
      for (int g = 0; g < G; ++g) {
        __m512 dot = _mm512_mul_ps(qv[g][0], kv[0]);
        for (int c = 1; c < C; ++c) dot = _mm512_fmadd_ps(qv[g][c], kv[c], dot);
        scores[g * ctx + b * block_size + off] = _mm512_reduce_add_ps(dot);
      }
    }
  }
  for (int g = 0; g < G; ++g) softmax_inplace(scores + g * ctx, ctx);
  __m512 acc[G][C];
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) acc[g][c] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nblocks; ++b) {
    const T* vblock = vbase + static_cast<int64_t>(table[b]) * block_size * token_stride;
    const int64_t count = std::min<int64_t>(block_size, ctx - b * block_size);
    for (int64_t off = 0; off < count; ++off) {
      const T* vrow = vblock + off * token_stride;
      const int64_t pos = b * block_size + off;
      for (int c = 0; c < C; ++c) {
        const __m512 v = load16(vrow + 16 * c);
        for (int g = 0; g < G; ++g)
          acc[g][c] = _mm512_fmadd_ps(_mm512_set1_ps(scores[g * ctx + pos]), v, acc[g][c]);
      }
    }
  }
  for (int g = 0; g < G; ++g)
    for (int c = 0; c < C; ++c) _mm512_storeu_ps(acc_out + g * D + 16 * c, acc[g][c]);
}

// head_dim 64 (C = 4) with 1-4 query heads per KV head takes the grouped kernel; false otherwise.
template <typename T>
bool attend_grouped_d64(int64_t G, const float* qf, const T* kb, const T* vb, const int32_t* table,
                        int64_t block_size, int64_t ctx, int64_t token_stride, float* scores,
                        float* acc) {
  switch (G) {
    case 1: attend_item_grouped<T, 4, 1>(qf, kb, vb, table, block_size, ctx, token_stride, scores, acc); return true;
    case 2: attend_item_grouped<T, 4, 2>(qf, kb, vb, table, block_size, ctx, token_stride, scores, acc); return true;
    case 3: attend_item_grouped<T, 4, 3>(qf, kb, vb, table, block_size, ctx, token_stride, scores, acc); return true;
    case 4: attend_item_grouped<T, 4, 4>(qf, kb, vb, table, block_size, ctx, token_stride, scores, acc); return true;
    default: return false;
  }
}
#endif

// ---------------------------------------------------------------------------------------------
// paged_attention
constexpr int64_t PARALLEL_MIN_POSITIONS = 32768;  // (position, KV head) pairs
// q: [N, Hq, D]; k_cache, v_cache: [num_blocks, block_size, Hkv, D] in storage type KV (T, or a
// float16 / bf16 cache under float32 queries); block_tables: [S, max_blocks] int32; row_seq: [N]
// int64 (which block-table row each query uses); ctx_lens: [N] int64 (query row n attends over
// positions [0, ctx_lens[n])). Returns [N, Hq, D] in q's dtype.
template <typename T, typename KV = T>
void paged_attention_impl(const at::Tensor& q, const at::Tensor& k_cache,
                          const at::Tensor& v_cache, const at::Tensor& block_tables,
                          const at::Tensor& row_seq, const at::Tensor& ctx_lens,
                          double scale, at::Tensor& out) {
  const int64_t N = q.size(0), Hq = q.size(1), D = q.size(2);
  const int64_t block_size = k_cache.size(1), Hkv = k_cache.size(2);
  const int64_t G = Hq / Hkv;
  const int64_t max_blocks = block_tables.size(1);
  const T* qp = q.data_ptr<T>();
  const KV* kp = k_cache.data_ptr<KV>();
  const KV* vp = v_cache.data_ptr<KV>();
  const int32_t* bt = block_tables.data_ptr<int32_t>();
  const int64_t* seq = row_seq.data_ptr<int64_t>();
  const int64_t* lens = ctx_lens.data_ptr<int64_t>();
  T* op = out.data_ptr<T>();
  const float fscale = static_cast<float>(scale);
  const int64_t token_stride = Hkv * D;  // elements between consecutive positions of one head

  // One work item = one query row and one KV head (its G query heads share every K/V load).
  // Small batches run on the calling thread: waking the other OpenMP thread (it sleeps under
  // OMP_WAIT_POLICY=PASSIVE) costs more than their work.
  int64_t total_positions = 0;
  for (int64_t n = 0; n < N; ++n) total_positions += lens[n];
  const int64_t grain = total_positions * Hkv < PARALLEL_MIN_POSITIONS ? N * Hkv + 1 : 1;
  at::parallel_for(0, N * Hkv, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> qf(G * D), acc(G * D), scores;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t n = item / Hkv, h = item % Hkv;
      const int64_t ctx = lens[n];
      const int32_t* table = bt + seq[n] * max_blocks;
      scores.assign(G * ctx, 0.f);
      for (int64_t g = 0; g < G; ++g) {
        const T* src = qp + (n * Hq + h * G + g) * D;
        for (int64_t d = 0; d < D; ++d) qf[g * D + d] = to_float(src[d]) * fscale;
      }
#if defined(__AVX512F__)
      if (D == 64 || D == 128) {
        const KV* kb = kp + h * D;
        const KV* vb = vp + h * D;
        if (D == 64 && attend_grouped_d64<KV>(G, qf.data(), kb, vb, table, block_size, ctx,
                                             token_stride, scores.data(), acc.data())) {
          // done by the grouped kernel
        } else if (D == 64)
          attend_item_avx512<KV, 4>(qf.data(), G, kb, vb, table, block_size, ctx, token_stride,
                                   scores.data(), acc.data());
        else
          attend_item_avx512<KV, 8>(qf.data(), G, kb, vb, table, block_size, ctx, token_stride,
                                   scores.data(), acc.data());
        for (int64_t g = 0; g < G; ++g) {
          T* dst = op + (n * Hq + h * G + g) * D;
          for (int64_t d = 0; d < D; ++d) dst[d] = from_float<T>(acc[g * D + d]);
        }
        continue;
      }
#endif
      // scores[g, pos] = q_g . k_pos
      for (int64_t pos = 0; pos < ctx; ++pos) {
        const int64_t slot = static_cast<int64_t>(table[pos / block_size]) * block_size + pos % block_size;
        const KV* krow = kp + slot * token_stride + h * D;
        for (int64_t g = 0; g < G; ++g) {
          const float* qg = qf.data() + g * D;
          float dot = 0.f;
#pragma omp simd reduction(+ : dot)
          for (int64_t d = 0; d < D; ++d) dot += qg[d] * to_float(krow[d]);
          scores[g * ctx + pos] = dot;
        }
      }
      // softmax over positions, per query head
      for (int64_t g = 0; g < G; ++g) {
        float* s = scores.data() + g * ctx;
        float mx = -INFINITY;
        for (int64_t pos = 0; pos < ctx; ++pos) mx = s[pos] > mx ? s[pos] : mx;
        float sum = 0.f;
        for (int64_t pos = 0; pos < ctx; ++pos) {
          s[pos] = std::exp(s[pos] - mx);
          sum += s[pos];
        }
        const float inv = 1.f / sum;
        for (int64_t pos = 0; pos < ctx; ++pos) s[pos] *= inv;
      }
      // acc[g] = sum_pos p[g, pos] * v_pos
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t pos = 0; pos < ctx; ++pos) {
        const int64_t slot = static_cast<int64_t>(table[pos / block_size]) * block_size + pos % block_size;
        const KV* vrow = vp + slot * token_stride + h * D;
        for (int64_t g = 0; g < G; ++g) {
          const float p = scores[g * ctx + pos];
          float* a = acc.data() + g * D;
#pragma omp simd
          for (int64_t d = 0; d < D; ++d) a[d] += p * to_float(vrow[d]);
        }
      }
      for (int64_t g = 0; g < G; ++g) {
        T* dst = op + (n * Hq + h * G + g) * D;
        for (int64_t d = 0; d < D; ++d) dst[d] = from_float<T>(acc[g * D + d]);
      }
    }
  });
}


#if CADENCE_HAVE_AVX2
// float32 on every tier with AVX2 (head_dim 64 / 128): (row, span) items over
// avx2::attend_span_f32, as in the fused float32 stack, then a merge per (row, head) in span
// order. Serves every row of the steps the stack does not take (mixed prefill + decode steps,
// long prompt chunks, batches over its row cap): one arithmetic per row whatever its step
// (batch-invariant greedy results, attention_cpu.py). The AVX-512 tiers take it too.
// KV: the cache's storage type (float, c10::Half or c10::BFloat16; attention_f32.h).
template <typename KV>
void paged_attention_f32_avx2(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                              const at::Tensor& block_tables, const at::Tensor& row_seq,
                              const at::Tensor& ctx_lens, double scale, int64_t window, at::Tensor& out) {
  const int64_t N = q.size(0), Hq = q.size(1), D = q.size(2);
  const int64_t block_size = k_cache.size(1), Hkv = k_cache.size(2), G = Hq / Hkv;
  const int64_t max_blocks = block_tables.size(1);
  const float* qp = q.data_ptr<float>();
  const KV* kp = k_cache.data_ptr<KV>();
  const KV* vp = v_cache.data_ptr<KV>();
  float* op = out.data_ptr<float>();
  const int32_t* bt = block_tables.data_ptr<int32_t>();
  const int64_t* seq = row_seq.data_ptr<int64_t>();
  const int64_t* lens = ctx_lens.data_ptr<int64_t>();
  avx2::SpanItems plan(lens, seq, N, Hq, D, window);
  const int64_t total_positions = std::accumulate(lens, lens + N, int64_t{0});
  // Small batches run on the calling thread (waking the sleeping OpenMP team costs more).
  const bool parallel = total_positions * Hkv >= PARALLEL_MIN_POSITIONS;
  const float fscale = static_cast<float>(scale);
  // Tiles: runs of up to ROW_TILE rows of one sequence at consecutive positions (prompt chunks),
  // each computed span by span with attend_rows_span_f32; a tile of one row (a decode) runs
  // attend_span_f32. Both give every (row, span) item the same partials (attention_f32.h). A row
  // whose window starts after position 0 (its spans start where its keys do) is a tile of its own.
  std::vector<int64_t> tile_row, tile_first, tile_spans, work_tile, work_span;
  int64_t max_spans = 0;
  for (int64_t n = 0; n < N;) {
    int64_t c = 1;
    while (n + c < N && c < avx2::ROW_TILE && seq[n + c] == seq[n] && lens[n + c] == lens[n + c - 1] + 1 &&
           plan.first_pos[n] == 0 && plan.first_pos[n + c] == 0)
      ++c;
    tile_row.push_back(n);
    tile_first.push_back(plan.first_span(n));
    tile_spans.push_back(avx2::num_spans(lens[n + c - 1]));
    max_spans = std::max(max_spans, tile_spans.back());
    n += c;
  }
  tile_row.push_back(N);
  // Span-major: the tiles that reach span s one after the other, so the span's K/V rows (384 KB
  // at Hkv 3, D 64) stay in L2 from one tile to the next instead of being read from L3 (or
  // memory) again for every tile of a long prompt.
  for (int64_t s = 0; s < max_spans; ++s)
    for (int64_t t = static_cast<int64_t>(tile_spans.size()) - 1; t >= 0; --t)
      if (tile_first[t] <= s && tile_spans[t] > s) {
        work_tile.push_back(t);
        work_span.push_back(s);
      }
  const int64_t works = static_cast<int64_t>(work_tile.size());
  // Handed out dynamically: a thread slowed by a busy neighbour takes fewer of them.
  for_items_dynamic(works, !parallel, [&](int64_t w) {
    const avx2::FlushDenormals ftz;
    thread_local std::vector<float> scores;
    scores.resize(static_cast<size_t>(avx2::ROW_TILE * Hq * avx2::ATTN_SPAN));
    {
      const int64_t t = work_tile[w], s = work_span[w];
      const int64_t p0 = s * avx2::ATTN_SPAN;
      int64_t first = tile_row[t];
      const int64_t last = tile_row[t + 1];
      while (lens[first] <= p0) ++first;  // rows whose context ends before this span
      const int32_t* table = bt + seq[first] * max_blocks;
      if (last - first == 1 && tile_row[t + 1] - tile_row[t] == 1) {
        const int64_t i = plan.base[first] + s - plan.first_span(first);
        const auto [q0, q1] = plan.positions(i, lens[first]);
        avx2::dispatch_f32_head_dim(D, [&](auto dim) {
          avx2::attend_span_f32<decltype(dim)::value, KV>(qp + first * Hq * D, G, Hkv, kp, vp, table, block_size, q0,
                                                          q1, fscale, scores.data(), plan.max_of(i), plan.sum_of(i),
                                                          plan.acc_of(i), plan.copy[first]);
        });
        return;
      }
      const int rows = static_cast<int>(last - first);
      float* mx[avx2::ROW_TILE];
      float* sm[avx2::ROW_TILE];
      float* acc[avx2::ROW_TILE];
      for (int r = 0; r < rows; ++r) {
        const int64_t i = plan.base[first + r] + s;
        mx[r] = plan.max_of(i);
        sm[r] = plan.sum_of(i);
        acc[r] = plan.acc_of(i);
      }
      avx2::dispatch_f32_head_dim(D, [&](auto dim) {
        avx2::attend_rows_span_f32<decltype(dim)::value, KV>(qp + first * Hq * D, Hq * D, rows, G, Hkv, kp, vp, table,
                                                             block_size, p0, lens + first, fscale, scores.data(), mx,
                                                             sm, acc);
      });
    }
  });
  at::parallel_for(0, N * Hq, parallel ? 1 : N * Hq + 1, [&](int64_t begin, int64_t end) {
    std::vector<float> mx, sm;
    for (int64_t nh = begin; nh < end; ++nh)
      avx2::merge_row_head(plan, nh / Hq, nh % Hq, mx, sm, op + nh * D);
  });
}
#endif

#if CADENCE_HAVE_AVX512BF16
// bf16 fast path: (row, span) items over attend_span_bf16, then a merge per row. Few rows with
// long contexts are split into spans so that every thread has work.
void paged_attention_bf16(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                          const at::Tensor& block_tables, const at::Tensor& row_seq,
                          const at::Tensor& ctx_lens, double scale, at::Tensor& out) {
  const int64_t N = q.size(0), Hq = q.size(1), D = q.size(2);
  const int64_t block_size = k_cache.size(1), Hkv = k_cache.size(2);
  const int64_t max_blocks = block_tables.size(1);
  const uint16_t* qp = reinterpret_cast<const uint16_t*>(q.data_ptr<c10::BFloat16>());
  const uint16_t* kp = reinterpret_cast<const uint16_t*>(k_cache.data_ptr<c10::BFloat16>());
  const uint16_t* vp = reinterpret_cast<const uint16_t*>(v_cache.data_ptr<c10::BFloat16>());
  uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>());
  const int32_t* bt = block_tables.data_ptr<int32_t>();
  const int64_t* seq = row_seq.data_ptr<int64_t>();
  const int64_t* lens = ctx_lens.data_ptr<int64_t>();
  int64_t total_positions = 0;
  for (int64_t n = 0; n < N; ++n) total_positions += lens[n];
  const bool parallel = total_positions * Hkv >= PARALLEL_MIN_POSITIONS;
  const int64_t threads = parallel ? at::get_num_threads() : 1;
  SpanPlan plan(lens, N, threads, Hq, Hkv, D);
  const int64_t items = plan.items();
  const float fscale = static_cast<float>(scale);
  at::parallel_for(0, items, parallel ? 1 : items + 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scratch;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t n = plan.row(i);
      // This thread's next item (its keys stream in while this one sums values).
      const NextSpan next{i + 1 < end ? bt + seq[plan.row(i + 1)] * max_blocks : nullptr,
                          i + 1 < end ? plan.p0(i + 1) : 0, i + 1 < end ? plan.p1(i + 1) : 0};
      scratch.resize(attend_scratch_floats(Hq, D, plan.p1(i) - plan.p0(i)));
      dispatch_head_dim(D, [&](auto dim) {
        attend_span_bf16<decltype(dim)::value>(qp + n * Hq * D, Hq, Hkv, kp, vp, bt + seq[n] * max_blocks,
                                               block_size, plan.p0(i), plan.p1(i), fscale,
                                               scratch.data(), plan.part(i), i + 1 < end ? &next : nullptr);
      });
    }
  });
  for (int64_t n = 0; n < N; ++n) plan.merge_row(n, op + n * Hq * D);
}
#endif

at::Tensor paged_attention(at::Tensor q, at::Tensor k_cache, at::Tensor v_cache,
                              at::Tensor block_tables, at::Tensor row_seq,
                              at::Tensor ctx_lens, double scale, int64_t window) {
  check_cpu_contiguous(q, "q");
  check_cpu_contiguous(k_cache, "k_cache");
  check_cpu_contiguous(v_cache, "v_cache");
  check_cpu_contiguous(block_tables, "block_tables");
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(),
              "paged_attention: q [N, Hq, D], caches [blocks, block_size, Hkv, D]");
  // Caches in q's dtype, or float16 / bf16 under float32 queries (a 16-bit KV cache of the float32
  // path: loads widen to float32, the arithmetic is float32's).
  const auto cache_type = k_cache.scalar_type();
  TORCH_CHECK(v_cache.scalar_type() == cache_type &&
                  (q.scalar_type() == cache_type ||
                   (q.scalar_type() == at::kFloat && (cache_type == at::kHalf || cache_type == at::kBFloat16))),
              "paged_attention: caches must share q's dtype, or be float16 / bfloat16 under float32 q");
  TORCH_CHECK(q.size(2) == k_cache.size(3) && q.size(1) % k_cache.size(2) == 0,
              "paged_attention: head_dim mismatch or Hq not a multiple of Hkv");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt, "block_tables must be int32");
  auto seq = row_seq.to(at::kLong).contiguous();
  auto lens = ctx_lens.to(at::kLong).contiguous();
  TORCH_CHECK(seq.numel() == q.size(0) && lens.numel() == q.size(0),
              "paged_attention: one row_seq / ctx_len per query row");
  // Every block id a row can read must lie in the pool: a bad table must fail, not read
  // arbitrary memory.
  {
    const int64_t rows = block_tables.size(0), width = block_tables.size(1);
    const int64_t pool = k_cache.size(0), block_size = k_cache.size(1);
    const int32_t* bt = block_tables.data_ptr<int32_t>();
    const int64_t* sp = seq.data_ptr<int64_t>();
    const int64_t* lp = lens.data_ptr<int64_t>();
    for (int64_t n = 0; n < seq.numel(); ++n) {
      TORCH_CHECK(sp[n] >= 0 && sp[n] < rows, "paged_attention: row_seq ", sp[n], " outside block_tables");
      TORCH_CHECK(lp[n] > 0 && lp[n] <= width * block_size, "paged_attention: ctx_len ", lp[n],
                  " outside (0, ", width * block_size, "]");
      const int64_t used = (lp[n] + block_size - 1) / block_size;
      for (int64_t b = 0; b < used; ++b)
        TORCH_CHECK(bt[sp[n] * width + b] >= 0 && bt[sp[n] * width + b] < pool,
                    "paged_attention: block id ", bt[sp[n] * width + b], " outside pool of ", pool);
    }
  }
  auto out = at::empty_like(q);
  if (q.scalar_type() == at::kFloat) {
    auto by_cache = [&](auto kv_tag) {
      using KV = decltype(kv_tag);
#if CADENCE_HAVE_AVX2
      if (avx2::f32_head_dim(q.size(2))) {
        paged_attention_f32_avx2<KV>(q, k_cache, v_cache, block_tables, seq, lens, scale, window, out);
        return;
      }
#endif
      TORCH_CHECK(window == 0, "paged_attention: a window needs float32 on an AVX2 build, head_dim 64 / 128 / 256");
      paged_attention_impl<float, KV>(q, k_cache, v_cache, block_tables, seq, lens, scale, out);
    };
    if (cache_type == at::kHalf) by_cache(c10::Half{});
    else if (cache_type == at::kBFloat16) by_cache(c10::BFloat16{});
    else by_cache(float{});
  } else if (q.scalar_type() == at::kBFloat16) {
    TORCH_CHECK(window == 0, "paged_attention: a window needs float32 on an AVX2 build");
#if CADENCE_HAVE_AVX512BF16
    if (decode_attention_supports(q.size(2))) {
      paged_attention_bf16(q, k_cache, v_cache, block_tables, seq, lens, scale, out);
      return out;
    }
#endif
    paged_attention_impl<c10::BFloat16>(q, k_cache, v_cache, block_tables, seq, lens, scale, out);
  } else {
    TORCH_CHECK(false, "paged_attention: float32 or bfloat16 only");
  }
  return out;
}

}  // namespace cadence_kernels
