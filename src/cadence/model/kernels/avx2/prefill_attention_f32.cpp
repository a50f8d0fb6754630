// prefill_attention_f32: causal flash attention of a float32 prefill chunk over its context, with
// AVX2 FMA tiles and an online softmax (the float32 counterpart of prefill_attention.cpp, for CPUs
// without native bf16).
//
// q [n, Hq, D] attends over a context of L >= n positions: keys/values [L, Hkv, D], or the paged
// caches [num_blocks, block_size, Hkv, D] read through one sequence's block table. Query j sits at
// position L - n + j and sees keys [0, L - n + j]. The G = Hq / Hkv query heads that share a KV
// head are stacked as rows (row m = query m / G, head m % G), so one pass over a KV head's keys
// serves the whole group. Work items (KV head, tile of TILE_ROWS rows) walk the key blocks at or
// below their causal diagonal, reading K and V rows where they lie in the cache (no packed copy):
//   S^T[32][24] = K Q^T   4 keys x 24 rows of accumulators per pass (12 ymm): a key's element
//                         broadcast against the tile's q transposed to [D][24] (packed once)
//   online softmax        running max m and sum l per row, 8 rows per vector: the max and sum
//                         over a block's keys are vertical (no horizontal reductions)
//   O[24][D] += P V       6 rows x 16 dims of accumulators per pass, O in L1
// Why no packed copy: an earlier form first packed each KV head's whole context per call (K
// transposed per 32-key block), O(L) work per layer whatever the chunk's size: for a chunk of a
// few dozen tokens continuing a 1000-token prompt that was ~0.8 ms per layer, a third of the
// attention, and it made chunked prefill pay for every chunk (16 tokens at 1000: 73 ns per
// (query, key) pair vs 48 at 128 tokens; Zen 3). Scores and weights stay float32 (no rounding
// beyond summation order). Items are handed out dynamically, costliest (latest rows) first, so a
// thread slowed by a busy neighbour takes fewer of them; small problems run on the calling thread.
#include "../common.h"
#include "../ops.h"
#include "../prefill_args.h"
#include "vec8.h"

namespace cadence_kernels {

#if CADENCE_HAVE_AVX2
namespace {

constexpr int64_t KEY_BLOCK = 32;  // keys per block
constexpr int TILE_ROWS = 24;      // stacked rows per item: 3 vectors of 8
constexpr int RV = TILE_ROWS / 8;  // row vectors per tile
constexpr int KG = 4;              // keys per score micro tile (4 x 3 ymm accumulators)
constexpr int MR = 6;              // rows per P V micro tile (6 x 2 ymm accumulators)
constexpr double SERIAL_MAX_FLOPS = 2e7;  // ~0.3 ms on one core

alignas(32) const float ZERO_ROW[128] = {};  // stands in for keys past the context (masked)

// ST[k][r] = k-th key . q_r for the block's `keys` keys (a multiple of KG); qT [D][TILE_ROWS].
template <int D>
inline void qk_block(const float* qT, const float* const* krow, float* ST, int keys) {
  for (int k0 = 0; k0 < keys; k0 += KG) {
    __m256 acc[KG][RV];
    for (int k = 0; k < KG; ++k)
      for (int v = 0; v < RV; ++v) acc[k][v] = _mm256_setzero_ps();
    for (int d = 0; d < D; ++d) {
      __m256 qv[RV];
      for (int v = 0; v < RV; ++v) qv[v] = _mm256_load_ps(qT + d * TILE_ROWS + 8 * v);
      for (int k = 0; k < KG; ++k) {
        const __m256 kb = _mm256_broadcast_ss(krow[k0 + k] + d);
        for (int v = 0; v < RV; ++v) acc[k][v] = _mm256_fmadd_ps(kb, qv[v], acc[k][v]);
      }
    }
    for (int k = 0; k < KG; ++k)
      for (int v = 0; v < RV; ++v) _mm256_store_ps(ST + (k0 + k) * TILE_ROWS + 8 * v, acc[k][v]);
  }
}

// O[r] = O[r] * alpha[r] + sum_k P[k][r] V[k] over the block's `keys` keys; P [KEY_BLOCK][TILE_ROWS],
// O [TILE_ROWS][D].
template <int D>
inline void pv_block(const float* P, const float* const* vrow, const float* alpha, float* O, int keys) {
  for (int r0 = 0; r0 < TILE_ROWS; r0 += MR) {
    for (int d0 = 0; d0 < D; d0 += 16) {
      __m256 acc[MR][2];
      for (int r = 0; r < MR; ++r) {
        const __m256 a = _mm256_set1_ps(alpha[r0 + r]);
        acc[r][0] = _mm256_mul_ps(a, _mm256_load_ps(O + (r0 + r) * D + d0));
        acc[r][1] = _mm256_mul_ps(a, _mm256_load_ps(O + (r0 + r) * D + d0 + 8));
      }
      for (int k = 0; k < keys; ++k) {
        const __m256 v0 = _mm256_loadu_ps(vrow[k] + d0);
        const __m256 v1 = _mm256_loadu_ps(vrow[k] + d0 + 8);
        for (int r = 0; r < MR; ++r) {
          const __m256 pb = _mm256_broadcast_ss(P + k * TILE_ROWS + r0 + r);
          acc[r][0] = _mm256_fmadd_ps(pb, v0, acc[r][0]);
          acc[r][1] = _mm256_fmadd_ps(pb, v1, acc[r][1]);
        }
      }
      for (int r = 0; r < MR; ++r) {
        _mm256_store_ps(O + (r0 + r) * D + d0, acc[r][0]);
        _mm256_store_ps(O + (r0 + r) * D + d0 + 8, acc[r][1]);
      }
    }
  }
}

struct Problem {
  const float* q;
  int64_t qs0, qs1;
  float* out;  // [n, Hq, D] contiguous
  const float* kdata;
  const float* vdata;
  int64_t ks0, ks1, ksh, vs0, vs1, vsh;
  const PrefillArgs* args;
  int64_t n, Hq, G, start;
  float scale;
};

// One work item: KV head h, stacked rows [m0, m0 + TILE_ROWS).
template <int D>
void attend_tile(const Problem& p, int64_t h, int64_t m0) {
  alignas(32) float qT[D * TILE_ROWS];
  alignas(32) float ST[KEY_BLOCK * TILE_ROWS];
  alignas(32) float O[TILE_ROWS * D];
  alignas(32) float m_run[TILE_ROWS], l_run[TILE_ROWS], alpha[TILE_ROWS], posf[TILE_ROWS];
  const float* krow[KEY_BLOCK];
  const float* vrow[KEY_BLOCK];

  const int64_t rows = std::min<int64_t>(TILE_ROWS, p.n * p.G - m0);
  for (int r = 0; r < TILE_ROWS; ++r) {
    // Rows past the end repeat the tile's first row (computed, never stored).
    const int64_t m = m0 + (r < rows ? r : 0);
    const int64_t j = m / p.G, head = h * p.G + m % p.G;
    posf[r] = static_cast<float>(p.start + j);  // exact: positions < 2^24
    const float* src = p.q + j * p.qs0 + head * p.qs1;
    for (int d = 0; d < D; ++d) qT[d * TILE_ROWS + r] = src[d] * p.scale;
    m_run[r] = -INFINITY;
    l_run[r] = 0.f;
  }
  std::fill(O, O + TILE_ROWS * D, 0.f);
  const int64_t first_pos = p.start + m0 / p.G, last_pos = p.start + (m0 + rows - 1) / p.G;
  const int64_t nblocks = last_pos / KEY_BLOCK + 1;
  const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
  __m256 pos_v[RV];
  for (int v = 0; v < RV; ++v) pos_v[v] = _mm256_load_ps(posf + 8 * v);

  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t k0 = b * KEY_BLOCK;
    // Keys [k0, k0 + keys) can be visible to some row of the tile; padded to KG with a zero row
    // (masked below: its position is past every row's).
    const int64_t live = std::min<int64_t>(KEY_BLOCK, last_pos + 1 - k0);
    const int keys = static_cast<int>((live + KG - 1) / KG * KG);
    for (int k = 0; k < keys; ++k) {
      if (k < live) {
        krow[k] = p.kdata + p.args->row_offset(k0 + k, p.ks0, p.ks1) + h * p.ksh;
        vrow[k] = p.vdata + p.args->row_offset(k0 + k, p.vs0, p.vs1) + h * p.vsh;
      } else {
        krow[k] = vrow[k] = ZERO_ROW;
      }
    }
    qk_block<D>(qT, krow, ST, keys);
    const bool diagonal = k0 + keys - 1 > first_pos;
    for (int v = 0; v < RV; ++v) {
      __m256 mx = neg_inf;
      for (int k = 0; k < keys; ++k) {
        __m256 sv = _mm256_load_ps(ST + k * TILE_ROWS + 8 * v);
        if (diagonal)
          sv = _mm256_blendv_ps(neg_inf, sv,
                                _mm256_cmp_ps(_mm256_set1_ps(static_cast<float>(k0 + k)), pos_v[v], _CMP_LE_OQ));
        mx = _mm256_max_ps(mx, sv);
      }
      const __m256 m_old = _mm256_load_ps(m_run + 8 * v);
      // Every row sees key 0, so after block 0 the max is finite; before it, m_old = -inf and
      // O, l are 0, so alpha's value (exp8 clamps: ~1e-38) does not matter.
      const __m256 m_new = _mm256_max_ps(m_old, mx);
      const __m256 a = avx2::exp8(_mm256_sub_ps(m_old, m_new));
      _mm256_store_ps(alpha + 8 * v, a);
      _mm256_store_ps(m_run + 8 * v, m_new);
      __m256 sum = _mm256_setzero_ps();
      for (int k = 0; k < keys; ++k) {
        float* sp = ST + k * TILE_ROWS + 8 * v;
        __m256 e = avx2::exp8(_mm256_sub_ps(_mm256_load_ps(sp), m_new));
        if (diagonal)
          e = _mm256_and_ps(e, _mm256_cmp_ps(_mm256_set1_ps(static_cast<float>(k0 + k)), pos_v[v], _CMP_LE_OQ));
        _mm256_store_ps(sp, e);
        sum = _mm256_add_ps(sum, e);
      }
      _mm256_store_ps(l_run + 8 * v, _mm256_fmadd_ps(_mm256_load_ps(l_run + 8 * v), a, sum));
    }
    pv_block<D>(ST, vrow, alpha, O, keys);
  }

  for (int r = 0; r < rows; ++r) {
    const int64_t m = m0 + r;
    const int64_t j = m / p.G, head = h * p.G + m % p.G;
    const __m256 inv = _mm256_set1_ps(1.f / l_run[r]);
    float* dst = p.out + (j * p.Hq + head) * D;
    for (int d = 0; d < D; d += 8) _mm256_storeu_ps(dst + d, _mm256_mul_ps(_mm256_load_ps(O + r * D + d), inv));
  }
}

}  // namespace
#endif

at::Tensor prefill_attention_f32(at::Tensor q, at::Tensor keys, at::Tensor values, double scale,
                                 c10::optional<at::Tensor> block_table, int64_t ctx_len) {
  const PrefillArgs args = check_prefill_args(q, keys, values, block_table, ctx_len, at::kFloat,
                                              "prefill_attention_f32");
#if CADENCE_HAVE_AVX2
  const int64_t n = args.n, Hq = args.Hq, D = args.D, Hkv = args.Hkv, L = args.L;
  auto out = at::empty({n, Hq, D}, q.options());
  if (n == 0 || Hq == 0) return out;
  // Any token/head strides; the head_dim must be contiguous.
  if (q.stride(2) != 1) q = q.contiguous();
  if (keys.stride(-1) != 1) keys = keys.contiguous();
  if (values.stride(-1) != 1) values = values.contiguous();

  const int64_t ks0 = keys.stride(0), ks1 = args.paged ? keys.stride(1) : 0, ksh = keys.stride(-2);
  const int64_t vs0 = values.stride(0), vs1 = args.paged ? values.stride(1) : 0, vsh = values.stride(-2);
  // Small problems (short chunks over short contexts) stay on the calling thread: waking the
  // pool costs more than the work, and far more when a busy neighbour holds a core.
  const double flops = 4.0 * D * n * Hq * (static_cast<double>(L) - n / 2.0);
  const bool serial = flops < SERIAL_MAX_FLOPS;
  Problem p{q.data_ptr<float>(), q.stride(0), q.stride(1), out.data_ptr<float>(), keys.data_ptr<float>(),
            values.data_ptr<float>(), ks0, ks1, ksh, vs0, vs1, vsh, &args, n, Hq, Hq / Hkv, L - n,
            static_cast<float>(scale)};
  const int64_t tiles = (n * p.G + TILE_ROWS - 1) / TILE_ROWS;
  const int64_t items = tiles * Hkv;
  // Item i: tile tiles - 1 - i / Hkv (latest rows, most keys, first), KV head i % Hkv.
  for_items_dynamic(items, serial, [&](int64_t i) {
    const avx2::FlushDenormals ftz;
    const int64_t tile = tiles - 1 - i / Hkv, h = i % Hkv;
    if (D == 64) attend_tile<64>(p, h, tile * TILE_ROWS);
    else attend_tile<128>(p, h, tile * TILE_ROWS);
  });
  return out;
#else
  TORCH_CHECK(false, "prefill_attention_f32: built without AVX2/FMA");
  return q;
#endif
}

}  // namespace cadence_kernels
