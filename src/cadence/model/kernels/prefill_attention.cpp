// prefill_attention: causal flash attention of a bf16 prefill chunk over its context, with
// AVX512-BF16 dot products (vdpbf16ps) and an online softmax in float32.
//
// q [n, Hq, D] attends over a context of L >= n positions: keys/values [L, Hkv, D], or the
// paged caches [num_blocks, block_size, Hkv, D] read through one sequence's block table (no
// gather). Query j sits at position L - n + j and sees keys [0, L - n + j]. The G = Hq / Hkv
// query heads that share a KV head are stacked as rows (row m = query m / G, head m % G), so one
// pass over a KV head's keys serves the whole group. First each KV head's keys and values are
// packed once, per 64-key block, into the layouts the dot products want; then work items
// (KV head, tile of TILE_ROWS rows) walk the key blocks at or below their causal diagonal only
// (diagonal blocks masked per row, 32-key halves past the last row skipped):
//   scores  S[rows][64 keys] = Q K^T   (K block as [D/2][64 keys] dim pairs: 64-byte loads of
//                                        16 keys, q pairs broadcast; 12 x 32 keys per pass)
//   online softmax in f32, base 2: running max m and sum l per row; the max moves only when a
//                          score passes it by 2^8 (lazy rescaling: alpha and the O rescale are
//                          rare); weights rounded to bf16 for P V, as flash attention does
//   O[rows][D] += P V                  (V block as [32 key pairs][D]: P pairs broadcast, 6 rows
//                                        x 64 dims of f32 accumulators per pass, O in L1)
// One core runs vdpbf16ps at ~220 GFLOP/s on Zen4; this reaches ~180 (the causal half counted)
// at 2048 tokens, the rest going to the softmax.
// Items are handed out dynamically, costliest (latest rows) first, so a thread slowed by a busy
// neighbour takes fewer of them; small problems run on the calling thread.
#include "common.h"
#include "ops.h"
#include "prefill_args.h"

#include <atomic>
#include <memory>

namespace cadence_kernels {

#if CADENCE_HAVE_AVX512BF16
namespace {

constexpr int64_t KEY_BLOCK = 64;  // keys per block: four zmm of scores per row
constexpr int64_t QK_KEYS = 32;    // keys per Q K^T pass: 12 rows x 2 zmm accumulators
constexpr int TILE_ROWS = 12;      // rows per item
constexpr int PV_ROWS = 6;         // rows per P V pass: 6 x 4 zmm accumulators (64 dims)
constexpr double SERIAL_MAX_FLOPS = 2e7;  // ~0.1 ms on one core
constexpr float LAZY_MAX_LOG2 = 8.f;  // softmax weights stay <= 2^8 between max updates

// 2^x for softmax weights that are rounded to bf16 next: 2^floor(x) (vscalefps floors its
// exponent) times a cubic in x - floor(x) (vreduceps), relative error 7.5e-5, 25x below bf16's
// rounding. -inf lanes come out NaN: the caller masks them.
inline __m512 exp2_bf16_accuracy(__m512 x) {
  const __m512 f = _mm512_reduce_ps(x, _MM_FROUND_TO_NEG_INF);  // x - floor(x), in [0, 1)
  __m512 y = _mm512_fmadd_ps(_mm512_set1_ps(0.078027293f), f, _mm512_set1_ps(0.22606325f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(0.69583488f));
  y = _mm512_fmadd_ps(y, f, _mm512_set1_ps(0.99992514f));
  return _mm512_scalef_ps(y, x);
}

// Packs one key block (count <= KEY_BLOCK keys; zero padding past them) of one KV head into the
// dot-product layouts. krow[i], vrow[i]: key i's K and V rows. kp: [D/2][KEY_BLOCK] uint32 (a
// key's dim pair per lane); vp: [KEY_BLOCK/2][D] uint32 (a dim's key pair per lane).
inline void pack_block(const uint16_t* const* krow, const uint16_t* const* vrow, int64_t count,
                       int64_t D, uint32_t* kp, uint16_t* vp) {
  for (int64_t key = 0; key < KEY_BLOCK; ++key) {
    if (key < count) {
      const uint16_t* row = krow[key];
      for (int64_t d2 = 0; d2 < D / 2; ++d2) {
        uint32_t pair;
        std::memcpy(&pair, row + 2 * d2, sizeof(pair));
        kp[d2 * KEY_BLOCK + key] = pair;
      }
    } else {
      for (int64_t d2 = 0; d2 < D / 2; ++d2) kp[d2 * KEY_BLOCK + key] = 0;
    }
  }
  // [a0 b0 a1 b1 ...]: lanes 0..15 of a zmm of 32 bf16 pairs take dims d..d+15 of rows a and b.
  alignas(64) static const uint16_t lo_idx[32] = {0, 32, 1, 33, 2, 34, 3, 35, 4, 36, 5, 37, 6, 38, 7, 39,
                                                  8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static const uint16_t hi_idx[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21, 53, 22, 54, 23, 55,
                                                  24, 56, 25, 57, 26, 58, 27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  const __m512i lo = _mm512_load_si512(lo_idx), hi = _mm512_load_si512(hi_idx);
  for (int64_t kp2 = 0; kp2 < KEY_BLOCK / 2; ++kp2) {
    const int64_t ka = 2 * kp2, kb = ka + 1;
    uint16_t* dst = vp + kp2 * D * 2;
    for (int64_t d = 0; d < D; d += 32) {
      const __m512i a = ka < count ? _mm512_loadu_si512(vrow[ka] + d) : _mm512_setzero_si512();
      const __m512i c = kb < count ? _mm512_loadu_si512(vrow[kb] + d) : _mm512_setzero_si512();
      _mm512_storeu_si512(dst + 2 * d, _mm512_permutex2var_epi16(a, lo, c));
      _mm512_storeu_si512(dst + 2 * d + 32, _mm512_permutex2var_epi16(a, hi, c));
    }
  }
}

// S[r][0..31] = q_r . k for 32 keys of a block (raw scores, unscaled); S rows KEY_BLOCK apart.
// qt: [TILE_ROWS][D] bf16; kp: the block's [D/2][KEY_BLOCK] pairs, from the first of the keys.
template <int D>
inline void qk_keys(const uint16_t* qt, const uint32_t* kp, float* S) {
  __m512 acc[TILE_ROWS][2];
  for (int r = 0; r < TILE_ROWS; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int d2 = 0; d2 < D / 2; ++d2) {
    const __m512bh k0 = (__m512bh)_mm512_loadu_si512(kp + d2 * KEY_BLOCK);
    const __m512bh k1 = (__m512bh)_mm512_loadu_si512(kp + d2 * KEY_BLOCK + 16);
    for (int r = 0; r < TILE_ROWS; ++r) {
      int32_t pair;
      std::memcpy(&pair, qt + r * D + 2 * d2, sizeof(pair));
      const __m512bh qb = (__m512bh)_mm512_set1_epi32(pair);
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], qb, k0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], qb, k1);
    }
  }
  for (int r = 0; r < TILE_ROWS; ++r) {
    _mm512_store_ps(S + r * KEY_BLOCK, acc[r][0]);
    _mm512_store_ps(S + r * KEY_BLOCK + 16, acc[r][1]);
  }
}

// O[r][dims] = O[r][dims] * alpha[r] (alpha null: 1) + P[r] V over the block's key pairs, for PV_ROWS rows and
// the 64 dims at d0. P: [rows][KEY_BLOCK / 2] uint32 (bf16 key pairs); vp: [KEY_BLOCK / 2][D].
template <int D>
inline void pv_block(const uint32_t* P, const uint32_t* vp, const float* alpha, float* O, int d0,
                     int pairs) {
  __m512 acc[PV_ROWS][4];
  for (int r = 0; r < PV_ROWS; ++r)
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_load_ps(O + r * D + d0 + 16 * j);
  if (alpha != nullptr) {
    for (int r = 0; r < PV_ROWS; ++r)
      for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_mul_ps(acc[r][j], _mm512_set1_ps(alpha[r]));
  }
  for (int kp = 0; kp < pairs; ++kp) {
    const uint32_t* v = vp + kp * D + d0;
    const __m512bh v0 = (__m512bh)_mm512_loadu_si512(v);
    const __m512bh v1 = (__m512bh)_mm512_loadu_si512(v + 16);
    const __m512bh v2 = (__m512bh)_mm512_loadu_si512(v + 32);
    const __m512bh v3 = (__m512bh)_mm512_loadu_si512(v + 48);
    for (int r = 0; r < PV_ROWS; ++r) {
      const __m512bh pb = (__m512bh)_mm512_set1_epi32(static_cast<int32_t>(P[r * (KEY_BLOCK / 2) + kp]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], pb, v0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], pb, v1);
      acc[r][2] = _mm512_dpbf16_ps(acc[r][2], pb, v2);
      acc[r][3] = _mm512_dpbf16_ps(acc[r][3], pb, v3);
    }
  }
  for (int r = 0; r < PV_ROWS; ++r)
    for (int j = 0; j < 4; ++j) _mm512_store_ps(O + r * D + d0 + 16 * j, acc[r][j]);
}

inline __mmask16 first_lanes(int64_t count) {
  return count <= 0 ? (__mmask16)0 : count >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << count) - 1);
}

struct Problem {
  const uint16_t* q;
  int64_t qs0, qs1;
  uint16_t* out;  // [n, Hq, D] contiguous
  const uint32_t* kpack;  // [Hkv][blocks][D/2][KEY_BLOCK]
  const uint32_t* vpack;  // [Hkv][blocks][KEY_BLOCK/2][D]
  int64_t n, Hq, G, start, blocks;
  float scale;
};

// One work item: KV head h, rows [m0, m0 + TILE_ROWS) of its n * G stacked rows.
template <int D>
void attend_tile(const Problem& p, int64_t h, int64_t m0) {
  constexpr int C = KEY_BLOCK / 16;  // zmm of scores per row and block
  alignas(64) uint16_t qt[TILE_ROWS * D];
  alignas(64) float S[TILE_ROWS * KEY_BLOCK];
  alignas(64) uint32_t P[TILE_ROWS * KEY_BLOCK / 2];
  alignas(64) float O[TILE_ROWS * D];
  alignas(64) float lsum[TILE_ROWS * 16];
  alignas(64) float m_run[16], m_blk[16], alpha[16];
  __mmask16 mask[TILE_ROWS][C];
  int64_t pos[TILE_ROWS];

  const int64_t rows = std::min<int64_t>(TILE_ROWS, p.n * p.G - m0);
  for (int r = 0; r < TILE_ROWS; ++r) {
    // Rows past the end repeat the tile's first row (computed, never stored).
    const int64_t m = m0 + (r < rows ? r : 0);
    const int64_t j = m / p.G, head = h * p.G + m % p.G;
    pos[r] = p.start + j;
    std::memcpy(qt + r * D, p.q + j * p.qs0 + head * p.qs1, D * sizeof(uint16_t));
  }
  std::fill(O, O + TILE_ROWS * D, 0.f);
  std::fill(lsum, lsum + TILE_ROWS * 16, 0.f);
  std::fill(m_run, m_run + 16, -1e30f);  // finite: alpha = 2^(-huge) = 0 on the first block
  std::fill(m_blk, m_blk + 16, -1e30f);  // rows that keep their max this block: no change
  const int64_t first_pos = pos[0], last_pos = pos[rows - 1];
  const int64_t nblocks = last_pos / KEY_BLOCK + 1;
  // Softmax in base 2: p = 2^((s - m) * scale * log2(e)).
  const float c2 = p.scale * 1.4426950408889634f;
  const __m512 vc2 = _mm512_set1_ps(c2);
  const float lazy_margin = LAZY_MAX_LOG2 / c2;  // in raw score units
  const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
  const int64_t block_words = KEY_BLOCK / 2 * D;
  const uint32_t* kbase = p.kpack + h * p.blocks * block_words;
  const uint32_t* vbase = p.vpack + h * p.blocks * block_words;

  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t k0 = b * KEY_BLOCK;
    const uint32_t* kp = kbase + b * block_words;
    // Keys [k0, k_used) can be visible to a row of this tile (the rest of a diagonal block is
    // masked): skip the Q K^T and P V work of whole 32-key halves past it.
    const int64_t halves = std::min<int64_t>(KEY_BLOCK, last_pos + 1 - k0) > QK_KEYS ? 2 : 1;
    for (int64_t half = 0; half < halves; ++half) qk_keys<D>(qt, kp + half * QK_KEYS, S + half * QK_KEYS);
    const bool diagonal = k0 + KEY_BLOCK - 1 > first_pos;
    bool rescale = false;
    for (int r = 0; r < TILE_ROWS; ++r) {
      __m512 s[C];
      for (int c = 0; c < C; ++c) s[c] = _mm512_load_ps(S + r * KEY_BLOCK + 16 * c);
      if (diagonal) {
        const int64_t visible = pos[r] - k0 + 1;
        for (int c = 0; c < C; ++c) {
          mask[r][c] = first_lanes(visible - 16 * c);
          s[c] = _mm512_mask_mov_ps(neg_inf, mask[r][c], s[c]);
          _mm512_store_ps(S + r * KEY_BLOCK + 16 * c, s[c]);
        }
      }
      __m512 mx = s[0];
      for (int c = 1; c < C; ++c) mx = _mm512_max_ps(mx, s[c]);
      // Lazy rescaling: the running max moves only when a score exceeds it by more than
      // LAZY_MAX_LOG2 (weights up to 2^LAZY_MAX_LOG2 are fine in f32 and bf16), so after the
      // first blocks a row rarely needs the horizontal max, the new alpha or an O rescale.
      if (_mm512_cmp_ps_mask(mx, _mm512_set1_ps(m_run[r] + lazy_margin), _CMP_GT_OQ)) {
        m_blk[r] = _mm512_reduce_max_ps(mx);
        rescale = true;
      }
    }
    if (rescale) {
      // All rows at once: new running max and the factor for what was accumulated so far.
      const __m512 m_old = _mm512_load_ps(m_run);
      const __m512 m_new = _mm512_max_ps(m_old, _mm512_load_ps(m_blk));
      _mm512_store_ps(alpha, exp2_bf16_accuracy(_mm512_mul_ps(_mm512_sub_ps(m_old, m_new), vc2)));
      _mm512_store_ps(m_run, m_new);
    }
    for (int r = 0; r < TILE_ROWS; ++r) {
      const __m512 mc = _mm512_set1_ps(m_run[r] * c2);
      __m512 pr[C];
      for (int c = 0; c < C; ++c) {
        pr[c] = exp2_bf16_accuracy(_mm512_fmsub_ps(_mm512_load_ps(S + r * KEY_BLOCK + 16 * c), vc2, mc));
        if (diagonal) pr[c] = _mm512_maskz_mov_ps(mask[r][c], pr[c]);
      }
      __m512 sum = _mm512_add_ps(pr[0], pr[1]);
      for (int c = 2; c < C; c += 2) sum = _mm512_add_ps(sum, _mm512_add_ps(pr[c], pr[c + 1]));
      __m512 l = _mm512_load_ps(lsum + r * 16);
      if (rescale) l = _mm512_mul_ps(l, _mm512_set1_ps(alpha[r]));
      _mm512_store_ps(lsum + r * 16, _mm512_add_ps(l, sum));
      for (int c = 0; c < C; c += 2)
        _mm512_store_si512(P + r * (KEY_BLOCK / 2) + 8 * c, (__m512i)_mm512_cvtne2ps_pbh(pr[c + 1], pr[c]));
    }
    const uint32_t* vp = vbase + b * block_words;
    const int pairs = static_cast<int>(halves * QK_KEYS / 2);
    for (int r0 = 0; r0 < TILE_ROWS; r0 += PV_ROWS)
      for (int d0 = 0; d0 < D; d0 += 64)
        pv_block<D>(P + r0 * (KEY_BLOCK / 2), vp, rescale ? alpha + r0 : nullptr, O + r0 * D, d0, pairs);
  }

  for (int r = 0; r < rows; ++r) {
    const int64_t m = m0 + r;
    const int64_t j = m / p.G, head = h * p.G + m % p.G;
    const __m512 inv = _mm512_set1_ps(1.f / _mm512_reduce_add_ps(_mm512_load_ps(lsum + r * 16)));
    c10::BFloat16* dst = reinterpret_cast<c10::BFloat16*>(p.out + (j * p.Hq + head) * D);
    for (int d = 0; d < D; d += 16) store16(dst + d, _mm512_mul_ps(_mm512_load_ps(O + r * D + d), inv));
  }
}

}  // namespace
#endif

at::Tensor prefill_attention(at::Tensor q, at::Tensor keys, at::Tensor values, double scale,
                             c10::optional<at::Tensor> block_table, int64_t ctx_len) {
  const PrefillArgs args = check_prefill_args(q, keys, values, block_table, ctx_len, at::kBFloat16,
                                              "prefill_attention");
  const int64_t n = args.n, Hq = args.Hq, D = args.D, Hkv = args.Hkv, L = args.L;
  const bool paged = args.paged;
#if CADENCE_HAVE_AVX512BF16
  auto out = at::empty({n, Hq, D}, q.options());
  if (n == 0 || Hq == 0) return out;
  // Any token/head strides; the head_dim must be contiguous.
  if (q.stride(2) != 1) q = q.contiguous();
  if (keys.stride(-1) != 1) keys = keys.contiguous();
  if (values.stride(-1) != 1) values = values.contiguous();

  const int64_t blocks = (L + KEY_BLOCK - 1) / KEY_BLOCK;
  const int64_t block_words = KEY_BLOCK / 2 * D;
  // Every word is written by the packing (zero padding included): no initialisation here.
  std::unique_ptr<uint32_t[]> kpack(new uint32_t[Hkv * blocks * block_words]);
  std::unique_ptr<uint32_t[]> vpack(new uint32_t[Hkv * blocks * block_words]);
  const uint16_t* kdata = reinterpret_cast<const uint16_t*>(keys.data_ptr<c10::BFloat16>());
  const uint16_t* vdata = reinterpret_cast<const uint16_t*>(values.data_ptr<c10::BFloat16>());
  // Element offset of context position t's row (head 0): through the block table when paged.
  const int64_t ks0 = keys.stride(0), ks1 = paged ? keys.stride(1) : 0, ksh = keys.stride(-2);
  const int64_t vs0 = values.stride(0), vs1 = paged ? values.stride(1) : 0, vsh = values.stride(-2);
  auto row_offset = [&](int64_t t, int64_t s0, int64_t s1) { return args.row_offset(t, s0, s1); };
  // Small problems (short chunks over short contexts) stay on the calling thread: waking the
  // pool costs more than the work, and far more when a busy neighbour holds a core.
  const double flops = 4.0 * D * n * Hq * (static_cast<double>(L) - n / 2.0);
  const bool serial = flops < SERIAL_MAX_FLOPS;
  at::parallel_for(0, Hkv * blocks, serial ? Hkv * blocks : 16, [&](int64_t begin, int64_t end) {
    const uint16_t* krow[KEY_BLOCK];
    const uint16_t* vrow[KEY_BLOCK];
    for (int64_t i = begin; i < end; ++i) {
      const int64_t h = i / blocks, k0 = (i % blocks) * KEY_BLOCK;
      const int64_t count = std::min<int64_t>(KEY_BLOCK, L - k0);
      for (int64_t key = 0; key < count; ++key) {
        krow[key] = kdata + row_offset(k0 + key, ks0, ks1) + h * ksh;
        vrow[key] = vdata + row_offset(k0 + key, vs0, vs1) + h * vsh;
      }
      pack_block(krow, vrow, count, D, kpack.get() + i * block_words,
                 reinterpret_cast<uint16_t*>(vpack.get() + i * block_words));
    }
  });

  Problem p{reinterpret_cast<const uint16_t*>(q.data_ptr<c10::BFloat16>()), q.stride(0), q.stride(1),
            reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>()), kpack.get(), vpack.get(),
            n, Hq, Hq / Hkv, L - n, blocks, static_cast<float>(scale)};
  const int64_t tiles = (n * p.G + TILE_ROWS - 1) / TILE_ROWS;
  const int64_t items = tiles * Hkv;
  // Item i: tile tiles - 1 - i / Hkv (latest rows, most keys, first), KV head i % Hkv.
  for_items_dynamic(items, serial, [&](int64_t i) {
    const int64_t tile = tiles - 1 - i / Hkv, h = i % Hkv;
    if (D == 64) attend_tile<64>(p, h, tile * TILE_ROWS);
    else attend_tile<128>(p, h, tile * TILE_ROWS);
  });
  return out;
#else
  TORCH_CHECK(false, "prefill_attention: built without AVX512-BF16");
  return q;
#endif
}

}  // namespace cadence_kernels
