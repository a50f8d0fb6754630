// Decode attention over a float32 paged cache (the AVX2 tier's fused stack and paged_attention):
// every query head of one row over a span of its context, read straight from the cache blocks.
//
// Work items are (row, span) with spans cut at fixed multiples of ATTN_SPAN positions, so the
// items, their partial sums and the merge order depend only on each row's context length: never
// on the batch, the thread count or which thread runs an item (batch-invariant results). An item
// covers all KV heads: a cache position holds its heads side by side ([Hkv, D] contiguous), so
// one item streams whole rows (768 bytes at Hkv 3, D 64) instead of three items each reading a
// strided quarter of them, and a row's few items still spread over the team at long contexts.
// Each item returns unnormalised partials (max, sum of exp, weighted value sum) per query head;
// merge_partials combines a row's spans (flash-decoding).
//
// An item of a row whose sequence has no other row in the step (a decode row) first copies its
// span's K rows (later its V rows) block by block into a contiguous per-thread buffer and
// computes from there: the cache blocks of a real pool are scattered, and computing straight
// from them, even with software prefetch, read them at a third of the rate a plain copy of each
// block reaches (Zen 4, 2 threads, batch 32 at context 512: 2.2-2.8 ms a layer from the blocks,
// 1.25-1.3 ms with the copy; the copy, 196 KB at Hkv 3, D 64, stays in L2). The rows of a prompt
// chunk share their sequence's blocks, which the first of them brings into the caches: they
// compute in place (a 32-token chunk at context 512 took 1.5x as long with the copies).
#pragma once

#include <algorithm>
#include <cstring>
#include <cstdint>
#include <numeric>
#include <type_traits>
#include <utility>
#include <vector>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include "vec8.h"

namespace cadence_kernels {
namespace avx2 {

// Positions per item: its K and V rows of all heads (192 KB each at Hkv 3, D 64) stay in a
// 512 KB L2 while the query heads re-read them.
constexpr int64_t ATTN_SPAN = 256;

inline int64_t num_spans(int64_t ctx_len) { return (ctx_len + ATTN_SPAN - 1) / ATTN_SPAN; }

#if CADENCE_HAVE_AVX2

// 8 cache values widened to float32: the cache stores K/V as float32, float16 (F16C's
// vcvtph2ps, on every x86 tier) or bf16 (a shift); attention computes in float32 either way, a
// 16-bit cache halves the bytes each position streams.
inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const c10::BFloat16* p) { return load_bf16(reinterpret_cast<const uint16_t*>(p)); }
inline __m256 load8(const c10::Half* p) {
#if defined(__F16C__)
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
#else
  alignas(32) float f[8];
  for (int i = 0; i < 8; ++i) f[i] = static_cast<float>(p[i]);
  return _mm256_load_ps(f);
#endif
}

// Query heads of one KV head computed together: 3 x 4 accumulators (+ 3 query or weight
// vectors + 1 K/V vector) fill the 16 ymm registers.
constexpr int HEADS_PER_PASS = 3;
// A decode row's passes (attend_span_f32: 4 keys per score group, 32 dims per value group) with
// AVX-512VL's 32 registers: 4 x 4 accumulators + 4 + 1, so a GQA group of 4 query heads (Llama
// 3.2 1B, 3.1 8B) reads and widens each K / V vector once instead of in a pass of 3 and one of 1
// (1B, batch 32 at context 512, float16 KV: see docs/performance.md). Which heads share a pass
// never changes a score's or a value sum's operations: the same bits.
#if defined(__AVX512VL__)
constexpr int DECODE_HEADS_PER_PASS = 4;
#else
constexpr int DECODE_HEADS_PER_PASS = HEADS_PER_PASS;
#endif

template <int MAX = HEADS_PER_PASS, typename F>
inline void dispatch_heads(int heads, F&& f) {
  switch (heads) {
    case 1: f(std::integral_constant<int, 1>{}); break;
    case 2: f(std::integral_constant<int, 2>{}); break;
    case 3: f(std::integral_constant<int, 3>{}); break;
    default: f(std::integral_constant<int, MAX>{}); break;
  }
}

// Prefetch into L2 the `bytes` at each of the rows[0 .. n) (plus off elements): the V rows a
// decode row's value pass reads, fetched while its score pass computes (their memory latency
// hidden behind the dot products instead of exposed in the copy that follows).
template <typename KV>
inline void prefetch_rows(const KV* const* rows, int64_t off, int n, int64_t bytes) {
  for (int j = 0; j < n; ++j)
    for (int64_t b = 0; b < bytes; b += 64)
      _mm_prefetch(reinterpret_cast<const char*>(rows[j] + off) + b, _MM_HINT_T1);
}

// The K rows of the span a thread attends next (same layer), fetched into L2 line by line while
// this span's value pass runs: a decode row's item starts by copying its K rows from DRAM, and
// with nothing computing during that copy the 8B shape's attention (8 KV heads x 128 dims: 512 KB
// of float16 K per item) spent ~40% of its time in it (batch 32 at context 512, AVX2). The value
// pass reads its V rows from L2 (copied there from the lines its score pass prefetched), so DRAM
// is otherwise idle during it. Prefetches change no arithmetic.
template <typename KV>
class NextKRows {
 public:
  NextKRows() = default;
  // Positions [p0, p1) of the sequence with block table `table`, rows of `row_bytes` at `stride`
  // elements apart in kc.
  NextKRows(const KV* kc, const int32_t* table, int64_t block_size, int64_t stride, int64_t p0, int64_t p1)
      : kc_(kc), table_(table), block_size_(block_size), stride_(stride), pos_(p0), end_(p1),
        row_lines_(stride * static_cast<int64_t>(sizeof(KV)) / 64) {}
  // One more line of the next span's K rows (none once all are fetched).
  void step() {
    if (pos_ >= end_) return;
    if (line_ == 0) row_ = reinterpret_cast<const char*>(kc_ + slot(pos_) * stride_);
    _mm_prefetch(row_ + 64 * line_, _MM_HINT_T1);
    if (++line_ == row_lines_) {
      line_ = 0;
      ++pos_;
    }
  }
  // Lines left to fetch.
  int64_t left() const { return pos_ >= end_ ? 0 : (end_ - pos_) * row_lines_ - line_; }

 private:
  int64_t slot(int64_t pos) const {
    return static_cast<int64_t>(table_[pos / block_size_]) * block_size_ + pos % block_size_;
  }
  const KV* kc_ = nullptr;
  const int32_t* table_ = nullptr;
  int64_t block_size_ = 1, stride_ = 0, pos_ = 0, end_ = 0, row_lines_ = 1, line_ = 0;
  const char* row_ = nullptr;
};

// Lane i of the result: the horizontal sum of v[i].
inline __m128 transpose_sum4(const __m256 v[4]) {
  const __m256 a = _mm256_hadd_ps(v[0], v[1]);
  const __m256 b = _mm256_hadd_ps(v[2], v[3]);
  const __m256 c = _mm256_hadd_ps(a, b);  // per 128 lane: half-sums of v0, v1, v2, v3
  return _mm_add_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1));
}

// scores[h][i] = scale * q_h . k_i for HC query heads (q [HC, D]) over the span's K rows (at
// element koff of each row).
// vrow (may be null): the span's V rows, their elements at koff prefetched (prefetch_rows).
template <int D, int HC, typename KV>
inline void scores_pass(const float* q, const KV* const* krow, int64_t koff, int64_t span, float scale,
                        float* scores, const KV* const* vrow = nullptr) {
  constexpr int DC = D / 8;
  const __m128 vscale = _mm_set1_ps(scale);
  for (int64_t i0 = 0; i0 < span; i0 += 4) {
    const int count = static_cast<int>(std::min<int64_t>(4, span - i0));
    if (vrow != nullptr) prefetch_rows(vrow + i0, koff, count, D * static_cast<int64_t>(sizeof(KV)));
    const KV* k4[4];
    for (int j = 0; j < 4; ++j) k4[j] = krow[i0 + std::min(j, count - 1)] + koff;
    __m256 acc[HC][4];
    for (int h = 0; h < HC; ++h)
      for (int j = 0; j < 4; ++j) acc[h][j] = _mm256_setzero_ps();
    for (int c = 0; c < DC; ++c) {
      __m256 qv[HC];
      for (int h = 0; h < HC; ++h) qv[h] = _mm256_loadu_ps(q + h * D + 8 * c);
      for (int j = 0; j < 4; ++j) {
        const __m256 kv = load8(k4[j] + 8 * c);
        for (int h = 0; h < HC; ++h) acc[h][j] = _mm256_fmadd_ps(qv[h], kv, acc[h][j]);
      }
    }
    for (int h = 0; h < HC; ++h) {
      const __m128 s = _mm_mul_ps(transpose_sum4(acc[h]), vscale);
      float* dst = scores + h * ATTN_SPAN + i0;
      if (count == 4) _mm_storeu_ps(dst, s);
      else _mm_maskstore_ps(dst, _mm256_castsi256_si128(first_lanes(count)), s);
    }
  }
}

// scores_pass with 8 keys per group: the same scores bit for bit (each key's 8 lane sums reduced
// by the same tree: transpose_sum8 and transpose_sum4 both add lanes (0+1)+(2+3), then the two
// 128-bit halves), with 8 keys per q load and a cheaper reduction per score. Its 3 x 8
// accumulators need the 32 vector registers of AVX-512VL; elsewhere it is scores_pass.
template <int D, int HC, typename KV>
inline void scores_pass_wide(const float* q, const KV* const* krow, int64_t koff, int64_t span, float scale,
                             float* scores) {
#if defined(__AVX512VL__)
  constexpr int DC = D / 8;
  const __m256 vscale = _mm256_set1_ps(scale);
  for (int64_t i0 = 0; i0 < span; i0 += 8) {
    const int count = static_cast<int>(std::min<int64_t>(8, span - i0));
    const KV* k8[8];
    for (int j = 0; j < 8; ++j) k8[j] = krow[i0 + std::min(j, count - 1)] + koff;
    __m256 acc[HC][8];
    for (int h = 0; h < HC; ++h)
      for (int j = 0; j < 8; ++j) acc[h][j] = _mm256_setzero_ps();
    for (int c = 0; c < DC; ++c) {
      __m256 qv[HC];
      for (int h = 0; h < HC; ++h) qv[h] = _mm256_loadu_ps(q + h * D + 8 * c);
      for (int j = 0; j < 8; ++j) {
        const __m256 kv = load8(k8[j] + 8 * c);
        for (int h = 0; h < HC; ++h) acc[h][j] = _mm256_fmadd_ps(qv[h], kv, acc[h][j]);
      }
    }
    for (int h = 0; h < HC; ++h) {
      const __m256 sv = _mm256_mul_ps(transpose_sum8(acc[h]), vscale);
      store_n(scores + h * ATTN_SPAN + i0, sv, count);
    }
  }
#else
  scores_pass<D, HC, KV>(q, krow, koff, span, scale, scores);
#endif
}

// acc[h] = sum_i p[h][i] * v_i for HC query heads (weights p rows ATTN_SPAN apart) over the V rows
// [i0, i1) of the span (at element voff of each row), 32 dims at a time, key by key in order:
// from zero when `first`, else continuing the sums in acc_io (a span taken in pieces sums exactly
// as in one pass).
// next_k (may be null): a line of the next span's K rows fetched every 2^line_shift keys.
template <int D, int HC, typename KV>
inline void values_range(const float* p, const KV* const* vrow, int64_t voff, int64_t i0, int64_t i1,
                         float* acc_io, bool first, NextKRows<KV>* next_k = nullptr, int line_shift = 0) {
  for (int d0 = 0; d0 < D; d0 += 32) {
    __m256 acc[HC][4];
    for (int h = 0; h < HC; ++h)
      for (int c = 0; c < 4; ++c)
        acc[h][c] = first ? _mm256_setzero_ps() : _mm256_loadu_ps(acc_io + h * D + d0 + 8 * c);
    for (int64_t i = i0; i < i1; ++i) {
      if (next_k != nullptr && (i & ((int64_t{1} << line_shift) - 1)) == 0) next_k->step();
      __m256 w[HC];
      for (int h = 0; h < HC; ++h) w[h] = _mm256_broadcast_ss(p + h * ATTN_SPAN + i);
      const KV* v = vrow[i] + voff + d0;
      for (int c = 0; c < 4; ++c) {
        const __m256 vv = load8(v + 8 * c);
        for (int h = 0; h < HC; ++h) acc[h][c] = _mm256_fmadd_ps(w[h], vv, acc[h][c]);
      }
    }
    for (int h = 0; h < HC; ++h)
      for (int c = 0; c < 4; ++c) _mm256_storeu_ps(acc_io + h * D + d0 + 8 * c, acc[h][c]);
  }
}

template <int D, int HC, typename KV>
inline void values_pass(const float* p, const KV* const* vrow, int64_t voff, int64_t span, float* acc_out,
                        NextKRows<KV>* next_k = nullptr, int line_shift = 0) {
  values_range<D, HC, KV>(p, vrow, voff, 0, span, acc_out, true, next_k, line_shift);
}

// q: the row's Hq = G * Hkv query heads [Hq, D] (head h reads KV head h / G); kc, vc: the layer's
// caches [blocks, block_size, Hkv, D] in storage type KV (float, c10::Half or c10::BFloat16); positions [p0, p1) of the sequence with block table
// `table`. scores: Hq * ATTN_SPAN floats of scratch. Writes max[Hq], sum[Hq], acc[Hq, D].
template <int D, typename KV = float>
void attend_span_f32(const float* q, int64_t G, int64_t Hkv, const KV* kc, const KV* vc,
                     const int32_t* table, int64_t block_size, int64_t p0, int64_t p1, float scale,
                     float* scores, float* max_out, float* sum_out, float* acc_out, bool copy_rows,
                     NextKRows<KV> next_k = {}) {
  static_assert(D % 32 == 0, "head_dim must be a multiple of 32");
  const int64_t stride = Hkv * D, Hq = G * Hkv;
  const int64_t span = p1 - p0;
  const int64_t row_bytes = stride * static_cast<int64_t>(sizeof(KV));
  // Each position's K and V rows, found once per span by walking the block table (a division
  // per position and head cost more than the dot products).
  const KV* krow[ATTN_SPAN];
  const KV* vrow[ATTN_SPAN];
  for (int64_t pos = p0, i = 0; pos < p1;) {
    const int64_t off = pos % block_size, count = std::min(block_size - off, p1 - pos);
    const int64_t slot = static_cast<int64_t>(table[pos / block_size]) * block_size + off;
    for (int64_t j = 0; j < count; ++j, ++i) {
      krow[i] = kc + (slot + j) * stride;
      vrow[i] = vc + (slot + j) * stride;
    }
    pos += count;
  }
  // With copy_rows, the span's rows copied into `gathered` (one memcpy per run of adjacent
  // rows: a block, or several adjacent blocks), `rows` repointed at the copies.
  // Grown, never shrunk: a resize up value-initialises its new elements, and a thread taking a
  // row's full span after a short last one zero-filled ~80 KB each time (SmolLM2 b3 at context
  // 300: the resize took half as many cycles as attend_span_f32 itself, perf record).
  thread_local std::vector<KV> gathered;
  if (copy_rows && gathered.size() < static_cast<size_t>(span * stride))
    gathered.resize(static_cast<size_t>(span * stride));
  auto gather = [&](const KV** rows) {
    if (!copy_rows) return;
    KV* dst = gathered.data();
    for (int64_t i = 0; i < span;) {
      int64_t n = 1;
      while (i + n < span && rows[i + n] == rows[i] + n * stride) ++n;
      std::memcpy(dst + i * stride, rows[i], static_cast<size_t>(n * row_bytes));
      for (int64_t j = 0; j < n; ++j) rows[i + j] = dst + (i + j) * stride;
      i += n;
    }
  };
  gather(krow);
  // Pass 1: scores[h, i] = scale * q_h . k_(p0 + i), per KV head for up to
  // DECODE_HEADS_PER_PASS of its query heads at once (each K load feeds all of them), 4
  // positions at a time; the first pass of each KV head prefetches its V elements.
  for (int64_t kh = 0; kh < Hkv; ++kh)
    for (int64_t g0 = 0; g0 < G; g0 += DECODE_HEADS_PER_PASS) {
      const int64_t h0 = kh * G + g0;
      const int heads = static_cast<int>(std::min<int64_t>(DECODE_HEADS_PER_PASS, G - g0));
      dispatch_heads<DECODE_HEADS_PER_PASS>(heads, [&](auto hc) {
        scores_pass<D, decltype(hc)::value, KV>(q + h0 * D, krow, kh * D, span, scale, scores + h0 * ATTN_SPAN,
                                                g0 == 0 ? vrow : nullptr);
      });
    }
  // Pass 2: p = exp(s - max) in place, per head.
  for (int64_t h = 0; h < Hq; ++h) {
    const auto [m, total] = exp_shifted_inplace(scores + h * ATTN_SPAN, span);
    max_out[h] = m;
    sum_out[h] = total;
  }
  gather(vrow);
  // Pass 3: acc[h] = sum_i p[h, i] * v_(p0 + i), per KV head for up to DECODE_HEADS_PER_PASS
  // of its query heads at once and 32 dims at a time (each V load feeds all of them); the next
  // span's K lines spread evenly over the pass's key steps.
  const int64_t key_steps = Hkv * ((G + DECODE_HEADS_PER_PASS - 1) / DECODE_HEADS_PER_PASS) * (D / 32) * span;
  const int64_t lines = next_k.left();
  int line_shift = 0;
  while (lines > 0 && (key_steps >> (line_shift + 1)) >= lines) ++line_shift;
  NextKRows<KV>* prefetch = lines > 0 ? &next_k : nullptr;
  for (int64_t kh = 0; kh < Hkv; ++kh)
    for (int64_t g0 = 0; g0 < G; g0 += DECODE_HEADS_PER_PASS) {
      const int64_t h0 = kh * G + g0;
      const int heads = static_cast<int>(std::min<int64_t>(DECODE_HEADS_PER_PASS, G - g0));
      dispatch_heads<DECODE_HEADS_PER_PASS>(heads, [&](auto hc) {
        values_pass<D, decltype(hc)::value, KV>(scores + h0 * ATTN_SPAN, vrow, kh * D, span, acc_out + h0 * D,
                                                prefetch, line_shift);
      });
    }
}

// Rows of a prompt chunk per tile of attend_rows_span_f32, and keys per piece of its passes: a
// piece's K (or V) rows of one KV head (8 KB at D 64) stay in L1 while every row of the tile reads
// them (G * ROW_TILE query heads, 24 at G 3, as many as the flash kernel's stacked rows), where
// attend_span_f32 row by row would stream the span's rows from L2 once per row.
constexpr int ROW_TILE = 8;
constexpr int64_t KEY_PIECE = 32;

// The partials of `rows` (<= ROW_TILE) query rows of one sequence at consecutive positions
// (row r's context length lens[r] = lens[0] + r, every one > p0) over the span at p0: for each row
// exactly what attend_span_f32 computes for it over [p0, min(lens[r], p0 + ATTN_SPAN)) -- the same
// scores (each an 8-lane sum over D, reduced by the same tree), the same exp and sum pass over the
// row's own keys, the same value sums key by key -- so a prompt token's attention is bit-identical
// to what it would be as a decode row or in a short chunk of the fused stack (batch-invariant).
// Only the loop order differs: keys in pieces of KEY_PIECE, all rows of the tile per piece.
// q: row r's heads at q + r * q_stride ([Hq, D]); scores: ROW_TILE * Hq * ATTN_SPAN floats of
// scratch; max_out[r] [Hq], sum_out[r] [Hq], acc_out[r] [Hq, D]: row r's item partials.
template <int D, typename KV = float>
void attend_rows_span_f32(const float* q, int64_t q_stride, int rows, int64_t G, int64_t Hkv, const KV* kc,
                          const KV* vc, const int32_t* table, int64_t block_size, int64_t p0, const int64_t* lens,
                          float scale, float* scores, float* const* max_out, float* const* sum_out,
                          float* const* acc_out) {
  static_assert(D % 32 == 0, "head_dim must be a multiple of 32");
  const int64_t stride = Hkv * D, Hq = G * Hkv;
  int64_t span_of[ROW_TILE];
  for (int r = 0; r < rows; ++r) span_of[r] = std::min(lens[r], p0 + ATTN_SPAN) - p0;
  const int64_t span = span_of[rows - 1];
  const KV* krow[ATTN_SPAN];
  const KV* vrow[ATTN_SPAN];
  for (int64_t pos = p0, i = 0; pos < p0 + span;) {
    const int64_t off = pos % block_size, count = std::min(block_size - off, p0 + span - pos);
    const int64_t slot = static_cast<int64_t>(table[pos / block_size]) * block_size + off;
    for (int64_t j = 0; j < count; ++j, ++i) {
      krow[i] = kc + (slot + j) * stride;
      vrow[i] = vc + (slot + j) * stride;
    }
    pos += count;
  }
  auto row_scores = [&](int r, int64_t h) { return scores + (r * Hq + h) * ATTN_SPAN; };
  // One KV head at a time: its query heads' scores of the tile's rows (rows * G * ATTN_SPAN
  // floats: 24 KB at 8 rows) stay in L1 from the score pass through the value pass.
  for (int64_t kh = 0; kh < Hkv; ++kh) {
    // Pass 1: scores, piece by piece of keys.
    for (int64_t i0 = 0; i0 < span; i0 += KEY_PIECE)
      for (int r = 0; r < rows; ++r) {
        const int64_t n = std::min(span_of[r], i0 + KEY_PIECE) - i0;
        if (n <= 0) continue;
        for (int64_t g0 = 0; g0 < G; g0 += HEADS_PER_PASS) {
          const int64_t h0 = kh * G + g0;
          const int heads = static_cast<int>(std::min<int64_t>(HEADS_PER_PASS, G - g0));
          dispatch_heads(heads, [&](auto hc) {
            scores_pass_wide<D, decltype(hc)::value, KV>(q + r * q_stride + h0 * D, krow + i0, kh * D, n, scale,
                                                     row_scores(r, h0) + i0);
          });
        }
      }
    // Pass 2: each row's p = exp(s - max) over its own keys.
    for (int r = 0; r < rows; ++r)
      for (int64_t h = kh * G; h < (kh + 1) * G; ++h) {
        const auto [m, total] = exp_shifted_inplace(row_scores(r, h), span_of[r]);
        max_out[r][h] = m;
        sum_out[r][h] = total;
      }
    // Pass 3: value sums, piece by piece of keys, continuing each row's sums in its acc.
    for (int64_t i0 = 0; i0 < span; i0 += KEY_PIECE)
      for (int r = 0; r < rows; ++r) {
        const int64_t i1 = std::min(span_of[r], i0 + KEY_PIECE);
        if (i1 <= i0) continue;
        for (int64_t g0 = 0; g0 < G; g0 += HEADS_PER_PASS) {
          const int64_t h0 = kh * G + g0;
          const int heads = static_cast<int>(std::min<int64_t>(HEADS_PER_PASS, G - g0));
          dispatch_heads(heads, [&](auto hc) {
            values_range<D, decltype(hc)::value, KV>(row_scores(r, h0), vrow, kh * D, i0, i1, acc_out[r] + h0 * D,
                                                 i0 == 0);
          });
        }
      }
  }
}

// The (row, span) items of a batch of rows with context lengths lens[0..N), row-major, and their
// partials: max [items][Hq], sum [items][Hq], acc [items][Hq][D]. With a window (a sliding-window
// layer, HF semantics: the query at position len - 1 sees keys at positions > len - 1 - window),
// a row's keys start at first_pos[n] = max(0, len - window): its items are the spans from the
// one holding that position, the first cut there, so the spans' bounds still fall at multiples
// of ATTN_SPAN and depend only on the row's own length and the window.
struct SpanItems {
  std::vector<int64_t> base;  // base[n]: row n's first item; base[N]: the item count
  std::vector<int64_t> row;   // row[i]: item i's row
  // The items longest first (ties in item order): the order a team takes them in, so that the
  // short last spans fill in at the end instead of leaving a full span to start last (at 3 rows
  // of context 300 on 2 threads, 256 + 44 positions a row: 512 positions on the busier thread
  // instead of 556). Which thread computes an item never changes its partials.
  std::vector<int64_t> by_length;
  std::vector<int64_t> first_pos;   // first_pos[n]: row n's first key position (0 without a window)
  std::vector<float> max, sum, acc;
  // copy[n]: row n's sequence has no other row in the batch (its items copy their rows first).
  std::vector<char> copy;
  int64_t Hq, D;

  SpanItems(const int64_t* lens, const int64_t* row_seq, int64_t N, int64_t Hq_, int64_t D_, int64_t window = 0)
      : base(N + 1, 0), first_pos(N, 0), copy(N, 1), Hq(Hq_), D(D_) {
    std::vector<int64_t> sorted(row_seq, row_seq + N);
    std::sort(sorted.begin(), sorted.end());
    for (int64_t n = 0; n < N; ++n) {
      const auto [lo, hi] = std::equal_range(sorted.begin(), sorted.end(), row_seq[n]);
      copy[n] = (hi - lo) == 1;
      if (window > 0) first_pos[n] = std::max<int64_t>(0, lens[n] - window);
    }
    for (int64_t n = 0; n < N; ++n) base[n + 1] = base[n] + num_spans(lens[n]) - first_span(n);
    row.resize(base[N]);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t i = base[n]; i < base[n + 1]; ++i) row[i] = n;
    std::vector<int64_t> length(base[N]);
    for (int64_t i = 0; i < base[N]; ++i) {
      const auto [p0, p1] = positions(i, lens[row[i]]);
      length[i] = p1 - p0;
    }
    by_length.resize(base[N]);
    std::iota(by_length.begin(), by_length.end(), int64_t{0});
    std::stable_sort(by_length.begin(), by_length.end(), [&](int64_t a, int64_t b) { return length[a] > length[b]; });
    max.resize(base[N] * Hq);
    sum.resize(base[N] * Hq);
    acc.resize(base[N] * Hq * D);
  }
  int64_t items() const { return base.back(); }
  // The index (span of ATTN_SPAN positions) of row n's first item.
  int64_t first_span(int64_t n) const { return first_pos[n] / ATTN_SPAN; }
  // Item i's positions [p0, p1) of its row (context length len).
  std::pair<int64_t, int64_t> positions(int64_t i, int64_t len) const {
    const int64_t n = row[i], start = (i - base[n] + first_span(n)) * ATTN_SPAN;
    return {std::max(start, first_pos[n]), std::min(len, start + ATTN_SPAN)};
  }
  float* max_of(int64_t i) { return max.data() + i * Hq; }
  float* sum_of(int64_t i) { return sum.data() + i * Hq; }
  float* acc_of(int64_t i) { return acc.data() + i * Hq * D; }
};

inline void merge_partials(const float* max, const float* sum, const float* acc, int64_t acc_stride,
                           int64_t spans, int64_t D, float* out);

// out[D]: query head `head` of row n, its spans' partials merged in span order. mx, sm: scratch.
inline void merge_row_head(const SpanItems& it, int64_t n, int64_t head, std::vector<float>& mx,
                           std::vector<float>& sm, float* out) {
  const int64_t first = it.base[n], spans = it.base[n + 1] - first;
  mx.resize(spans);
  sm.resize(spans);
  for (int64_t s = 0; s < spans; ++s) {
    mx[s] = it.max[(first + s) * it.Hq + head];
    sm[s] = it.sum[(first + s) * it.Hq + head];
  }
  merge_partials(mx.data(), sm.data(), it.acc.data() + first * it.Hq * it.D + head * it.D, it.Hq * it.D, spans,
                 it.D, out);
}

// out[D] = softmax-weighted values of one query head from its spans' partials (max[s], sum[s],
// acc[s * acc_stride + d]), merged in span order.
inline void merge_partials(const float* max, const float* sum, const float* acc, int64_t acc_stride,
                           int64_t spans, int64_t D, float* out) {
  float m = -INFINITY;
  for (int64_t s = 0; s < spans; ++s) m = std::max(m, max[s]);
  float total = 0.f;
  for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(out + d, _mm256_setzero_ps());
  for (int64_t s = 0; s < spans; ++s) {
    const float w = std::exp(max[s] - m);
    total += w * sum[s];
    const __m256 wv = _mm256_set1_ps(w);
    for (int64_t d = 0; d < D; d += 8)
      _mm256_storeu_ps(out + d, _mm256_fmadd_ps(wv, _mm256_loadu_ps(acc + s * acc_stride + d), _mm256_loadu_ps(out + d)));
  }
  const __m256 inv = _mm256_set1_ps(1.f / total);
  for (int64_t d = 0; d < D; d += 8) _mm256_storeu_ps(out + d, _mm256_mul_ps(_mm256_loadu_ps(out + d), inv));
}

// Head dims the float32 attention kernels take (a multiple of 32; Gemma 3's 256 too).
inline bool f32_head_dim(int64_t D) { return D == 64 || D == 128 || D == 256; }

// f(std::integral_constant<int, D>) for a head dim f32_head_dim accepts.
template <typename F>
inline void dispatch_f32_head_dim(int64_t D, F&& f) {
  switch (D) {
    case 64: f(std::integral_constant<int, 64>{}); break;
    case 128: f(std::integral_constant<int, 128>{}); break;
    default: f(std::integral_constant<int, 256>{}); break;
  }
}

#endif  // CADENCE_HAVE_AVX2

}  // namespace avx2
}  // namespace cadence_kernels
