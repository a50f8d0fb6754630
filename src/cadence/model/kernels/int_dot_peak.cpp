// int8_dot_peak: the rate of the integer dot-product arithmetic the quantized GEMMs run on this
// tier, from a tight in-register micro kernel (no loads, no decode, no float step): what bounds
// a compute-bound quantized GEMM, as a float32 GEMM's rate bounds a float one. Benchmarks use it
// for the FLOP floor of a step (benchmarks/scale_bench.py); a float32 GEMM's rate is not that
// bound (a step's int8 arithmetic ran faster than it).
//
// The operation is the inner step of the tier's K-quant tiles (gguf/q4k_x8.h, q6k_x8.h):
//   AVX-512 with VNNI  vpdpbusd on 512-bit registers (64 byte products per instruction);
//   AVX-512 without    vpmaddubsw + vpaddw on 512-bit registers;
//   AVX2               vpmaddubsw + vpaddw on 256-bit registers (32 byte products: the pair sums
//                      add up in int16, as the AVX2 tiles do).
// One byte product counts 2 FLOPs (a multiply and an add), as a float GEMM's FMA does. Many
// independent accumulators hide the instructions' latency; every thread of the team runs it.
#include <ATen/Parallel.h>

#include <chrono>
#include <cstdint>
#include <vector>

#include "avx2/vec8.h"
#include "ops.h"

namespace cadence_kernels {

#if CADENCE_HAVE_AVX2
namespace {

constexpr int CHAINS = 12;

// One round: each of 12 accumulators takes one dot step, written in assembly so that the
// compiler can neither spill the accumulators (GCC kept half of them on the stack) nor share a
// product between chains. The maddubs forms multiply each chain's own sums (its bytes reread
// as unsigned: the values do not matter to the timing) and add them in int16; vpdpbusd
// accumulates in its own operand.
#define CADENCE_CHAINS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#define CADENCE_OPERAND(i) [a##i] "+v"(a##i),

#if defined(__AVX512F__) && defined(__AVX512BW__)
using Vec = __m512i;
#if defined(__AVX512VNNI__)
#define CADENCE_STEP(i) "vpdpbusd %[s], %[u], %[a" #i "]\n\t"
#else
#define CADENCE_STEP(i) "vpmaddubsw %[s], %[a" #i "], %%zmm31\n\tvpaddw %%zmm31, %[a" #i "], %[a" #i "]\n\t"
#endif
#define CADENCE_TEMP "xmm31"
inline Vec splat(int v) { return _mm512_set1_epi8(static_cast<char>(v)); }
inline int64_t first_lane(Vec v) { return _mm_cvtsi128_si32(_mm512_castsi512_si128(v)); }
#else
using Vec = __m256i;
#define CADENCE_STEP(i) "vpmaddubsw %[s], %[a" #i "], %%ymm15\n\tvpaddw %%ymm15, %[a" #i "], %[a" #i "]\n\t"
#define CADENCE_TEMP "xmm15"
inline Vec splat(int v) { return _mm256_set1_epi8(static_cast<char>(v)); }
inline int64_t first_lane(Vec v) { return _mm_cvtsi128_si32(_mm256_castsi256_si128(v)); }
#endif

// `iterations` rounds on one thread; returns a value the caller keeps (so the work stays).
int64_t run_chains(int64_t iterations) {
#define CADENCE_DECLARE(i) Vec a##i = splat(i);
  CADENCE_CHAINS(CADENCE_DECLARE)
  Vec u = splat(3), s = splat(5);
  for (int64_t it = 0; it < iterations; ++it)
    asm volatile(CADENCE_CHAINS(CADENCE_STEP) : CADENCE_CHAINS(CADENCE_OPERAND)[u] "+v"(u), [s] "+v"(s) : : CADENCE_TEMP);
  int64_t total = 0;
#define CADENCE_FOLD(i) total += first_lane(a##i);
  CADENCE_CHAINS(CADENCE_FOLD)
  return total;
}

}  // namespace
#endif

double int8_dot_peak(int64_t iterations) {
#if CADENCE_HAVE_AVX2
  const int64_t threads = at::get_num_threads();
  std::vector<int64_t> sink(static_cast<size_t>(threads));
  run_chains(iterations / 16);  // warm up the units (and the clocks)
  const auto start = std::chrono::steady_clock::now();
  at::parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) sink[static_cast<size_t>(t)] = run_chains(iterations);
  });
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  volatile int64_t keep = 0;
  for (int64_t v : sink) keep = keep + v;
  (void)keep;
  const double products = static_cast<double>(threads) * static_cast<double>(iterations) * CHAINS * sizeof(Vec);
  return 2.0 * products / seconds;
#else
  (void)iterations;
  return 0.0;
#endif
}

}  // namespace cadence_kernels
