// float32-compute GEMM on compressed packed weights (the AVX2 tier; also used by the AVX-512
// tier without BF16): y[M, N] = x[M, K] @ w[N, K]^T with x and y float32.
//
// Weights are stored in one of four formats, so a decode step streams 0.625 (int4), 1.125 (int8)
// or 2 (bf16) bytes per weight instead of 4:
//   F32   [blocks][K][16] float32
//   BF16  [blocks][K][16] bf16 bits (widened to float32 in registers by a shift)
//   INT8  [blocks][K/4][16][4] int8 with a float32 scale per 16 columns and 32 k: scales
//         [blocks][K/32][16]; w = q * scale (symmetric, per group of 32 along K like GGUF's
//         Q8_0), multiplied with integer dot products by activations quantized the same way
//         (q8_gemm.h), not widened.
//   INT4  [blocks][K/8][16][4] bytes of two 4-bit q each, float16 (d, m) per 16 columns and 32 k
//         (q4_gemm.h): w = d * q + m, multiplied by the int8-quantized activations.
// A block holds 16 output columns, its k-rows contiguous, so one block streams front to back
// and each k-step feeds two 8-lane FMAs per activation row. The last block is zero-padded.
//
// Register tiles are MR rows x NB blocks (2 * MR * NB accumulators of 16). Small M takes wide
// tiles (NB = 4 at M = 1: 8 independent FMA chains hide the FMA latency), large M tall ones
// (MR = 6, NB = 1: 12 accumulators, 2 weight vectors and a broadcast fill the 16 registers). Every row sums over k in the same order whatever the tile, the batch or the
// thread split: results do not change with the batch (greedy decoding is batch-invariant).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "q4_gemm.h"
#include "q8_gemm.h"
#include "vec8.h"

namespace cadence_kernels {
namespace avx2 {

enum class WeightFormat : int { F32 = 0, BF16 = 1, INT8 = 2, INT4 = 3 };

constexpr int64_t PACK_COLS = 16;
constexpr int64_t INT8_GROUP = 32;  // k per int8 scale

inline int64_t packed_blocks(int64_t N) { return (N + PACK_COLS - 1) / PACK_COLS; }
inline int64_t format_bytes(WeightFormat f) { return f == WeightFormat::F32 ? 4 : f == WeightFormat::BF16 ? 2 : 1; }

// A packed weight: data of packed_blocks(N) blocks of K * 16 elements (K * 8 bytes for INT4),
// scales for INT8 and INT4.
struct PackedWeight {
  WeightFormat format;
  const void* data;
  const float* scales;  // INT8 only: [blocks][K / 32][16]
  int64_t K, N;
  const uint16_t* half_scales = nullptr;  // INT4 only: [blocks][K / 32][2][16] float16 (d, m)
};

#if CADENCE_HAVE_AVX2

// The 16 weights of block-row k as two float32 vectors (the widened formats, F32 and BF16).
template <WeightFormat F>
inline void load_wrow(const void* block, int64_t k, __m256& w0, __m256& w1) {
  static_assert(F == WeightFormat::F32 || F == WeightFormat::BF16,
                "int8 and int4 weights take the integer paths (q8_gemm.h, q4_gemm.h)");
  if constexpr (F == WeightFormat::F32) {
    const float* p = static_cast<const float*>(block) + k * PACK_COLS;
    w0 = _mm256_loadu_ps(p);
    w1 = _mm256_loadu_ps(p + 8);
  } else {
    const uint16_t* p = static_cast<const uint16_t*>(block) + k * PACK_COLS;
    w0 = load_bf16(p);
    w1 = load_bf16(p + 8);
  }
}

template <WeightFormat F>
inline const void* block_ptr(const PackedWeight& w, int64_t b) {
  return static_cast<const char*>(w.data) + b * w.K * PACK_COLS * format_bytes(F);
}
inline const float* block_scales(const PackedWeight& w, int64_t b) {
  return w.scales == nullptr ? nullptr : w.scales + b * (w.K / INT8_GROUP) * PACK_COLS;
}

constexpr int MAX_MR = 6;
constexpr int MAX_NB = 4;

// acc[r][2 * b + h]: row r, columns (block b) * 16 + h * 8 + [0, 8).
template <WeightFormat F, int MR, int NB>
inline void gemm_tile(const float* x, int64_t ldx, const PackedWeight& w, int64_t b0,
                      __m256 acc[MAX_MR][2 * MAX_NB]) {
  const void* blocks[NB];
  for (int b = 0; b < NB; ++b) blocks[b] = block_ptr<F>(w, b0 + b);
  // Local sums (not acc itself): __m256 may alias any float, so sums kept behind the acc pointer
  // would be stored and reloaded around every load of x (the tile ran at 40% of the FMA rate).
  __m256 sums[MR][2 * NB];
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < 2 * NB; ++c) sums[r][c] = _mm256_setzero_ps();
  for (int64_t k = 0; k < w.K; ++k) {
    __m256 wv[2 * NB];
    for (int b = 0; b < NB; ++b) load_wrow<F>(blocks[b], k, wv[2 * b], wv[2 * b + 1]);
    for (int r = 0; r < MR; ++r) {
      const __m256 xv = _mm256_broadcast_ss(x + r * ldx + k);
      for (int c = 0; c < 2 * NB; ++c) sums[r][c] = _mm256_fmadd_ps(xv, wv[c], sums[r][c]);
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < 2 * NB; ++c) acc[r][c] = sums[r][c];
}

// Tile shape for a GEMM with M rows: (rows per tile, blocks per tile).
inline std::pair<int, int> tile_shape(int64_t M) {
  if (M == 1) return {1, 4};
  if (M < 6) return {2, 2};
  return {6, 1};
}

// One register tile of mr rows x nb blocks at row m0 and block b0 (the shapes tile_shape gives, and
// their remainders at the edges).
template <WeightFormat F>
inline void run_tile(const float* xm, int64_t ldx, const PackedWeight& w, int64_t b0, int mr, int nb,
                     __m256 acc[MAX_MR][2 * MAX_NB]) {
#define CADENCE_T(MR_, NB_) gemm_tile<F, MR_, NB_>(xm, ldx, w, b0, acc)
  if (nb == 4) CADENCE_T(1, 4);  // M = 1 only
  else if (nb == 3) CADENCE_T(1, 3);
  else if (nb == 2) {
    if (mr == 1) CADENCE_T(1, 2); else CADENCE_T(2, 2);
  } else {
    switch (mr) {
      case 1: CADENCE_T(1, 1); break; case 2: CADENCE_T(2, 1); break; case 3: CADENCE_T(3, 1); break;
      case 4: CADENCE_T(4, 1); break; case 5: CADENCE_T(5, 1); break; default: CADENCE_T(6, 1);
    }
  }
#undef CADENCE_T
}

// Block b of a compressed weight widened to float32 ([K][16], the F32 block layout), with the
// very values load_wrow gives (so a tile over it sums the same numbers in the same order).
template <WeightFormat F>
inline void widen_block(const PackedWeight& w, int64_t b, float* out) {
  const void* block = block_ptr<F>(w, b);
  for (int64_t k = 0; k < w.K; ++k) {
    __m256 w0, w1;
    load_wrow<F>(block, k, w0, w1);
    _mm256_storeu_ps(out + k * PACK_COLS, w0);
    _mm256_storeu_ps(out + k * PACK_COLS + 8, w1);
  }
}

// Calls epilogue(row0, mr, block0, nb, acc) for every tile over rows [0, M) and blocks
// [block_begin, block_end) (acc as gemm_tile's). Blocks outer, rows inner: a panel of blocks
// stays in L1/L2 while the row tiles walk over it, so weights come from memory once per call.
// With several row tiles (M > 6), a bf16 block is widened to float32 once into a scratch block
// that every row tile reads (widening per tile cost ~25% of the GEMM rate at M = 32).
template <WeightFormat F, typename Epilogue>
void gemm_blocks_t(const float* x, int64_t ldx, int64_t M, const PackedWeight& w, int64_t block_begin,
                   int64_t block_end, Epilogue&& epilogue) {
  __m256 acc[MAX_MR][2 * MAX_NB];
  const auto [MR, NB] = tile_shape(M);
  if constexpr (F != WeightFormat::F32) {
    if (M > MAX_MR) {
      thread_local std::vector<float> scratch;
      scratch.resize(static_cast<size_t>(w.K * PACK_COLS));
      const PackedWeight wide{WeightFormat::F32, scratch.data(), nullptr, w.K, PACK_COLS};
      for (int64_t b0 = block_begin; b0 < block_end; ++b0) {
        widen_block<F>(w, b0, scratch.data());
        for (int64_t m0 = 0; m0 < M; m0 += MR) {
          const int mr = static_cast<int>(std::min<int64_t>(MR, M - m0));
          run_tile<WeightFormat::F32>(x + m0 * ldx, ldx, wide, 0, mr, 1, acc);
          epilogue(m0, mr, b0, 1, acc);
        }
      }
      return;
    }
  }
  for (int64_t b0 = block_begin; b0 < block_end; b0 += NB) {
    const int nb = static_cast<int>(std::min<int64_t>(NB, block_end - b0));
    for (int64_t m0 = 0; m0 < M; m0 += MR) {
      const int mr = static_cast<int>(std::min<int64_t>(MR, M - m0));
      run_tile<F>(x + m0 * ldx, ldx, w, b0, mr, nb, acc);
      epilogue(m0, mr, b0, nb, acc);
    }
  }
}

// One register tile of an integer format (int8: q8_gemm.h, int4: q4_gemm.h).
template <WeightFormat F, int MR, int NB>
inline void integer_tile(const QuantizedRows& xq, int64_t m0, const PackedWeight& w, int64_t b0,
                         __m256 acc[MAX_MR][2 * MAX_NB]) {
  if constexpr (F == WeightFormat::INT4)
    gemm_tile_q4<MR, NB, 2 * MAX_NB>(xq, m0, static_cast<const uint8_t*>(w.data), w.half_scales, w.K, b0, acc);
  else
    gemm_tile_q8<MR, NB, 2 * MAX_NB>(xq, m0, static_cast<const int8_t*>(w.data), w.scales, w.K, b0, acc);
}

// The integer formats (int8, int4): the rows are quantized once per call (each thread of a team
// quantizes them itself: M x K is small beside the weights it streams), then tiles of integer
// dot products; at M = 1 four blocks at a time (independent sums), else 4 rows x 1 block.
template <WeightFormat F, typename Epilogue>
void gemm_blocks_integer(const float* x, int64_t ldx, int64_t M, const PackedWeight& w, int64_t block_begin,
                         int64_t block_end, Epilogue&& epilogue) {
  thread_local QuantizedRows xq;
  quantize_rows_q8(x, ldx, M, w.K, xq);
  __m256 acc[MAX_MR][2 * MAX_NB];
#define CADENCE_INT(MR_, NB_) integer_tile<F, MR_, NB_>(xq, m0, w, b0, acc)
  if (M == 1) {
    for (int64_t b0 = block_begin; b0 < block_end; b0 += 4) {
      const int nb = static_cast<int>(std::min<int64_t>(4, block_end - b0));
      const int64_t m0 = 0;
      switch (nb) {
        case 4: CADENCE_INT(1, 4); break; case 3: CADENCE_INT(1, 3); break;
        case 2: CADENCE_INT(1, 2); break; default: CADENCE_INT(1, 1);
      }
      epilogue(0, 1, b0, nb, acc);
    }
    return;
  }
  for (int64_t b0 = block_begin; b0 < block_end; ++b0) {
    for (int64_t m0 = 0; m0 < M; m0 += 4) {
      const int mr = static_cast<int>(std::min<int64_t>(4, M - m0));
      switch (mr) {
        case 4: CADENCE_INT(4, 1); break; case 3: CADENCE_INT(3, 1); break;
        case 2: CADENCE_INT(2, 1); break; default: CADENCE_INT(1, 1);
      }
      epilogue(m0, mr, b0, 1, acc);
    }
  }
#undef CADENCE_INT
}

template <typename Epilogue>
void gemm_blocks(const float* x, int64_t ldx, int64_t M, const PackedWeight& w, int64_t block_begin,
                 int64_t block_end, Epilogue&& epilogue) {
  switch (w.format) {
    case WeightFormat::F32: gemm_blocks_t<WeightFormat::F32>(x, ldx, M, w, block_begin, block_end, epilogue); break;
    case WeightFormat::BF16: gemm_blocks_t<WeightFormat::BF16>(x, ldx, M, w, block_begin, block_end, epilogue); break;
    case WeightFormat::INT4: gemm_blocks_integer<WeightFormat::INT4>(x, ldx, M, w, block_begin, block_end, epilogue); break;
    default: gemm_blocks_integer<WeightFormat::INT8>(x, ldx, M, w, block_begin, block_end, epilogue);
  }
}

// Calls store(row, col, n, v) for every 8-column piece of a tile: v = acc + bias[col..] (bias may
// be null), n = the columns < N in it (1..8).
template <typename Store>
inline void for_tile_pieces(__m256 acc[MAX_MR][2 * MAX_NB], int64_t m0, int mr, int64_t b0, int nb,
                            int64_t N, const float* bias, Store&& store) {
  for (int c = 0; c < 2 * nb; ++c) {
    const int64_t col = b0 * PACK_COLS + c * 8;
    const int64_t n = std::min<int64_t>(8, N - col);
    if (n <= 0) break;
    const __m256 bv = bias == nullptr ? _mm256_setzero_ps() : load_n(bias + col, n);
    for (int r = 0; r < mr; ++r) store(m0 + r, col, n, _mm256_add_ps(acc[r][c], bv));
  }
}

inline void store_tile(__m256 acc[MAX_MR][2 * MAX_NB], int64_t m0, int mr, int64_t b0, int nb, int64_t N,
                       const float* bias, float* out, int64_t ldo) {
  for_tile_pieces(acc, m0, mr, b0, nb, N, bias, [&](int64_t row, int64_t col, int64_t n, __m256 v) {
    store_n(out + row * ldo + col, v, n);
  });
}

// A row's running argmax over the pieces one thread stores (8 lanes kept apart; a thread stores a
// row's pieces in ascending column order, so a strict > keeps each lane's first maximum; the
// merge takes the lowest column among lanes holding the maximum: torch.argmax's first index).
// A NaN is only flagged: the caller recomputes that row from the stored logits.
struct LaneArgmax8 {
  __m256 val = _mm256_set1_ps(-INFINITY);
  __m256i idx = _mm256_set1_epi32(INT32_MAX);
  bool nan = false;

  void update(__m256 v, int64_t col, int64_t n) {
    __m256 valid = _mm256_castsi256_ps(first_lanes(n));
    const __m256 unordered = _mm256_and_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q), valid);
    nan |= _mm256_movemask_ps(unordered) != 0;
    const __m256 greater = _mm256_and_ps(_mm256_cmp_ps(v, val, _CMP_GT_OQ), valid);
    val = _mm256_blendv_ps(val, v, greater);
    const __m256i cols = _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(col)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    idx = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(idx), _mm256_castsi256_ps(cols), greater));
  }
};

// Row argmax from its trackers (parts[0], parts[stride], ...), or -1 when a NaN was seen.
inline int64_t lane_argmax_merge(const LaneArgmax8* parts, int64_t count, int64_t stride) {
  int64_t best = INT32_MAX;
  float best_val = -INFINITY;
  for (int64_t p = 0; p < count; ++p) {
    const LaneArgmax8& part = parts[p * stride];
    if (part.nan) return -1;
    alignas(32) float vals[8];
    alignas(32) int32_t ids[8];
    _mm256_store_ps(vals, part.val);
    _mm256_store_si256(reinterpret_cast<__m256i*>(ids), part.idx);
    for (int lane = 0; lane < 8; ++lane)
      if (ids[lane] != INT32_MAX && (vals[lane] > best_val || (vals[lane] == best_val && ids[lane] < best)))
        best_val = vals[lane], best = ids[lane];
  }
  return best == INT32_MAX ? 0 : best;
}

#endif  // CADENCE_HAVE_AVX2

}  // namespace avx2
}  // namespace cadence_kernels
