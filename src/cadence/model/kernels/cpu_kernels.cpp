// CPU kernels for the decode/prefill fast path (compiled once by cadence.model.kernels.cpu_ops).
//
// Every kernel works on float32 and bfloat16 tensors (templated on the storage type, computing in
// float32) and parallelises with at::parallel_for, so it follows torch.set_num_threads.
//
//  paged_attention   one query row per token, attending over its own context [0, ctx_len) read
//                    straight from the paged cache through its block table: no gather, no copy.
//  rope_write_kv     rotate q and k of a fused qkv projection in place (HF rotate_half layout)
//                    and store k, v at their cache slots.
//  add_rms_norm      residual += x (in the model dtype), out = rms_norm(residual) * weight.
//  rms_norm          out = rms_norm(x) * weight.
//  silu_mul          out = silu(gate) * up of a fused gate/up projection.
//  linear_bf16       y = x @ w.T for bf16 with few rows (decode), with AVX512-BF16 dot products;
//                    torch's bf16 GEMM is several times slower than memory bandwidth there.
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif
#if defined(__AVX512BF16__) && defined(__AVX512F__)
#define CADENCE_HAVE_AVX512BF16 1
#else
#define CADENCE_HAVE_AVX512BF16 0
#endif

namespace {

inline float to_float(float x) { return x; }
inline float to_float(c10::BFloat16 x) {
  uint32_t bits = static_cast<uint32_t>(x.x) << 16;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

template <typename T> inline T from_float(float x);
template <> inline float from_float<float>(float x) { return x; }
template <> inline c10::BFloat16 from_float<c10::BFloat16>(float x) {
  // Round to nearest even, as torch's float -> bfloat16 cast does.
  return c10::BFloat16(x);
}

// Rounds a float through the storage type (a no-op for float32): reproduces the model dtype's
// rounding between ops, as the eager torch path has it.
template <typename T> inline float round_to(float x) { return to_float(from_float<T>(x)); }

// Elementwise kernels run on one thread unless the tensor is large (prefill): for a decode
// batch a parallel region costs more than the work, and far more when a neighbour process
// holds one of the cores (the region waits for the descheduled thread).
constexpr int64_t PARALLEL_MIN_ELEMENTS = 1 << 16;

inline int64_t row_grain(int64_t rows, int64_t width) {
  return rows * width < PARALLEL_MIN_ELEMENTS ? rows : std::max<int64_t>(1, 4096 / std::max<int64_t>(width, 1));
}

void check_cpu_contiguous(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(t.is_contiguous(), name, " must be contiguous");
}

#if defined(__AVX512F__)
// 16 float lanes from 16 consecutive elements of T.
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const c10::BFloat16* p) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }
inline void store16(c10::BFloat16* p, __m512 v) {
  // Round to nearest even (NaN stays NaN), as torch's cast does: (bits + 0x7fff + lsb) >> 16.
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(rounded));
}
// v rounded through T (identity for float).
inline __m512 round16(float*, __m512 v) { return v; }
inline __m512 round16(c10::BFloat16*, __m512 v) {
  alignas(64) c10::BFloat16 tmp[16];
  store16(tmp, v);
  return load16(tmp);
}

// exp(x) for x <= 0-ish softmax inputs (Cephes expf polynomial, ~1 ulp), 16 lanes at a time.
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
  const __m512 fx = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                         _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(fx, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(y, fx);
}

// In place: s[0:n] = softmax(s[0:n]).
inline void softmax_inplace(float* s, int64_t n) {
  __m512 mx = _mm512_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + i));
  float m = _mm512_reduce_max_ps(mx);
  for (; i < n; ++i) m = s[i] > m ? s[i] : m;
  const __m512 mv = _mm512_set1_ps(m);
  __m512 sum = _mm512_setzero_ps();
  for (i = 0; i + 16 <= n; i += 16) {
    const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(s + i), mv));
    _mm512_storeu_ps(s + i, e);
    sum = _mm512_add_ps(sum, e);
  }
  if (i < n) {
    const __mmask16 mask = (__mmask16)((1u << (n - i)) - 1);
    const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(mask, s + i), mv));
    _mm512_mask_storeu_ps(s + i, mask, e);
    sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(mask, e));
  }
  const __m512 inv = _mm512_set1_ps(1.f / _mm512_reduce_add_ps(sum));
  for (i = 0; i + 16 <= n; i += 16) _mm512_storeu_ps(s + i, _mm512_mul_ps(_mm512_loadu_ps(s + i), inv));
  if (i < n) {
    const __mmask16 mask = (__mmask16)((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(s + i, mask, _mm512_mul_ps(_mm512_maskz_loadu_ps(mask, s + i), inv));
  }
}

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
// q: [N, Hq, D]; k_cache, v_cache: [num_blocks, block_size, Hkv, D]; block_tables: [S, max_blocks]
// int32; row_seq: [N] int64 (which block-table row each query uses); ctx_lens: [N] int64 (query
// row n attends over positions [0, ctx_lens[n])). Returns [N, Hq, D] in q's dtype.
template <typename T>
void paged_attention_impl(const torch::Tensor& q, const torch::Tensor& k_cache,
                          const torch::Tensor& v_cache, const torch::Tensor& block_tables,
                          const torch::Tensor& row_seq, const torch::Tensor& ctx_lens,
                          double scale, torch::Tensor& out) {
  const int64_t N = q.size(0), Hq = q.size(1), D = q.size(2);
  const int64_t block_size = k_cache.size(1), Hkv = k_cache.size(2);
  const int64_t G = Hq / Hkv;
  const int64_t max_blocks = block_tables.size(1);
  const T* qp = q.data_ptr<T>();
  const T* kp = k_cache.data_ptr<T>();
  const T* vp = v_cache.data_ptr<T>();
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
        const T* kb = kp + h * D;
        const T* vb = vp + h * D;
        if (D == 64 && attend_grouped_d64<T>(G, qf.data(), kb, vb, table, block_size, ctx,
                                             token_stride, scores.data(), acc.data())) {
          // done by the grouped kernel
        } else if (D == 64)
          attend_item_avx512<T, 4>(qf.data(), G, kb, vb, table, block_size, ctx, token_stride,
                                   scores.data(), acc.data());
        else
          attend_item_avx512<T, 8>(qf.data(), G, kb, vb, table, block_size, ctx, token_stride,
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
        const T* krow = kp + slot * token_stride + h * D;
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
        const T* vrow = vp + slot * token_stride + h * D;
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

torch::Tensor paged_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                              torch::Tensor block_tables, torch::Tensor row_seq,
                              torch::Tensor ctx_lens, double scale) {
  check_cpu_contiguous(q, "q");
  check_cpu_contiguous(k_cache, "k_cache");
  check_cpu_contiguous(v_cache, "v_cache");
  check_cpu_contiguous(block_tables, "block_tables");
  TORCH_CHECK(q.dim() == 3 && k_cache.dim() == 4 && v_cache.sizes() == k_cache.sizes(),
              "paged_attention: q [N, Hq, D], caches [blocks, block_size, Hkv, D]");
  TORCH_CHECK(q.scalar_type() == k_cache.scalar_type() && q.scalar_type() == v_cache.scalar_type(),
              "paged_attention: q and caches must share a dtype");
  TORCH_CHECK(q.size(2) == k_cache.size(3) && q.size(1) % k_cache.size(2) == 0,
              "paged_attention: head_dim mismatch or Hq not a multiple of Hkv");
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt32, "block_tables must be int32");
  auto seq = row_seq.to(torch::kInt64).contiguous();
  auto lens = ctx_lens.to(torch::kInt64).contiguous();
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
  auto out = torch::empty_like(q);
  if (q.scalar_type() == torch::kFloat32) {
    paged_attention_impl<float>(q, k_cache, v_cache, block_tables, seq, lens, scale, out);
  } else if (q.scalar_type() == torch::kBFloat16) {
    paged_attention_impl<c10::BFloat16>(q, k_cache, v_cache, block_tables, seq, lens, scale, out);
  } else {
    TORCH_CHECK(false, "paged_attention: float32 or bfloat16 only");
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// rope_write_kv
// qkv: [T, (Hq + 2 Hkv) * D] (q heads, then k heads, then v heads), rotated in place;
// cos, sin: [T, D] float32; k_cache, v_cache: [num_blocks, block_size, Hkv, D]; slots: [T] int64.
template <typename T>
void rope_write_kv_impl(torch::Tensor& qkv, const torch::Tensor& cos, const torch::Tensor& sin,
                        int64_t Hq, int64_t Hkv, torch::Tensor& k_cache, torch::Tensor& v_cache,
                        const torch::Tensor& slots) {
  const int64_t T_ = qkv.size(0), D = k_cache.size(3), half = D / 2;
  const int64_t width = (Hq + 2 * Hkv) * D;
  T* x = qkv.data_ptr<T>();
  const float* c = cos.data_ptr<float>();
  const float* s = sin.data_ptr<float>();
  T* kc = k_cache.data_ptr<T>();
  T* vc = v_cache.data_ptr<T>();
  const int64_t* sl = slots.data_ptr<int64_t>();
  at::parallel_for(0, T_, row_grain(T_, width), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* ct = c + t * D;
      const float* st = s + t * D;
      T* row = x + t * width;
      for (int64_t head = 0; head < Hq + Hkv; ++head) {
        T* v = row + head * D;
        // x * cos + rotate_half(x) * sin, rotate_half(x) = [-x2, x1]; each product and the sum
        // rounded to T as the eager path does.
        for (int64_t d = 0; d < half; ++d) {
          const float a = to_float(v[d]), b = to_float(v[d + half]);
          const float lo = round_to<T>(round_to<T>(a * round_to<T>(ct[d])) +
                                       round_to<T>(-b * round_to<T>(st[d])));
          const float hi = round_to<T>(round_to<T>(b * round_to<T>(ct[d + half])) +
                                       round_to<T>(a * round_to<T>(st[d + half])));
          v[d] = from_float<T>(lo);
          v[d + half] = from_float<T>(hi);
        }
      }
      const int64_t slot = sl[t];
      std::memcpy(kc + slot * Hkv * D, row + Hq * D, sizeof(T) * Hkv * D);
      std::memcpy(vc + slot * Hkv * D, row + (Hq + Hkv) * D, sizeof(T) * Hkv * D);
    }
  });
}

void rope_write_kv(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, int64_t num_heads,
                   int64_t num_kv_heads, torch::Tensor k_cache, torch::Tensor v_cache,
                   torch::Tensor slots) {
  check_cpu_contiguous(qkv, "qkv");
  check_cpu_contiguous(k_cache, "k_cache");
  check_cpu_contiguous(v_cache, "v_cache");
  TORCH_CHECK(cos.scalar_type() == torch::kFloat32 && sin.scalar_type() == torch::kFloat32,
              "rope_write_kv: cos/sin must be float32");
  auto c = cos.contiguous(), s = sin.contiguous();
  auto sl = slots.to(torch::kInt64).contiguous();
  const int64_t D = k_cache.size(3);
  TORCH_CHECK(qkv.size(1) == (num_heads + 2 * num_kv_heads) * D && c.size(1) == D &&
                  c.size(0) == qkv.size(0) && sl.numel() == qkv.size(0) &&
                  k_cache.size(2) == num_kv_heads,
              "rope_write_kv: shape mismatch");
  TORCH_CHECK(qkv.scalar_type() == k_cache.scalar_type() && v_cache.sizes() == k_cache.sizes() &&
                  v_cache.scalar_type() == k_cache.scalar_type(),
              "rope_write_kv: qkv and caches must share dtype and shape");
  {
    const int64_t num_slots = k_cache.size(0) * k_cache.size(1);
    const int64_t* sp = sl.data_ptr<int64_t>();
    for (int64_t t = 0; t < sl.numel(); ++t)
      TORCH_CHECK(sp[t] >= 0 && sp[t] < num_slots, "rope_write_kv: slot ", sp[t], " outside cache of ", num_slots);
  }
  if (qkv.scalar_type() == torch::kFloat32) {
    rope_write_kv_impl<float>(qkv, c, s, num_heads, num_kv_heads, k_cache, v_cache, sl);
  } else if (qkv.scalar_type() == torch::kBFloat16) {
    rope_write_kv_impl<c10::BFloat16>(qkv, c, s, num_heads, num_kv_heads, k_cache, v_cache, sl);
  } else {
    TORCH_CHECK(false, "rope_write_kv: float32 or bfloat16 only");
  }
}

// ---------------------------------------------------------------------------------------------
// RMS norm (HF Llama semantics: normalise in float32, cast to the dtype, then times the weight).
// residual (optional) += x, rounded to T; out = weight * T(norm(residual)) rounded to T.
template <typename T>
void rms_norm_rows(T* resid, const T* add, const T* w, T* out, int64_t rows, int64_t H, float eps) {
  at::parallel_for(0, rows, row_grain(rows, H), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      T* x = resid + r * H;
      const T* a = add == nullptr ? nullptr : add + r * H;
      T* y = out + r * H;
      float ss = 0.f;
      int64_t i = 0;
#if defined(__AVX512F__)
      __m512 ssv = _mm512_setzero_ps();
      for (; i + 16 <= H; i += 16) {
        __m512 v = load16(x + i);
        if (a != nullptr) {
          v = round16(x, _mm512_add_ps(v, load16(a + i)));
          store16(x + i, v);
        }
        ssv = _mm512_fmadd_ps(v, v, ssv);
      }
      ss = _mm512_reduce_add_ps(ssv);
#endif
      for (; i < H; ++i) {
        float v = to_float(x[i]);
        if (a != nullptr) {
          v = round_to<T>(v + to_float(a[i]));
          x[i] = from_float<T>(v);
        }
        ss += v * v;
      }
      const float inv = 1.f / std::sqrt(ss / static_cast<float>(H) + eps);
      i = 0;
#if defined(__AVX512F__)
      const __m512 invv = _mm512_set1_ps(inv);
      for (; i + 16 <= H; i += 16)
        store16(y + i, _mm512_mul_ps(load16(w + i), round16(y, _mm512_mul_ps(load16(x + i), invv))));
#endif
      for (; i < H; ++i) y[i] = from_float<T>(to_float(w[i]) * round_to<T>(to_float(x[i]) * inv));
    }
  });
}

void check_norm_args(const torch::Tensor& x, const torch::Tensor& w) {
  check_cpu_contiguous(x, "x");
  check_cpu_contiguous(w, "weight");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 1 && x.size(1) == w.size(0), "rms_norm: x [rows, H], weight [H]");
  TORCH_CHECK(x.scalar_type() == w.scalar_type(), "rms_norm: x and weight must share a dtype");
}

torch::Tensor rms_norm(torch::Tensor x, torch::Tensor w, double eps) {
  check_norm_args(x, w);
  auto out = torch::empty_like(x);
  if (x.scalar_type() == torch::kFloat32) {
    rms_norm_rows<float>(x.data_ptr<float>(), nullptr, w.data_ptr<float>(), out.data_ptr<float>(), x.size(0), x.size(1), eps);
  } else if (x.scalar_type() == torch::kBFloat16) {
    rms_norm_rows<c10::BFloat16>(x.data_ptr<c10::BFloat16>(), nullptr, w.data_ptr<c10::BFloat16>(),
                                 out.data_ptr<c10::BFloat16>(), x.size(0), x.size(1), eps);
  } else {
    TORCH_CHECK(false, "rms_norm: float32 or bfloat16 only");
  }
  return out;
}

// residual += x in place; returns rms_norm(residual) * w.
torch::Tensor add_rms_norm(torch::Tensor residual, torch::Tensor x, torch::Tensor w, double eps) {
  check_norm_args(residual, w);
  check_cpu_contiguous(x, "x");
  TORCH_CHECK(x.sizes() == residual.sizes() && x.scalar_type() == residual.scalar_type(),
              "add_rms_norm: residual and x must match");
  auto out = torch::empty_like(x);
  if (x.scalar_type() == torch::kFloat32) {
    rms_norm_rows<float>(residual.data_ptr<float>(), x.data_ptr<float>(), w.data_ptr<float>(),
                         out.data_ptr<float>(), x.size(0), x.size(1), eps);
  } else if (x.scalar_type() == torch::kBFloat16) {
    rms_norm_rows<c10::BFloat16>(residual.data_ptr<c10::BFloat16>(), x.data_ptr<c10::BFloat16>(),
                                 w.data_ptr<c10::BFloat16>(), out.data_ptr<c10::BFloat16>(),
                                 x.size(0), x.size(1), eps);
  } else {
    TORCH_CHECK(false, "add_rms_norm: float32 or bfloat16 only");
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// silu_mul: gate_up [T, 2 I] (gate then up) -> [T, I] = silu(gate) * up, rounded as eager torch.
template <typename T>
void silu_mul_impl(const T* gu, T* out, int64_t rows, int64_t I) {
  at::parallel_for(0, rows, row_grain(rows, 2 * I), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const T* g = gu + r * 2 * I;
      const T* u = g + I;
      T* y = out + r * I;
      int64_t i = 0;
#if defined(__AVX512F__)
      for (; i + 16 <= I; i += 16) {
        const __m512 a = load16(g + i);
        const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), a));  // exp(-a)
        const __m512 act = round16(y, _mm512_div_ps(a, _mm512_add_ps(_mm512_set1_ps(1.f), e)));
        store16(y + i, _mm512_mul_ps(act, load16(u + i)));
      }
#endif
      for (; i < I; ++i) {
        const float a = to_float(g[i]);
        const float act = round_to<T>(a / (1.f + std::exp(-a)));
        y[i] = from_float<T>(act * to_float(u[i]));
      }
    }
  });
}

torch::Tensor silu_mul(torch::Tensor gate_up) {
  check_cpu_contiguous(gate_up, "gate_up");
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.size(1) % 2 == 0, "silu_mul: gate_up [T, 2 I]");
  const int64_t rows = gate_up.size(0), I = gate_up.size(1) / 2;
  auto out = torch::empty({rows, I}, gate_up.options());
  if (gate_up.scalar_type() == torch::kFloat32) {
    silu_mul_impl<float>(gate_up.data_ptr<float>(), out.data_ptr<float>(), rows, I);
  } else if (gate_up.scalar_type() == torch::kBFloat16) {
    silu_mul_impl<c10::BFloat16>(gate_up.data_ptr<c10::BFloat16>(), out.data_ptr<c10::BFloat16>(), rows, I);
  } else {
    TORCH_CHECK(false, "silu_mul: float32 or bfloat16 only");
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// linear_bf16: x [M, K] bf16, w [N, K] bf16 -> [M, N] bf16 (float32 accumulation).
bool has_avx512bf16() { return CADENCE_HAVE_AVX512BF16 != 0; }

constexpr int64_t PARALLEL_MIN_WEIGHT_BYTES = 2 << 20;

#if CADENCE_HAVE_AVX512BF16
// MR activation rows times one weight row over K. The weight row is read front to back (the
// hardware prefetcher follows one sequential stream per thread far better than interleaved short
// rows), with two accumulators per activation row to halve the dependency chain.
template <int MR>
inline void dot_row(const uint16_t* x, int64_t ldx, const uint16_t* w, int64_t K, float* acc_out) {
  __m512 acc0[MR], acc1[MR];
  for (int i = 0; i < MR; ++i) acc0[i] = acc1[i] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 64 <= K; k += 64) {
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(w + k);
    const __m512bh w1 = (__m512bh)_mm512_loadu_si512(w + k + 32);
    for (int i = 0; i < MR; ++i) {
      acc0[i] = _mm512_dpbf16_ps(acc0[i], (__m512bh)_mm512_loadu_si512(x + i * ldx + k), w0);
      acc1[i] = _mm512_dpbf16_ps(acc1[i], (__m512bh)_mm512_loadu_si512(x + i * ldx + k + 32), w1);
    }
  }
  for (; k < K; k += 32) {
    const int64_t left = K - k;
    const __mmask32 mask = left >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << left) - 1);
    const __m512bh w0 = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + k);
    for (int i = 0; i < MR; ++i)
      acc0[i] = _mm512_dpbf16_ps(acc0[i], (__m512bh)_mm512_maskz_loadu_epi16(mask, x + i * ldx + k), w0);
  }
  for (int i = 0; i < MR; ++i) acc_out[i] = _mm512_reduce_add_ps(_mm512_add_ps(acc0[i], acc1[i]));
}
#endif

torch::Tensor linear_bf16(torch::Tensor x, torch::Tensor w) {
  check_cpu_contiguous(x, "x");
  check_cpu_contiguous(w, "w");
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && w.scalar_type() == torch::kBFloat16,
              "linear_bf16: bfloat16 only");
  TORCH_CHECK(x.dim() == 2 && w.dim() == 2 && x.size(1) == w.size(1), "linear_bf16: x [M, K], w [N, K]");
#if CADENCE_HAVE_AVX512BF16
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  auto out = torch::empty({M, N}, x.options());
  const uint16_t* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<c10::BFloat16>());
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(w.data_ptr<c10::BFloat16>());
  uint16_t* op = reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>());
  // Parallel over output columns: each weight row is read from memory once per call (the few
  // activation rows stay in L1), each thread streaming a contiguous range of rows. Weights
  // under PARALLEL_MIN_WEIGHT_BYTES stream on the calling thread: a second thread adds less
  // bandwidth than waking it costs.
  const int64_t grain = N * K * 2 < PARALLEL_MIN_WEIGHT_BYTES ? N + 1 : 16;
  at::parallel_for(0, N, grain, [&](int64_t begin, int64_t end) {
    float acc[4];
    for (int64_t n = begin; n < end; ++n) {
      const uint16_t* wr = wp + n * K;
      int64_t m = 0;
      for (; m + 4 <= M; m += 4) {
        dot_row<4>(xp + m * K, K, wr, K, acc);
        for (int i = 0; i < 4; ++i) op[(m + i) * N + n] = c10::BFloat16(acc[i]).x;
      }
      const int64_t rest = M - m;
      if (rest == 3) dot_row<3>(xp + m * K, K, wr, K, acc);
      else if (rest == 2) dot_row<2>(xp + m * K, K, wr, K, acc);
      else if (rest == 1) dot_row<1>(xp + m * K, K, wr, K, acc);
      for (int i = 0; i < rest; ++i) op[(m + i) * N + n] = c10::BFloat16(acc[i]).x;
    }
  });
  return out;
#else
  TORCH_CHECK(false, "linear_bf16: built without AVX512-BF16");
  return x;
#endif
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_attention", &paged_attention, "paged attention over block tables (no gather)");
  m.def("rope_write_kv", &rope_write_kv, "rotary embedding in place + cache write");
  m.def("rms_norm", &rms_norm, "RMS norm");
  m.def("add_rms_norm", &add_rms_norm, "residual add + RMS norm");
  m.def("silu_mul", &silu_mul, "silu(gate) * up");
  m.def("linear_bf16", &linear_bf16, "bf16 x @ w.T for few rows");
  m.def("has_avx512bf16", &has_avx512bf16, "whether linear_bf16 is compiled in");
}
