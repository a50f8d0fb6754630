// prefill_attention: causal flash attention of a bf16 prefill chunk over its context, with
// AVX512-BF16 dot products (vdpbf16ps) and an online softmax in float32.
//
// q [n, Hq, D] attends over keys/values [L, Hkv, D] (L >= n): query j sits at position
// L - n + j and sees keys [0, L - n + j]. The G = Hq / Hkv query heads that share a KV head are
// stacked as rows (row m = query m / G, head m % G), so one pass over a KV head's keys serves
// the whole group. Work items are (KV head, tile of TILE_ROWS rows); each item walks the key
// blocks at or below its causal diagonal only (the diagonal blocks masked per row):
//   scores  S[rows][32 keys] = Q K^T   (K packed per block as [D/2][32 keys][2]: one 64-byte
//                                        load per key half, q pairs broadcast)
//   online softmax in f32: running max m and sum l per row, alpha = exp(m_old - m_new) rescales
//                          the output accumulators; P rounded to bf16 (as flash attention does)
//   O[rows][D] += P V                  (V packed per block as [16 key pairs][D][2]: P pairs
//                                        broadcast, f32 accumulators in L1 across blocks)
// Items are handed out dynamically, costliest (latest rows) first, so a thread slowed by a
// busy neighbour takes fewer of them.
#include "common.h"
#include "ops.h"

#include <atomic>

namespace cadence_kernels {

#if CADENCE_HAVE_AVX512BF16
namespace {

constexpr int64_t KEY_BLOCK = 32;  // keys per block: two zmm of scores per row
constexpr int TILE_ROWS = 12;      // rows per item: 24 score accumulators in Q K^T
constexpr int PV_ROWS = 6;         // rows per P V pass: 6 x 4 zmm accumulators (64 dims)

// Packs KV head h's keys and values, key block b, into the dot-product layouts (zero padding
// past the last key). kp: [D/2][32] uint32 (a key's dim pair per lane); vp: [16][D] uint32 (a
// dim's key pair per lane).
inline void pack_block(const uint16_t* keys, const uint16_t* values, int64_t ks0, int64_t vs0,
                       int64_t L, int64_t D, int64_t b, uint32_t* kp, uint16_t* vp) {
  const int64_t k0 = b * KEY_BLOCK;
  const int64_t count = std::min<int64_t>(KEY_BLOCK, L - k0);
  for (int64_t key = 0; key < KEY_BLOCK; ++key) {
    if (key < count) {
      const uint16_t* row = keys + (k0 + key) * ks0;
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
      const __m512i a = ka < count ? _mm512_loadu_si512(values + (k0 + ka) * vs0 + d) : _mm512_setzero_si512();
      const __m512i c = kb < count ? _mm512_loadu_si512(values + (k0 + kb) * vs0 + d) : _mm512_setzero_si512();
      _mm512_storeu_si512(dst + 2 * d, _mm512_permutex2var_epi16(a, lo, c));
      _mm512_storeu_si512(dst + 2 * d + 32, _mm512_permutex2var_epi16(a, hi, c));
    }
  }
}

// S[r][0..31] = q_r . k for the block's 32 keys (raw scores, unscaled). qt: [TILE_ROWS][D] bf16.
template <int D>
inline void qk_block(const uint16_t* qt, const uint32_t* kp, float* S) {
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

// O[r][dims] = O[r][dims] * alpha[r] + P[r] V over the block's 16 key pairs, for PV_ROWS rows
// and the 64 dims at d0. P: [rows][16] uint32 (bf16 key pairs); vp: [16][D] uint32.
template <int D>
inline void pv_block(const uint32_t* P, const uint32_t* vp, const float* alpha, float* O, int d0) {
  __m512 acc[PV_ROWS][4];
  for (int r = 0; r < PV_ROWS; ++r) {
    const __m512 a = _mm512_set1_ps(alpha[r]);
    for (int j = 0; j < 4; ++j) acc[r][j] = _mm512_mul_ps(_mm512_load_ps(O + r * D + d0 + 16 * j), a);
  }
  for (int kp = 0; kp < KEY_BLOCK / 2; ++kp) {
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
  const uint32_t* kpack;  // [Hkv][blocks][D/2][32]
  const uint32_t* vpack;  // [Hkv][blocks][16][D]
  int64_t n, Hq, G, start, blocks;
  float scale;
};

// One work item: KV head h, rows [m0, m0 + TILE_ROWS) of its n * G stacked rows.
template <int D>
void attend_tile(const Problem& p, int64_t h, int64_t m0) {
  alignas(64) uint16_t qt[TILE_ROWS * D];
  alignas(64) float S[TILE_ROWS * KEY_BLOCK];
  alignas(64) uint32_t P[TILE_ROWS * KEY_BLOCK / 2];
  alignas(64) float O[TILE_ROWS * D];
  alignas(64) float lsum[TILE_ROWS * 16];
  alignas(64) float m_run[16], m_blk[16], alpha[16];
  __mmask16 mask0[TILE_ROWS], mask1[TILE_ROWS];
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
  std::fill(m_run, m_run + 16, -1e30f);  // finite: alpha = exp(-huge) = 0 on the first block
  std::fill(m_blk, m_blk + 16, -1e30f);
  const int64_t first_pos = pos[0], last_pos = pos[rows - 1];
  const int64_t nblocks = last_pos / KEY_BLOCK + 1;
  const __m512 vscale = _mm512_set1_ps(p.scale);
  const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
  const int64_t block_words = KEY_BLOCK / 2 * D;
  const uint32_t* kbase = p.kpack + h * p.blocks * block_words;
  const uint32_t* vbase = p.vpack + h * p.blocks * block_words;

  for (int64_t b = 0; b < nblocks; ++b) {
    const int64_t k0 = b * KEY_BLOCK;
    qk_block<D>(qt, kbase + b * block_words, S);
    const bool diagonal = k0 + KEY_BLOCK - 1 > first_pos;
    for (int r = 0; r < TILE_ROWS; ++r) {
      __m512 s0 = _mm512_load_ps(S + r * KEY_BLOCK), s1 = _mm512_load_ps(S + r * KEY_BLOCK + 16);
      if (diagonal) {
        const int64_t visible = pos[r] - k0 + 1;
        mask0[r] = first_lanes(visible);
        mask1[r] = first_lanes(visible - 16);
        s0 = _mm512_mask_mov_ps(neg_inf, mask0[r], s0);
        s1 = _mm512_mask_mov_ps(neg_inf, mask1[r], s1);
      }
      m_blk[r] = _mm512_reduce_max_ps(_mm512_max_ps(s0, s1));
    }
    // All rows at once: new running max and the rescale factor of what was accumulated so far.
    const __m512 m_old = _mm512_load_ps(m_run);
    const __m512 m_new = _mm512_max_ps(m_old, _mm512_load_ps(m_blk));
    _mm512_store_ps(alpha, exp16(_mm512_mul_ps(_mm512_sub_ps(m_old, m_new), vscale)));
    _mm512_store_ps(m_run, m_new);
    for (int r = 0; r < TILE_ROWS; ++r) {
      const __m512 mc = _mm512_set1_ps(m_run[r] * p.scale);
      __m512 p0 = exp16(_mm512_fmsub_ps(_mm512_load_ps(S + r * KEY_BLOCK), vscale, mc));
      __m512 p1 = exp16(_mm512_fmsub_ps(_mm512_load_ps(S + r * KEY_BLOCK + 16), vscale, mc));
      if (diagonal) {
        p0 = _mm512_maskz_mov_ps(mask0[r], p0);
        p1 = _mm512_maskz_mov_ps(mask1[r], p1);
      }
      const __m512 l = _mm512_fmadd_ps(_mm512_load_ps(lsum + r * 16), _mm512_set1_ps(alpha[r]),
                                       _mm512_add_ps(p0, p1));
      _mm512_store_ps(lsum + r * 16, l);
      _mm512_store_si512(P + r * (KEY_BLOCK / 2), (__m512i)_mm512_cvtne2ps_pbh(p1, p0));
    }
    const uint32_t* vp = vbase + b * block_words;
    for (int r0 = 0; r0 < TILE_ROWS; r0 += PV_ROWS)
      for (int d0 = 0; d0 < D; d0 += 64)
        pv_block<D>(P + r0 * (KEY_BLOCK / 2), vp, alpha + r0, O + r0 * D, d0);
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

at::Tensor prefill_attention(at::Tensor q, at::Tensor keys, at::Tensor values, double scale) {
  TORCH_CHECK(q.device().is_cpu() && keys.device().is_cpu() && values.device().is_cpu(),
              "prefill_attention: CPU tensors only");
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && keys.scalar_type() == at::kBFloat16 &&
                  values.scalar_type() == at::kBFloat16,
              "prefill_attention: bfloat16 q, keys and values only");
  TORCH_CHECK(q.dim() == 3 && keys.dim() == 3 && values.dim() == 3,
              "prefill_attention: q [n, Hq, D], keys and values [L, Hkv, D]");
  TORCH_CHECK(keys.sizes() == values.sizes(), "prefill_attention: keys and values differ in shape");
  const int64_t n = q.size(0), Hq = q.size(1), D = q.size(2);
  const int64_t L = keys.size(0), Hkv = keys.size(1);
  TORCH_CHECK(keys.size(2) == D, "prefill_attention: q and keys differ in head_dim");
  TORCH_CHECK(D == 64 || D == 128, "prefill_attention: head_dim 64 or 128 only, got ", D);
  TORCH_CHECK(Hkv > 0 && Hq % Hkv == 0, "prefill_attention: query heads (", Hq,
              ") not a multiple of KV heads (", Hkv, ")");
  TORCH_CHECK(L >= n, "prefill_attention: context (", L, ") shorter than the chunk (", n, ")");
#if CADENCE_HAVE_AVX512BF16
  auto out = at::empty({n, Hq, D}, q.options());
  if (n == 0 || Hq == 0) return out;
  // Any token/head strides; the head_dim must be contiguous.
  if (q.stride(2) != 1) q = q.contiguous();
  if (keys.stride(2) != 1) keys = keys.contiguous();
  if (values.stride(2) != 1) values = values.contiguous();

  const int64_t blocks = (L + KEY_BLOCK - 1) / KEY_BLOCK;
  const int64_t block_words = KEY_BLOCK / 2 * D;
  std::vector<uint32_t> kpack(static_cast<size_t>(Hkv * blocks * block_words) + 16);
  std::vector<uint32_t> vpack(static_cast<size_t>(Hkv * blocks * block_words) + 16);
  const uint16_t* kp = reinterpret_cast<const uint16_t*>(keys.data_ptr<c10::BFloat16>());
  const uint16_t* vp = reinterpret_cast<const uint16_t*>(values.data_ptr<c10::BFloat16>());
  const int64_t ks0 = keys.stride(0), ks1 = keys.stride(1), vs0 = values.stride(0), vs1 = values.stride(1);
  at::parallel_for(0, Hkv * blocks, 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t h = i / blocks, b = i % blocks;
      pack_block(kp + h * ks1, vp + h * vs1, ks0, vs0, L, D, b, kpack.data() + i * block_words,
                 reinterpret_cast<uint16_t*>(vpack.data() + i * block_words));
    }
  });

  Problem p{reinterpret_cast<const uint16_t*>(q.data_ptr<c10::BFloat16>()), q.stride(0), q.stride(1),
            reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>()), kpack.data(), vpack.data(),
            n, Hq, Hq / Hkv, L - n, blocks, static_cast<float>(scale)};
  const int64_t tiles = (n * p.G + TILE_ROWS - 1) / TILE_ROWS;
  const int64_t items = tiles * Hkv;
  // Item i: tile tiles - 1 - i / Hkv (latest rows, most keys, first), KV head i % Hkv.
  std::atomic<int64_t> next{0};
  const int64_t workers = std::min<int64_t>(at::get_num_threads(), items);
  at::parallel_for(0, workers, 1, [&](int64_t begin, int64_t end) {
    for (int64_t w = begin; w < end; ++w) {
      for (int64_t i = next.fetch_add(1); i < items; i = next.fetch_add(1)) {
        const int64_t tile = tiles - 1 - i / Hkv, h = i % Hkv;
        if (D == 64) attend_tile<64>(p, h, tile * TILE_ROWS);
        else attend_tile<128>(p, h, tile * TILE_ROWS);
      }
    }
  });
  return out;
#else
  TORCH_CHECK(false, "prefill_attention: built without AVX512-BF16");
  return q;
#endif
}

}  // namespace cadence_kernels
