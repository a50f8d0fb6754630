// bf16 GEMM on weights pre-packed for AVX512-BF16 dot products: y[M, N] = x[M, K] @ w[N, K]^T.
//
// Packed layout (pack_weight_bf16): the N output columns are cut into blocks of 16; block b holds
// its 16 columns' weights k-pair by k-pair, [K/2][16][2] bf16, so one 64-byte load feeds one
// _mm512_dpbf16_ps for 16 outputs and a block streams front to back (18 KB for K = 576). The last
// block is zero-padded. Rows of x are broadcast a k-pair at a time.
//
// A call computes a range of blocks for all M rows: 4 blocks (64 columns) at a time, 6 rows at a
// time (24 accumulators + 4 weight registers), the 4-block weight panel staying in L2 while the
// row tiles walk over it. One pass reads each weight once from memory, whatever M is: the same
// kernel is bandwidth-bound at M = 1 and compute-bound at M = 32..64, where torch's bf16 GEMM
// runs at half the machine's rate. The summation order of a row never depends on M or on the
// thread split, so results do not change with the batch.
#pragma once

#include "common.h"

namespace cadence_kernels {

#if CADENCE_HAVE_AVX512BF16

constexpr int64_t PACK_COLS = 16;  // output columns per packed block
constexpr int GEMM_MR = 6;         // rows per register tile
constexpr int GEMM_NB = 4;         // blocks per register tile

inline int64_t packed_blocks(int64_t N) { return (N + PACK_COLS - 1) / PACK_COLS; }

// Register tile: rows [0, MR) of x (row stride ldx, bf16 bits) times NB packed blocks starting at
// wb (each K/2 * 32 bf16 apart) -> acc[MR][NB] float32 sums over all K (K even).
// Each k-step also prefetches one line of [pf, pf_end) into L2 (the next panel, see
// packed_gemm_blocks).
template <int MR, int NB>
inline void gemm_tile(const uint16_t* x, int64_t ldx, const uint16_t* wb, int64_t K,
                      __m512 acc[GEMM_MR][GEMM_NB], const char* pf, const char* pf_end) {
  const int64_t block_stride = K * PACK_COLS;  // bf16 elements per packed block
  for (int m = 0; m < MR; ++m)
    for (int b = 0; b < NB; ++b) acc[m][b] = _mm512_setzero_ps();
  const int64_t pairs = K / 2;
  for (int64_t kp = 0; kp < pairs; ++kp) {
    if (pf < pf_end) {
      _mm_prefetch(pf, _MM_HINT_T1);
      pf += 64;
    }
    __m512bh w[NB];
    for (int b = 0; b < NB; ++b)
      w[b] = (__m512bh)_mm512_loadu_si512(wb + b * block_stride + kp * 2 * PACK_COLS);
    for (int m = 0; m < MR; ++m) {
      int32_t pair;
      std::memcpy(&pair, x + m * ldx + 2 * kp, sizeof(pair));
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
      for (int b = 0; b < NB; ++b) acc[m][b] = _mm512_dpbf16_ps(acc[m][b], xv, w[b]);
    }
  }
}

// Calls epilogue(row, first_block, nb, acc) for every register tile covering rows [0, M) and
// blocks [block_begin, block_end): acc[r][b] holds the float32 sums of row `row + r`, columns
// (first_block + b) * 16 + [0, 16).
template <typename Epilogue>
void packed_gemm_blocks(const uint16_t* x, int64_t ldx, int64_t M, const uint16_t* packed,
                        int64_t K, int64_t block_begin, int64_t block_end, Epilogue&& epilogue) {
  __m512 acc[GEMM_MR][GEMM_NB];
  const int64_t block_stride = K * PACK_COLS;
  for (int64_t b0 = block_begin; b0 < block_end; b0 += GEMM_NB) {
    const int nb = static_cast<int>(std::min<int64_t>(GEMM_NB, block_end - b0));
    const uint16_t* wb = packed + b0 * block_stride;
    // The first row tile of a panel waits on memory for its weights; the later ones read them
    // from L2. Spread over this panel's k-steps, fetch the next panel (contiguous: blocks are
    // stored in order) into L2, so that its first tile finds it there too.
    const int64_t next_blocks = std::min<int64_t>(GEMM_NB, block_end - b0 - nb);
    const char* pf = reinterpret_cast<const char*>(wb + nb * block_stride);
    const char* pf_end = pf + (next_blocks > 0 ? next_blocks * block_stride * 2 : 0);
    for (int64_t m0 = 0; m0 < M; m0 += GEMM_MR) {
      const int mr = static_cast<int>(std::min<int64_t>(GEMM_MR, M - m0));
      const uint16_t* xm = x + m0 * ldx;
      // This tile's share of the next panel's lines (one per k-step).
      const char* tile_pf = std::min(pf_end, pf + (m0 / GEMM_MR) * (K / 2) * 64);
      const char* tile_pf_end = M > GEMM_MR ? pf_end : tile_pf;  // one row tile: memory-bound
#define CADENCE_TILE(MR_, NB_) gemm_tile<MR_, NB_>(xm, ldx, wb, K, acc, tile_pf, tile_pf_end)
#define CADENCE_TILE_ROWS(NB_)                  \
  switch (mr) {                                 \
    case 1: CADENCE_TILE(1, NB_); break;        \
    case 2: CADENCE_TILE(2, NB_); break;        \
    case 3: CADENCE_TILE(3, NB_); break;        \
    case 4: CADENCE_TILE(4, NB_); break;        \
    case 5: CADENCE_TILE(5, NB_); break;        \
    default: CADENCE_TILE(6, NB_); break;       \
  }
      switch (nb) {
        case 1: CADENCE_TILE_ROWS(1); break;
        case 2: CADENCE_TILE_ROWS(2); break;
        case 3: CADENCE_TILE_ROWS(3); break;
        default: CADENCE_TILE_ROWS(4); break;
      }
#undef CADENCE_TILE_ROWS
#undef CADENCE_TILE
      epilogue(m0, mr, b0, nb, acc);
    }
  }
}

// Calls store(row, col, mask, v) for every 16-column piece of a tile: v = acc + bias[col] (bias
// may be null), mask the columns < N. Both epilogues below round and store through it.
template <typename Store>
inline void for_tile_columns(__m512 acc[GEMM_MR][GEMM_NB], int64_t m0, int mr, int64_t b0, int nb,
                             int64_t N, const uint16_t* bias, Store&& store) {
  for (int b = 0; b < nb; ++b) {
    const int64_t col = (b0 + b) * PACK_COLS;
    const int64_t left = N - col;
    const __mmask16 mask = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
    const __m512 bv = bias == nullptr
        ? _mm512_setzero_ps()
        : load16_masked(reinterpret_cast<const c10::BFloat16*>(bias + col), mask);
    for (int r = 0; r < mr; ++r) store(m0 + r, col, mask, _mm512_add_ps(acc[r][b], bv));
  }
}

// The usual epilogue: out[row, col] = bf16(acc + bias[col]) for the columns < N.
inline void store_tile_bf16(__m512 acc[GEMM_MR][GEMM_NB], int64_t m0, int mr, int64_t b0, int nb,
                            int64_t N, const uint16_t* bias, uint16_t* out, int64_t ldo) {
  for_tile_columns(acc, m0, mr, b0, nb, N, bias, [&](int64_t row, int64_t col, __mmask16 mask, __m512 v) {
    _mm256_mask_storeu_epi16(out + row * ldo + col, mask, (__m256i)_mm512_cvtneps_pbh(v));
  });
}

// A row's running argmax over the pieces one thread stores, 16 lanes (column % 16) kept apart.
// A thread stores a row's pieces in ascending column order (packed_gemm_blocks walks its block
// range front to back), so a strict > keeps each lane's first maximum, and the merge
// (lane_argmax_merge) takes the lowest column among the lanes that hold the maximum:
// torch.argmax's first index. A NaN (torch counts it as the maximum) is only flagged; the caller
// then recomputes that row from the stored logits.
struct LaneArgmax {
  __m512 val = _mm512_set1_ps(-INFINITY);
  __m512i idx = _mm512_set1_epi32(INT32_MAX);  // INT32_MAX: no value above -inf in this lane
  __mmask16 nan = 0;

  void update(__m512 v, int64_t col, __mmask16 mask) {
    const __mmask16 greater = _mm512_mask_cmp_ps_mask(mask, v, val, _CMP_GT_OQ);
    nan |= _mm512_mask_cmp_ps_mask(mask, v, v, _CMP_UNORD_Q);
    val = _mm512_mask_mov_ps(val, greater, v);
    idx = _mm512_mask_mov_epi32(idx, greater, _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(col)),
                                                               _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)));
  }
};

// A row's argmax from its trackers (parts[0], parts[stride], ...: one per thread), or -1 when a
// NaN was seen. A row of only -inf gives 0, as torch.argmax does.
inline int64_t lane_argmax_merge(const LaneArgmax* parts, int64_t count, int64_t stride) {
  int64_t best = INT32_MAX;
  float best_val = -INFINITY;
  for (int64_t p = 0; p < count; ++p) {
    const LaneArgmax& part = parts[p * stride];
    if (part.nan) return -1;
    alignas(64) float vals[16];
    alignas(64) int32_t ids[16];
    _mm512_store_ps(vals, part.val);
    _mm512_store_si512(reinterpret_cast<__m512i*>(ids), part.idx);
    for (int lane = 0; lane < 16; ++lane)
      if (ids[lane] != INT32_MAX && (vals[lane] > best_val || (vals[lane] == best_val && ids[lane] < best)))
        best_val = vals[lane], best = ids[lane];
  }
  return best == INT32_MAX ? 0 : best;
}

// The same sums rounded to bf16 (as store_tile_bf16) but stored widened to float32: the LM
// head's logits, which sampling reads as float32, without a bf16 tensor and a second pass.
// Full aligned pieces go out as streaming stores: [S, V] logits (12 MB at 64 rows) would
// otherwise evict the weight panels from cache and pay a read for ownership per line (LM head
// at 32 rows: 5.6 -> 4.7 ms). The caller fences (_mm_sfence) before other threads read `out`.
// With `argmax` (this thread's tracker per row), greedy sampling's argmax comes from the
// registers: no second pass reading the logits back from memory.
inline void store_tile_bf16_as_float(__m512 acc[GEMM_MR][GEMM_NB], int64_t m0, int mr, int64_t b0, int nb,
                                     int64_t N, const uint16_t* bias, float* out, int64_t ldo,
                                     LaneArgmax* argmax) {
  for_tile_columns(acc, m0, mr, b0, nb, N, bias, [&](int64_t row, int64_t col, __mmask16 mask, __m512 v) {
    const __m256i bits = (__m256i)_mm512_cvtneps_pbh(v);
    const __m512 widened = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
    float* dst = out + row * ldo + col;
    if (mask == (__mmask16)0xffff && (reinterpret_cast<uintptr_t>(dst) & 63) == 0) _mm512_stream_ps(dst, widened);
    else _mm512_mask_storeu_ps(dst, mask, widened);
    if (argmax != nullptr) argmax[row].update(widened, col, mask);
  });
}

// [first, last) of `total` items for thread `tid` of `team`, in contiguous, near-equal shares.
inline std::pair<int64_t, int64_t> thread_share(int64_t total, int tid, int team) {
  return {total * tid / team, total * (tid + 1) / team};
}

#endif  // CADENCE_HAVE_AVX512BF16

}  // namespace cadence_kernels
