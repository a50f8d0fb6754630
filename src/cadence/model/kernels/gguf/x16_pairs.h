// Two octets of repacked K-quant columns (q3k_x8.h .. q6k_x8.h) in one 512-bit register: on the
// AVX-512 tiers a tile of 16 columns runs each decode, dot product and float step once for both
// octets, half the instructions per weight of the 256-bit tiles (a prefill is bound by issuing
// them: ~3.3 instructions per cycle). Lane for lane the same operations as the 256-bit tiles (the
// integer sums exact, the float steps the same multiply, convert and fma per column), so both
// widths give the same bits: which one a column runs on never changes its result.
#pragma once

#include <immintrin.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>

namespace cadence_kernels {
namespace gguf {

// The prefetch helpers' inlining (prefetch_group says why).
#define CADENCE_PREFETCH_INLINE __attribute__((always_inline)) inline

// One software prefetch of the line at p into L1 (T0) or L2 (T1), as an asm statement the compiler
// keeps: GCC 12 takes __builtin_prefetch (_mm_prefetch) for free of side effects, and its IPA
// passes (mod-ref, pure-const, SRA) then deleted every prefetch of the shared K-quant tiles whose
// address came through a helper (the Q6_K GEMV ran at half speed).
CADENCE_PREFETCH_INLINE void prefetch_t0(const void* p) { asm volatile("prefetcht0 %0" : : "m"(*static_cast<const char*>(p))); }
CADENCE_PREFETCH_INLINE void prefetch_t1(const void* p) { asm volatile("prefetcht1 %0" : : "m"(*static_cast<const char*>(p))); }

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512DQ__)
#define CADENCE_GGUF_X16 1

// Software prefetch of the repacked K-quant tiles: this many bytes ahead of what each octet's
// stream reads now. On the AVX-512 tiers 4 KiB ahead into L2 ran ~10% faster than 2 KiB into L1
// (a 320 MB Q4_K GEMV microbenchmark, 2 threads, Zen 4); the AVX2 tier keeps 2 KiB into L1 (its
// prefill ran ~12% slower with the L2 hint in one scale_bench A/B).
constexpr int64_t PREFETCH_AHEAD = 4096;

// The lone octets' 256-bit tiles of the AVX2 tier's code (KQuantTiles::tile_avx2)
// prefetch as the 16-column tiles do on these tiers.
template <int R>
CADENCE_PREFETCH_INLINE void prefetch_tile_line(const uint8_t* p) {
  prefetch_t1(p + PREFETCH_AHEAD);
}

// 32 bytes at a (low half) and 32 at b (high half).
inline __m512i load_pair(const uint8_t* a, const uint8_t* b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a))),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)), 1);
}
inline __m512 load_pair_ps(const uint8_t* a, const uint8_t* b) {
  return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(reinterpret_cast<const float*>(a))),
                            _mm256_loadu_ps(reinterpret_cast<const float*>(b)), 1);
}
// 8 bytes at a then 8 at b, widened to 16 float lanes (unsigned or signed bytes).
inline __m512 bytes_pair_ps(const uint8_t* a, const uint8_t* b, bool is_signed) {
  const __m128i both = _mm_unpacklo_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(a)),
                                          _mm_loadl_epi64(reinterpret_cast<const __m128i*>(b)));
  return _mm512_cvtepi32_ps(is_signed ? _mm512_cvtepi8_epi32(both) : _mm512_cvtepu8_epi32(both));
}
inline __m512i broadcast4_512(const void* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return _mm512_set1_epi32(v);
}
// acc + the exact int32 sums of u * s over each 4 bytes (u <= 15 or 63: maddubs never saturates).
inline __m512i udot4_add_512(__m512i acc, __m512i u, __m512i s) {
#if defined(__AVX512VNNI__)
  return _mm512_dpbusd_epi32(acc, u, s);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1)));
#endif
}
// acc + the int16 pair dot products per int32 lane (vpdpwssd; madd + add without VNNI): exact.
inline __m512i word_dot_add_512(__m512i acc, __m512i s, __m512i w) {
#if defined(__AVX512VNNI__)
  return _mm512_dpwssd_epi32(acc, s, w);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(s, w));
#endif
}
// udot4_add_512(acc, u, the 4 bytes at x in every lane), the bytes read by the instruction's own
// {1to16} broadcast on the VNNI tier (GCC keeps a separate vpbroadcastd otherwise).
inline __m512i udot4_add_512_at(__m512i acc, __m512i u, const int8_t* x) {
#if defined(__AVX512VNNI__)
  asm("vpdpbusd %[x]%{1to16%}, %[u], %[acc]"
      : [acc] "+v"(acc)
      : [u] "v"(u), [x] "m"(*reinterpret_cast<const int32_t*>(x)));
  return acc;
#else
  return udot4_add_512(acc, u, broadcast4_512(x));
#endif
}
inline void store_pair(float* out, __m512 v) {
  _mm256_storeu_ps(out, _mm512_castps512_ps256(v));
  _mm256_storeu_ps(out + 8, _mm512_extractf32x8_ps(v, 1));
}

// Rows per 16-column prefill tile: each decoded weight register serves 8 rows, whose block and
// nibble sums (24 registers) fit beside it with the float accumulators in memory.
constexpr int X16_ROWS = 8;

#else
constexpr int64_t PREFETCH_AHEAD = 2048;  // see above (into L1)

// The AVX2 tiles' prefetch of the line at p, `R` rows per tile: a prefill or batch tile (R > 1)
// 2 KiB ahead into L1 as above; a decode GEMV (R = 1) 4 KiB ahead into L2, as the AVX-512 tiers:
// the 1B shape's decode GEMVs (767 MB of Q4_K / Q6_K octets, 2 threads, Zen 4) streamed 26.9 ->
// 32.4 GB/s with it (Q6_K 21.7 -> 32.6), while 4 KiB into L1 gained ~3%.
template <int R>
CADENCE_PREFETCH_INLINE void prefetch_tile_line(const uint8_t* p) {
  if constexpr (R == 1) prefetch_t1(p + 4096);
  else prefetch_t0(p + PREFETCH_AHEAD);
}

#endif

// Rows per prefill tile of the 256-bit tiles (tile_avx2: the AVX2 tier's octets, and a lone octet
// on every tier): each decoded weight register serves this many rows.
// 4: 4 rows' int16 and int32 sums fit the 16 registers beside the decoded weights (5 and 6 ran
// within 3%, and 32-row decode batches split into whole tiles of 4).
constexpr int AVX2_ROWS = 4;

// Where a decode GEMV's tile (R = 1: tile_avx2<1, O> on the AVX2 tier, gemv_x16<P> on the AVX-512
// ones) prefetches into L2. A thread's octets are contiguous and its tiles read O of them side by side, so
// the line a tile reads now lies `next_tile` bytes (O octets) before the same line of its next tile:
// prefetching that line covers the next tile whole, its headers included, a tile ahead. Prefetched
// 4 KiB ahead in each octet's own stream (in_stream, every tile before), the first 4 KiB of every
// octet went unprefetched: 42% of a K = 2048 octet (9.7 KB), so the q/k/v/o, gate/up and head GEMVs
// streamed slower than the K = 8192 down projection. The first tile of a thread's run (the next
// tile has no predecessor to prefetch it) and the last (nothing after it) keep in_stream.
struct GemvPrefetch {
  int64_t next_tile = 0;   // bytes to the same line of the next tile; 0: none
  bool in_stream = true;   // also 4 KiB ahead in the tile's own streams (prefetch_tile_line<1>)
};
CADENCE_PREFETCH_INLINE void prefetch_l2(const uint8_t* p) { prefetch_t1(p); }
// The largest tile (O octets' bytes) that prefetches its successor: a third of this core's L2, so
// the tile ahead and the one being read fit with room to spare (Zen 4's 1 MiB: 341 KiB, the 1B
// shape's largest tile, Q4_K at K = 8192, is 311 KB; Zen 3's 512 KiB: 170 KiB). A larger tile (an
// 8B shape's down projection at K = 14336: 545 KB of Q4_K) would evict what it prefetched before
// reading it, and keeps the in-stream prefetch alone (there the first 4 KiB is ~6% of an octet).
inline int64_t gemv_prefetch_span() {
  static const int64_t span = [] {
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return static_cast<int64_t>(l2 > 0 ? l2 : 512 << 10) / 3;
  }();
  return span;
}
// A one-row run of tiles of `tile_bytes` each over octets [o_begin, o_end): how the tile at octet o
// prefetches (GemvPrefetch).
inline GemvPrefetch gemv_prefetch(int64_t o, int64_t o_begin, int64_t o_end, int64_t octets_per_tile,
                                  int64_t tile_bytes) {
  const bool next = o + 2 * octets_per_tile <= o_end && tile_bytes <= gemv_prefetch_span();
  return GemvPrefetch{next ? tile_bytes : 0, o == o_begin || !next};
}

// The cache lines of a repacked K-quant block's header (d and the scales: 128 or 160 bytes).
constexpr int KQUANT_HEADER_LINES = 3;

// A tile's prefetches for group j of the 256-block at `block`, the tile reading R rows: the lines
// the format's policy U names (U::LINES of them, U::line(j, l): line l's offset in the block) and,
// at j < KQUANT_HEADER_LINES, line j of the block's header: 4 KiB ahead in the octet's own stream
// (prefetch_tile_line), and in a decode GEMV the same lines of the thread's next tile
// (GemvPrefetch). Every tile of every K-quant prefetches through this (prefetch_t0 / t1 say why
// an asm statement).
template <class U, int R>
CADENCE_PREFETCH_INLINE void prefetch_group(const uint8_t* block, int j, GemvPrefetch pf) {
  if (R > 1 || pf.in_stream) {
    for (int l = 0; l < U::LINES; ++l) prefetch_tile_line<R>(block + U::line(j, l));
    if (j < KQUANT_HEADER_LINES) prefetch_tile_line<R>(block + 64 * j);
  }
  if (R == 1 && pf.next_tile) {
    for (int l = 0; l < U::LINES; ++l) prefetch_l2(block + pf.next_tile + U::line(j, l));
    if (j < KQUANT_HEADER_LINES) prefetch_l2(block + pf.next_tile + 64 * j);
  }
}

}  // namespace gguf
}  // namespace cadence_kernels
