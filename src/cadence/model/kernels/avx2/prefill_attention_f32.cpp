// prefill_attention_f32: causal flash attention of a float32 prefill chunk over its context, with
// AVX2 FMA tiles and an online softmax (the float32 counterpart of prefill_attention.cpp, for CPUs
// without native bf16).
//
// q [n, Hq, D] attends over a context of L >= n positions: keys/values [L, Hkv, D], or the paged
// caches [num_blocks, block_size, Hkv, D] read through one sequence's block table. Query j sits at
// position L - n + j and sees keys [0, L - n + j]. The G = Hq / Hkv query heads that share a KV
// head are stacked as rows (row m = query m / G, head m % G), so one pass over a KV head's keys
// serves the whole group. Each KV head's keys and values are first packed per 32-key block
// (K transposed to [D][32]: a row's dot products with 16 keys are two FMAs per dim; V as [32][D]);
// then work items (KV head, tile of TILE_ROWS rows) walk the key blocks at or below their causal
// diagonal only (diagonal blocks masked per row, the upper 16 keys skipped when no row sees them):
//   S[24][32] = Q K^T     6 rows x 16 keys of accumulators per pass (12 ymm), q broadcast
//   online softmax        running max m and sum l per row; O and l rescaled when m moves
//   O[24][D] += P V       6 rows x 16 dims of accumulators per pass, O in L1
// Scores and weights stay float32 (no rounding beyond summation order). On one Zen 3 core this
// runs at ~55-60 GFLOP/s (causal half counted) at 512-2048 tokens, vs torch SDPA's 30-50.
// Items are handed out dynamically, costliest (latest rows) first, so a thread slowed by a busy
// neighbour takes fewer of them; small problems run on the calling thread.
#include <memory>

#include "../common.h"
#include "../ops.h"
#include "../prefill_args.h"
#include "vec8.h"

namespace cadence_kernels {

#if CADENCE_HAVE_AVX2
namespace {

constexpr int64_t KEY_BLOCK = 32;  // keys per block: 4 ymm of scores per row
constexpr int TILE_ROWS = 24;      // stacked rows per item
constexpr int MR = 6;              // rows per micro tile (6 x 2 ymm accumulators)
constexpr double SERIAL_MAX_FLOPS = 2e7;  // ~0.3 ms on one core

// S[r][k0 .. k0 + 16 * halves) = q_r . k for the block's keys; qt [TILE_ROWS][D], kp [D][KEY_BLOCK].
template <int D>
inline void qk_block(const float* qt, const float* kp, float* S, int halves) {
  for (int r0 = 0; r0 < TILE_ROWS; r0 += MR) {
    for (int k0 = 0; k0 < 16 * halves; k0 += 16) {
      __m256 acc[MR][2];
      for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
      for (int d = 0; d < D; ++d) {
        const __m256 klo = _mm256_loadu_ps(kp + d * KEY_BLOCK + k0);
        const __m256 khi = _mm256_loadu_ps(kp + d * KEY_BLOCK + k0 + 8);
        for (int r = 0; r < MR; ++r) {
          const __m256 qb = _mm256_broadcast_ss(qt + (r0 + r) * D + d);
          acc[r][0] = _mm256_fmadd_ps(qb, klo, acc[r][0]);
          acc[r][1] = _mm256_fmadd_ps(qb, khi, acc[r][1]);
        }
      }
      for (int r = 0; r < MR; ++r) {
        _mm256_storeu_ps(S + (r0 + r) * KEY_BLOCK + k0, acc[r][0]);
        _mm256_storeu_ps(S + (r0 + r) * KEY_BLOCK + k0 + 8, acc[r][1]);
      }
    }
  }
}

// O[r] = O[r] * alpha[r] + P[r] V over the block's first `keys` keys; P [TILE_ROWS][KEY_BLOCK],
// vp [KEY_BLOCK][D], O [TILE_ROWS][D].
template <int D>
inline void pv_block(const float* P, const float* vp, const float* alpha, float* O, int keys) {
  for (int r0 = 0; r0 < TILE_ROWS; r0 += MR) {
    for (int d0 = 0; d0 < D; d0 += 16) {
      __m256 acc[MR][2];
      for (int r = 0; r < MR; ++r) {
        const __m256 a = _mm256_set1_ps(alpha[r0 + r]);
        acc[r][0] = _mm256_mul_ps(a, _mm256_loadu_ps(O + (r0 + r) * D + d0));
        acc[r][1] = _mm256_mul_ps(a, _mm256_loadu_ps(O + (r0 + r) * D + d0 + 8));
      }
      for (int k = 0; k < keys; ++k) {
        const __m256 v0 = _mm256_loadu_ps(vp + k * D + d0);
        const __m256 v1 = _mm256_loadu_ps(vp + k * D + d0 + 8);
        for (int r = 0; r < MR; ++r) {
          const __m256 pb = _mm256_broadcast_ss(P + (r0 + r) * KEY_BLOCK + k);
          acc[r][0] = _mm256_fmadd_ps(pb, v0, acc[r][0]);
          acc[r][1] = _mm256_fmadd_ps(pb, v1, acc[r][1]);
        }
      }
      for (int r = 0; r < MR; ++r) {
        _mm256_storeu_ps(O + (r0 + r) * D + d0, acc[r][0]);
        _mm256_storeu_ps(O + (r0 + r) * D + d0 + 8, acc[r][1]);
      }
    }
  }
}

struct Problem {
  const float* q;
  int64_t qs0, qs1;
  float* out;          // [n, Hq, D] contiguous
  const float* kpack;  // [Hkv][blocks][D][KEY_BLOCK]
  const float* vpack;  // [Hkv][blocks][KEY_BLOCK][D]
  int64_t n, Hq, G, start, blocks;
  float scale;
};

// One work item: KV head h, stacked rows [m0, m0 + TILE_ROWS).
template <int D>
void attend_tile(const Problem& p, int64_t h, int64_t m0) {
  alignas(32) float qt[TILE_ROWS * D];
  alignas(32) float S[TILE_ROWS * KEY_BLOCK];
  alignas(32) float O[TILE_ROWS * D];
  float m_run[TILE_ROWS], l_run[TILE_ROWS], alpha[TILE_ROWS];
  int64_t pos[TILE_ROWS];

  const int64_t rows = std::min<int64_t>(TILE_ROWS, p.n * p.G - m0);
  const __m256 vscale = _mm256_set1_ps(p.scale);
  for (int r = 0; r < TILE_ROWS; ++r) {
    // Rows past the end repeat the tile's first row (computed, never stored).
    const int64_t m = m0 + (r < rows ? r : 0);
    const int64_t j = m / p.G, head = h * p.G + m % p.G;
    pos[r] = p.start + j;
    const float* src = p.q + j * p.qs0 + head * p.qs1;
    for (int d = 0; d < D; d += 8) _mm256_storeu_ps(qt + r * D + d, _mm256_mul_ps(_mm256_loadu_ps(src + d), vscale));
    m_run[r] = -INFINITY;
    l_run[r] = 0.f;
  }
  std::fill(O, O + TILE_ROWS * D, 0.f);
  const int64_t first_pos = pos[0], last_pos = pos[rows - 1];
  const int64_t nblocks = last_pos / KEY_BLOCK + 1;
  const int64_t block_floats = KEY_BLOCK * D;
  const float* kbase = p.kpack + h * p.blocks * block_floats;
  const float* vbase = p.vpack + h * p.blocks * block_floats;
  const __m256 neg_inf = _mm256_set1_ps(-INFINITY);

  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t k0 = b * KEY_BLOCK;
    // Keys [k0, k0 + keys) can be visible to some row of the tile.
    const int halves = std::min<int64_t>(KEY_BLOCK, last_pos + 1 - k0) > 16 ? 2 : 1;
    const int keys = 16 * halves;
    qk_block<D>(qt, kbase + b * block_floats, S, halves);
    const bool diagonal = k0 + KEY_BLOCK - 1 > first_pos;
    for (int r = 0; r < TILE_ROWS; ++r) {
      float* s = S + r * KEY_BLOCK;
      const int64_t visible = diagonal ? std::clamp<int64_t>(pos[r] - k0 + 1, 0, keys) : keys;
      __m256 mx = neg_inf;
      for (int c = 0; c < keys; c += 8) {
        __m256 v = _mm256_loadu_ps(s + c);
        if (visible - c < 8) v = _mm256_blendv_ps(neg_inf, v, _mm256_castsi256_ps(avx2::first_lanes(visible - c)));
        mx = _mm256_max_ps(mx, v);
      }
      const float m_new = std::max(m_run[r], avx2::hmax(mx));
      // The first block sets the max (m_run = -inf: the factor is exp(-inf) = 0, of zeros).
      alpha[r] = m_new > m_run[r] ? std::exp(m_run[r] - m_new) : 1.f;
      m_run[r] = m_new;
      const __m256 mv = _mm256_set1_ps(m_new);
      __m256 sum = _mm256_setzero_ps();
      for (int c = 0; c < keys; c += 8) {
        __m256 e = avx2::exp8(_mm256_sub_ps(_mm256_loadu_ps(s + c), mv));
        if (visible - c < 8) e = _mm256_and_ps(e, _mm256_castsi256_ps(avx2::first_lanes(visible - c)));
        _mm256_storeu_ps(s + c, e);
        sum = _mm256_add_ps(sum, e);
      }
      l_run[r] = l_run[r] * alpha[r] + avx2::hsum(sum);
    }
    pv_block<D>(S, vbase + b * block_floats, alpha, O, keys);
  }

  for (int r = 0; r < rows; ++r) {
    const int64_t m = m0 + r;
    const int64_t j = m / p.G, head = h * p.G + m % p.G;
    const __m256 inv = _mm256_set1_ps(1.f / l_run[r]);
    float* dst = p.out + (j * p.Hq + head) * D;
    for (int d = 0; d < D; d += 8) _mm256_storeu_ps(dst + d, _mm256_mul_ps(_mm256_loadu_ps(O + r * D + d), inv));
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

  const int64_t blocks = (L + KEY_BLOCK - 1) / KEY_BLOCK;
  const int64_t block_floats = KEY_BLOCK * D;
  // Every float is written by the packing (zero padding included): no initialisation here.
  std::unique_ptr<float[]> kpack(new float[Hkv * blocks * block_floats]);
  std::unique_ptr<float[]> vpack(new float[Hkv * blocks * block_floats]);
  const float* kdata = keys.data_ptr<float>();
  const float* vdata = values.data_ptr<float>();
  const int64_t ks0 = keys.stride(0), ks1 = args.paged ? keys.stride(1) : 0, ksh = keys.stride(-2);
  const int64_t vs0 = values.stride(0), vs1 = args.paged ? values.stride(1) : 0, vsh = values.stride(-2);
  // Small problems (short chunks over short contexts) stay on the calling thread: waking the
  // pool costs more than the work, and far more when a busy neighbour holds a core.
  const double flops = 4.0 * D * n * Hq * (static_cast<double>(L) - n / 2.0);
  const bool serial = flops < SERIAL_MAX_FLOPS;
  at::parallel_for(0, Hkv * blocks, serial ? Hkv * blocks : 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t h = i / blocks, k0 = (i % blocks) * KEY_BLOCK;
      const int64_t count = std::min<int64_t>(KEY_BLOCK, L - k0);
      float* kp = kpack.get() + i * block_floats;
      float* vp = vpack.get() + i * block_floats;
      for (int64_t key = 0; key < KEY_BLOCK; ++key) {
        if (key < count) {
          const float* krow = kdata + args.row_offset(k0 + key, ks0, ks1) + h * ksh;
          const float* vrow = vdata + args.row_offset(k0 + key, vs0, vs1) + h * vsh;
          for (int64_t d = 0; d < D; ++d) kp[d * KEY_BLOCK + key] = krow[d];
          std::memcpy(vp + key * D, vrow, D * sizeof(float));
        } else {
          for (int64_t d = 0; d < D; ++d) kp[d * KEY_BLOCK + key] = 0.f;
          std::fill(vp + key * D, vp + (key + 1) * D, 0.f);
        }
      }
    }
  });

  Problem p{q.data_ptr<float>(), q.stride(0), q.stride(1), out.data_ptr<float>(), kpack.get(), vpack.get(),
            n, Hq, Hq / Hkv, L - n, blocks, static_cast<float>(scale)};
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
