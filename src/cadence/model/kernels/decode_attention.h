// Decode attention for bf16 caches: one query row (all its heads) over a span of its context,
// read straight from the paged cache. Used by paged_attention (decodes and short chunks) and by
// the fused decode stack.
//
// Why it is shaped this way:
//  * The cache is [blocks, block_size, Hkv, D]: the K (or V) row of one position holds all KV
//    heads side by side (Hkv * D * 2 bytes, 384 B for SmolLM2). Reading one head at a time pulls
//    its neighbours' cache lines in too (adjacent-line prefetch) and wastes up to Hkv times the
//    bandwidth, so every loop here consumes all heads of a 16-position group while it sits in L1.
//  * q . k uses AVX512-BF16 dot products on the bf16 rows (no conversion), 16 positions at a
//    time, with one transposing reduction for the 16 sums instead of 16 horizontal reductions.
//  * p . v also uses bf16 dot products, over pairs of positions (p rounded to bf16, as flash
//    attention does; float32 accumulation).
//  * A span returns unnormalised partials (max, sum of exp, weighted sum) so that one long
//    context can be split across threads (flash-decoding) and merged after.
#pragma once

#include "common.h"

namespace cadence_kernels {

#if CADENCE_HAVE_AVX512BF16

// Sums of 16 vectors: lane i of the result is the horizontal sum of v[i].
inline __m512 transpose_sum16(__m512 v[16]) {
  __m512 x[8], y[4], z[2];
  for (int i = 0; i < 8; ++i)
    x[i] = _mm512_add_ps(_mm512_unpacklo_ps(v[2 * i], v[2 * i + 1]),
                         _mm512_unpackhi_ps(v[2 * i], v[2 * i + 1]));
  // x[i], per 128-bit lane: [a0+a2, b0+b2, a1+a3, b1+b3] (a = v[2i], b = v[2i+1]).
  for (int i = 0; i < 4; ++i) {
    const __m512d lo = _mm512_unpacklo_pd(_mm512_castps_pd(x[2 * i]), _mm512_castps_pd(x[2 * i + 1]));
    const __m512d hi = _mm512_unpackhi_pd(_mm512_castps_pd(x[2 * i]), _mm512_castps_pd(x[2 * i + 1]));
    y[i] = _mm512_add_ps(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi));
  }
  // y[i], per 128-bit lane L: the lane-L sums of v[4i .. 4i+3].
  for (int i = 0; i < 2; ++i)
    z[i] = _mm512_add_ps(_mm512_shuffle_f32x4(y[2 * i], y[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(y[2 * i], y[2 * i + 1], 0xdd));
  return _mm512_add_ps(_mm512_shuffle_f32x4(z[0], z[1], 0x88), _mm512_shuffle_f32x4(z[0], z[1], 0xdd));
}

// Partial attention state of one span for all Hq heads of a query row.
struct SpanPartial {
  float* max;  // [Hq] running max of the scaled scores
  float* sum;  // [Hq] sum of exp(score - max)
  float* acc;  // [Hq, D] sum of exp(score - max) * v
};

// The span the same thread attends next (same layer): its K rows are fetched into L2 while this
// span's values are summed from L2, so that DRAM never idles between spans.
struct NextSpan {
  const int32_t* table;
  int64_t p0, p1;
};

// Scratch floats attend_span_bf16 needs for a span of `span` positions.
inline int64_t attend_scratch_floats(int64_t Hq, int64_t D, int64_t span) {
  return Hq * ((span + 15) / 16 * 16) + Hq * 8;
}

// Query row q [Hq, D] (bf16 bits) over context positions [p0, p1) of the sequence whose block
// table is `table`. kc, vc: the layer's caches as bf16 bits, [blocks, block_size, Hkv, D].
// scratch: attend_scratch_floats(Hq, D, p1 - p0) floats. Writes `out` (unnormalised, see
// SpanPartial). Three passes: all scores of the span (L2-resident), one max / exp / sum per
// head, then the values: no per-group rescaling and one scalar exp per head.
template <int D>
void attend_span_bf16(const uint16_t* q, int64_t Hq, int64_t Hkv, const uint16_t* kc,
                      const uint16_t* vc, const int32_t* table, int64_t block_size, int64_t p0,
                      int64_t p1, float scale, float* scratch, SpanPartial out,
                      const NextSpan* next = nullptr) {
  static_assert(D % 32 == 0, "head_dim must be a multiple of 32");
  constexpr int QC = D / 32;  // bf16 pairs: 32 elements per register
  constexpr int VC = D / 16;  // float32: 16 elements per register
  const int64_t G = Hq / Hkv;
  const int64_t token_stride = Hkv * D;
  const int64_t span = p1 - p0;
  const int64_t padded = (span + 15) / 16 * 16;
  float* scores = scratch;               // [Hq, padded]
  const int64_t row_bytes = token_stride * 2;
  auto slot_of = [&](int64_t pos) {
    return static_cast<int64_t>(table[pos / block_size]) * block_size + pos % block_size;
  };
  // Blocks are scattered and a group reads 16 short rows the hardware prefetcher does not
  // follow: fetch the rows PREFETCH_GROUPS groups ahead while computing this one.
  constexpr int64_t PREFETCH_GROUPS = 2;
  auto prefetch_rows = [&](const uint16_t* base, int64_t start) {
    const int64_t stop = std::min<int64_t>(p1, start + 16);
    for (int64_t pos = start; pos < stop; ++pos) {
      const char* row = reinterpret_cast<const char*>(base + slot_of(pos) * token_stride);
      for (int64_t byte = 0; byte < row_bytes; byte += 64) _mm_prefetch(row + byte, _MM_HINT_T0);
    }
  };
  const uint16_t* rows[16];
  auto group_rows = [&](const uint16_t* base, int64_t g0, int count) {
    for (int j = 0; j < count; ++j) rows[j] = base + slot_of(g0 + j) * token_stride;
  };

  // Pass 1: scores[head, pos - p0] = scale * q_head . k_pos.
  for (int64_t ahead = 0; ahead < PREFETCH_GROUPS; ++ahead) prefetch_rows(kc, p0 + 16 * ahead);
  for (int64_t g0 = p0; g0 < p1; g0 += 16) {
    const int count = static_cast<int>(std::min<int64_t>(16, p1 - g0));
    if (g0 + 16 * PREFETCH_GROUPS < p1) prefetch_rows(kc, g0 + 16 * PREFETCH_GROUPS);
    // This group's V rows into L2 while its K rows are consumed: pass 3 then reads V from L2
    // for spans that fit there, and both streams keep DRAM busy (b32 x 512: attention -30%).
    for (int j = 0; j < count; ++j) {
      const char* vrow = reinterpret_cast<const char*>(vc + slot_of(g0 + j) * token_stride);
      for (int64_t byte = 0; byte < row_bytes; byte += 64) _mm_prefetch(vrow + byte, _MM_HINT_T1);
    }
    group_rows(kc, g0, count);
    for (int64_t kh = 0; kh < Hkv; ++kh) {
      for (int64_t g = 0; g < G; ++g) {
        const int64_t head = kh * G + g;
        __m512bh qv[QC];
        for (int c = 0; c < QC; ++c) qv[c] = (__m512bh)_mm512_loadu_si512(q + head * D + 32 * c);
        __m512 dots[16];
        for (int j = 0; j < 16; ++j) {
          if (j < count) {
            const uint16_t* krow = rows[j] + kh * D;
            __m512 a = _mm512_dpbf16_ps(_mm512_setzero_ps(), qv[0], (__m512bh)_mm512_loadu_si512(krow));
            for (int c = 1; c < QC; ++c)
              a = _mm512_dpbf16_ps(a, qv[c], (__m512bh)_mm512_loadu_si512(krow + 32 * c));
            dots[j] = a;
          } else {
            dots[j] = _mm512_setzero_ps();
          }
        }
        // Lanes past `count` hold 0 here; pass 2 only reads [0, span).
        _mm512_storeu_ps(scores + head * padded + (g0 - p0),
                         _mm512_mul_ps(transpose_sum16(dots), _mm512_set1_ps(scale)));
      }
    }
  }
  // Pass 2: per head, p = exp(s - max) in place; max and sum kept for the merge. The padding
  // lanes past `span` stay 0 (pass 1 summed zeros there), so pass 3 may read whole groups.
  for (int64_t head = 0; head < Hq; ++head) {
    const auto [m, total] = exp_shifted_inplace(scores + head * padded, span);
    out.max[head] = m;
    out.sum[head] = total;
  }
  // Pass 3: acc[head] = sum_pos p[head, pos] * v_pos with bf16 dot products over position pairs:
  // p rounded to bf16 (as flash attention does), two V rows interleaved element by element
  // (unpacklo/hi), so one _mm512_dpbf16_ps adds two positions for 16 dims. The interleave
  // permutes dims inside each 128-bit lane; accumulators stay permuted until the end.
  // acc layout per head: [QC][2][16] floats: chunk c, lo/hi half, lane 4L+t = dim 32c+8L+4h+t.
  std::memset(out.acc, 0, sizeof(float) * Hq * D);
  uint32_t* pairs = reinterpret_cast<uint32_t*>(scores + Hq * padded);  // [Hq][8] bf16 pairs of p
  alignas(64) uint16_t zero_row[D] = {};
  // Accumulators of up to 3 heads (D = 64: 12 registers) or 2 (D = 128: 16) at a time.
  constexpr int64_t HEADS_AT_ONCE = D == 64 ? 3 : 2;
  for (int64_t ahead = 0; ahead < PREFETCH_GROUPS; ++ahead) prefetch_rows(vc, p0 + 16 * ahead);
  // The next span's K rows, a share per group of this pass (into L2).
  int64_t next_pos = next == nullptr ? 0 : next->p0;
  const int64_t next_end = next == nullptr ? 0 : next->p1;
  const int64_t next_per_group = next == nullptr ? 0 : (next_end - next_pos + (span + 15) / 16 - 1) / ((span + 15) / 16);
  for (int64_t g0 = p0; g0 < p1; g0 += 16) {
    const int count = static_cast<int>(std::min<int64_t>(16, p1 - g0));
    if (g0 + 16 * PREFETCH_GROUPS < p1) prefetch_rows(vc, g0 + 16 * PREFETCH_GROUPS);
    for (int64_t stop = std::min(next_end, next_pos + next_per_group); next_pos < stop; ++next_pos) {
      const int64_t slot = static_cast<int64_t>(next->table[next_pos / block_size]) * block_size + next_pos % block_size;
      const char* krow = reinterpret_cast<const char*>(kc + slot * token_stride);
      for (int64_t byte = 0; byte < row_bytes; byte += 64) _mm_prefetch(krow + byte, _MM_HINT_T1);
    }
    group_rows(vc, g0, count);
    const int npairs = (count + 1) / 2;
    // Lanes past `count` of a score row are 0 (pass 2), so the padding row adds nothing.
    for (int64_t head = 0; head < Hq; ++head)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(pairs + head * 8),
                         (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(scores + head * padded + (g0 - p0))));
    for (int64_t kh = 0; kh < Hkv; ++kh) {
      const uint16_t* r0s[8];
      const uint16_t* r1s[8];
      for (int i = 0; i < npairs; ++i) {
        r0s[i] = rows[2 * i] + kh * D;
        r1s[i] = 2 * i + 1 < count ? rows[2 * i + 1] + kh * D : zero_row;
      }
      // The query heads of this KV head, HEADS_AT_ONCE at a time: their accumulator chains
      // interleave (one head alone is a chain of dependent dot products, latency-bound).
      for (int64_t g0 = 0; g0 < G; g0 += HEADS_AT_ONCE) {
        const int64_t head0 = kh * G + g0;
        const int64_t nh = std::min<int64_t>(HEADS_AT_ONCE, G - g0);
        auto run = [&](auto heads) {
          constexpr int NH = decltype(heads)::value;
          __m512 acc[NH][2 * QC];
          for (int h = 0; h < NH; ++h)
            for (int c = 0; c < 2 * QC; ++c) acc[h][c] = _mm512_loadu_ps(out.acc + (head0 + h) * D + 16 * c);
          for (int i = 0; i < npairs; ++i) {
            __m512i vp[2 * QC];
            for (int c = 0; c < QC; ++c) {
              const __m512i a = _mm512_loadu_si512(r0s[i] + 32 * c);
              const __m512i b = _mm512_loadu_si512(r1s[i] + 32 * c);
              vp[2 * c] = _mm512_unpacklo_epi16(a, b);
              vp[2 * c + 1] = _mm512_unpackhi_epi16(a, b);
            }
            for (int h = 0; h < NH; ++h) {
              const __m512bh pp = (__m512bh)_mm512_set1_epi32(static_cast<int32_t>(pairs[(head0 + h) * 8 + i]));
              for (int c = 0; c < 2 * QC; ++c) acc[h][c] = _mm512_dpbf16_ps(acc[h][c], (__m512bh)vp[c], pp);
            }
          }
          for (int h = 0; h < NH; ++h)
            for (int c = 0; c < 2 * QC; ++c) _mm512_storeu_ps(out.acc + (head0 + h) * D + 16 * c, acc[h][c]);
        };
        if (nh >= HEADS_AT_ONCE) run(std::integral_constant<int, HEADS_AT_ONCE>{});
        else if (nh == 2) run(std::integral_constant<int, 2>{});
        else run(std::integral_constant<int, 1>{});
      }
    }
  }
  // Undo the interleave's permutation: permuted lane (c, half, 4L+t) -> dim 32c + 8L + 4half + t.
  for (int64_t head = 0; head < Hq; ++head) {
    float* a = out.acc + head * D;
    alignas(64) float tmp[D];
    for (int c = 0; c < QC; ++c)
      for (int half = 0; half < 2; ++half)
        for (int L = 0; L < 4; ++L)
          for (int t = 0; t < 4; ++t) tmp[32 * c + 8 * L + 4 * half + t] = a[32 * c + 16 * half + 4 * L + t];
    std::memcpy(a, tmp, sizeof(tmp));
  }
}

// A span a thread takes from one row's context when a few long rows are split (flash-decoding):
// shorter spans cost more in merging than another thread gains.
constexpr int64_t MIN_SPAN = 256;
// Bytes of keys + values one span may read: pass 3 then finds the values pass 1 fetched still in
// a 1 MB L2 (512 positions of SmolLM2; at 2048 positions they were evicted and read again from
// memory: b32 ctx2048 attention 81-90 -> 70-75 ms).
constexpr int64_t SPAN_KV_BYTES = 384 << 10;
constexpr int64_t MAX_SPANS_PER_ROW = 64;

// The attention work of one step: (row, span [p0, p1)) items and their partials. A row is cut
// into spans when its keys and values exceed SPAN_KV_BYTES, and also when there are fewer than
// two rows per thread and its context is long, so that every thread has work; merge_row
// combines a row's spans into its output.
class SpanPlan {
 public:
  SpanPlan(const int64_t* ctx_lens, int64_t rows, int64_t threads, int64_t Hq, int64_t Hkv, int64_t D)
      : Hq_(Hq), D_(D), row_first_(rows + 1) {
    // bf16 K and V rows of all KV heads per position.
    const int64_t max_span = std::max<int64_t>(MIN_SPAN, SPAN_KV_BYTES / (2 * Hkv * D * 2));
    for (int64_t n = 0; n < rows; ++n) {
      row_first_[n] = static_cast<int64_t>(row_.size());
      int64_t spans = 1;
      if (threads > 1 && rows < 2 * threads)
        spans = std::max<int64_t>(1, std::min<int64_t>((2 * threads + rows - 1) / rows, ctx_lens[n] / MIN_SPAN));
      // Long contexts in spans whose keys and values fit L2 together (whatever the batch, so a
      // row's result does not depend on what else runs).
      spans = std::min<int64_t>(MAX_SPANS_PER_ROW, std::max<int64_t>(spans, (ctx_lens[n] + max_span - 1) / max_span));
      const int64_t span = ((ctx_lens[n] + spans - 1) / spans + 15) / 16 * 16;
      for (int64_t p0 = 0; p0 < ctx_lens[n]; p0 += span) {
        row_.push_back(n);
        p0_.push_back(p0);
        p1_.push_back(std::min(ctx_lens[n], p0 + span));
      }
    }
    row_first_[rows] = static_cast<int64_t>(row_.size());
    partials_.resize(items() * Hq * (2 + D));
  }

  int64_t items() const { return static_cast<int64_t>(row_.size()); }
  bool split() const { return items() > static_cast<int64_t>(row_first_.size()) - 1; }
  int64_t row(int64_t i) const { return row_[i]; }
  int64_t p0(int64_t i) const { return p0_[i]; }
  int64_t p1(int64_t i) const { return p1_[i]; }
  SpanPartial part(int64_t i) {
    float* base = partials_.data() + i * Hq_ * (2 + D_);
    return SpanPartial{base, base + Hq_, base + 2 * Hq_};
  }

  // Writes row n's normalised output [Hq, D] (bf16 bits) from its spans' partials.
  void merge_row(int64_t n, uint16_t* dst) {
    const int64_t first = row_first_[n], count = row_first_[n + 1] - first;
    for (int64_t h = 0; h < Hq_; ++h) {
      float m = -INFINITY;
      for (int64_t s = 0; s < count; ++s) m = std::max(m, part(first + s).max[h]);
      float total = 0.f;
      float weight[MAX_SPANS_PER_ROW];  // spans per row (capped in the constructor)
      for (int64_t s = 0; s < count; ++s) {
        const SpanPartial p = part(first + s);
        weight[s] = p.max[h] == -INFINITY ? 0.f : std::exp(p.max[h] - m);
        total += weight[s] * p.sum[h];
      }
      const float inv = 1.f / total;
      for (int64_t d = 0; d < D_; d += 16) {
        __m512 o = _mm512_setzero_ps();
        for (int64_t s = 0; s < count; ++s)
          o = _mm512_fmadd_ps(_mm512_set1_ps(weight[s] * inv), _mm512_loadu_ps(part(first + s).acc + h * D_ + d), o);
        store16(reinterpret_cast<c10::BFloat16*>(dst + h * D_ + d), o);
      }
    }
  }

 private:
  int64_t Hq_, D_;
  std::vector<int64_t> row_, p0_, p1_, row_first_;
  std::vector<float> partials_;  // [items, Hq * (2 + D)]: max, sum, acc of each item
};

// Whether attend_span_bf16 serves this head_dim.
inline bool decode_attention_supports(int64_t D) { return D == 64 || D == 128; }

template <typename Fn>
inline void dispatch_head_dim(int64_t D, Fn&& fn) {
  if (D == 64) fn(std::integral_constant<int, 64>{});
  else fn(std::integral_constant<int, 128>{});
}

#endif  // CADENCE_HAVE_AVX512BF16

}  // namespace cadence_kernels
