// gguf_linear: y = x @ W^T (+ bias) for a GGUF weight in its own block format (blocks.h),
// computed on the blocks as stored: the activations are quantized once per call (the quantized
// types) or rounded to bf16 (BF16 weights on the avx512bf16 tier), then the threads split the
// output columns (at::parallel_for, so torch.set_num_threads applies) and each runs its
// family's GEMM (gemm.h) over its columns for every row.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../ops.h"
#include "blocks.h"
#include "gemm.h"

namespace cadence_kernels {

#if CADENCE_HAVE_AVX2
namespace {

// The K-quants' activations as llama.cpp quantizes them (its q8_K): one scale per 256 k, the
// largest |x| of the 256 over 127, shared by the 8 groups of 32 the kernels read. The other
// types take a scale per 32 (q8_0's), quantize_row_q8. Multiplying what llama.cpp multiplies
// keeps a file's numbers its numbers (Gemma 3 270M Q4_K_M: perplexity next to llama.cpp's).
constexpr int64_t KQUANT_SPAN = 256;

bool shares_scale_per_256(int type) { return type == gguf::Q4_K || type == gguf::Q5_K || type == gguf::Q6_K; }

void quantize_row_q8_per_256(const float* x, int64_t K, int8_t* q, uint8_t* mag, float* scale, float* sum) {
  constexpr int64_t G = avx2::Q8_GROUP;
  for (int64_t s = 0; s < K / KQUANT_SPAN; ++s) {
    const float* xs = x + s * KQUANT_SPAN;
    float m = 0.0f;
    for (int64_t i = 0; i < KQUANT_SPAN; ++i) m = std::max(m, std::fabs(xs[i]));
    const float inv = m > 0.0f ? 127.0f / m : 0.0f;
    for (int64_t g = 0; g < KQUANT_SPAN / G; ++g) {
      const int64_t at = s * KQUANT_SPAN + g * G, group = at / G;
      int32_t total = 0;
      for (int64_t i = 0; i < G; ++i) {
        // Round half to even, as _mm256_cvtps_epi32 in quantize_row_q8 (|v| <= 127).
        const int32_t v = static_cast<int32_t>(std::nearbyint(x[at + i] * inv));
        q[at + i] = static_cast<int8_t>(v);
        mag[at + i] = static_cast<uint8_t>(v < 0 ? -v : v);
        total += v;
      }
      scale[group] = m / 127.0f;
      sum[group] = scale[group] * static_cast<float>(total);
    }
  }
}

}  // namespace
#endif

at::Tensor gguf_repack(at::Tensor blocks, int64_t type, int64_t N, int64_t K) {
  const int64_t octet_block = gguf::x8_block_bytes(static_cast<int>(type));
  TORCH_CHECK(octet_block > 0, "gguf_repack: only Q4_K and Q6_K have a repacked layout, got ggml type ", type);
  TORCH_CHECK(K % 256 == 0 && N >= 8, "gguf_repack: [N >= 8, K a multiple of 256]");
  TORCH_CHECK(blocks.device().is_cpu() && blocks.is_contiguous() && blocks.scalar_type() == at::kByte &&
                  blocks.numel() == N * (K / 256 * gguf::block_size(static_cast<int>(type)).bytes),
              "gguf_repack: blocks must be contiguous uint8 of the [N, K] weight");
  auto out = at::empty({N / 8, K / 256 * octet_block}, blocks.options());
#if CADENCE_HAVE_AVX2
  gguf::x8_repack(static_cast<int>(type), blocks.data_ptr<uint8_t>(), N, K, out.data_ptr<uint8_t>());
#else
  TORCH_CHECK(false, "gguf_repack: built without AVX2/FMA");
#endif
  return out;
}

at::Tensor gguf_linear(at::Tensor x, at::Tensor blocks, int64_t type, int64_t N, int64_t K,
                       c10::optional<at::Tensor> bias, c10::optional<at::Tensor> packed) {
  const gguf::BlockSize size = gguf::block_size(static_cast<int>(type));
  TORCH_CHECK(size.elements > 0, "gguf_linear: unsupported ggml type ", type);
  TORCH_CHECK(K > 0 && N > 0 && K % size.elements == 0, "gguf_linear: K = ", K, " is not a multiple of the type's ",
              size.elements, "-weight blocks");
  const int64_t row_bytes = K / size.elements * size.bytes;
  TORCH_CHECK(blocks.device().is_cpu() && blocks.is_contiguous() && blocks.scalar_type() == at::kByte &&
                  blocks.numel() == N * row_bytes,
              "gguf_linear: blocks must be contiguous uint8 of N * ", row_bytes, " bytes");
  TORCH_CHECK(x.device().is_cpu() && x.is_contiguous() && x.scalar_type() == at::kFloat && x.dim() == 2 &&
                  x.size(1) == K,
              "gguf_linear: x [M, ", K, "] float32 contiguous");
  const uint8_t* packed_x8 = nullptr;  // whole octets of columns, interleaved (gemm_x8.cpp)
  if (packed.has_value() && packed->defined()) {
    const int64_t octet_block = gguf::x8_block_bytes(static_cast<int>(type));
    TORCH_CHECK(octet_block > 0 && packed->is_contiguous() && packed->scalar_type() == at::kByte &&
                    packed->numel() == N / 8 * (K / 256 * octet_block),
                "gguf_linear: packed must be gguf_repack's output for this weight");
    packed_x8 = packed->data_ptr<uint8_t>();
  }
  const float* bp = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->is_contiguous() && bias->scalar_type() == at::kFloat && bias->numel() == N,
                "gguf_linear: bias [N] float32");
    bp = bias->data_ptr<float>();
  }
#if CADENCE_HAVE_AVX2
  const int64_t M = x.size(0);
  auto out = at::empty({M, N}, x.options());
  if (M == 0) return out;
  const bool is_float = type == gguf::F32 || type == gguf::F16 || type == gguf::BF16;
  gguf::GemmArgs g{static_cast<int>(type), blocks.data_ptr<uint8_t>(), row_bytes, N, K, M,
                   x.data_ptr<float>(), nullptr, nullptr, out.data_ptr<float>()};
  // Prepared once per call, read by every thread.
  avx2::QuantizedRows xq;
  std::vector<uint16_t> x_bf16;
  if (!is_float) {
    const int64_t groups = K / avx2::Q8_GROUP;
    xq.K = K;
    xq.q.resize(static_cast<size_t>(M * K));
    xq.mag.resize(static_cast<size_t>(M * K));
    xq.scale.resize(static_cast<size_t>(M * groups));
    xq.sum.resize(static_cast<size_t>(M * groups));
    const bool per_256 = shares_scale_per_256(static_cast<int>(type)) && K % KQUANT_SPAN == 0;
    at::parallel_for(0, M, M * K >= (1 << 16) ? 16 : M, [&](int64_t begin, int64_t end) {
      for (int64_t m = begin; m < end; ++m) {
        if (per_256)
          quantize_row_q8_per_256(g.x + m * K, K, xq.q.data() + m * K, xq.mag.data() + m * K,
                                  xq.scale.data() + m * groups, xq.sum.data() + m * groups);
        else
          avx2::quantize_row_q8(g.x + m * K, K, xq.q.data() + m * K, xq.mag.data() + m * K,
                                xq.scale.data() + m * groups, xq.sum.data() + m * groups);
      }
    });
    g.xq = &xq;
  }
  // Repacked Q6_K subtracts 32 * (sum of a row's bytes) per 16 k: once per row here, not per octet.
  std::vector<int32_t> half_sums;
  if (packed_x8 != nullptr && type == gguf::Q6_K) {
    half_sums.resize(static_cast<size_t>(M * (K / 16)));
    for (int64_t i = 0; i < M * (K / 16); ++i) {
      int32_t s = 0;
      for (int t = 0; t < 16; ++t) s += xq.q[i * 16 + t];
      half_sums[i] = s;
    }
    g.half_sums = half_sums.data();
  }
#if defined(__AVX512BF16__) && defined(__AVX512F__)
  if (type == gguf::BF16) {
    x_bf16.resize(static_cast<size_t>(M * K));
    for (int64_t i = 0; i < M * K; ++i) x_bf16[i] = c10::BFloat16(g.x[i]).x;  // round to nearest even
    g.x_bf16 = x_bf16.data();
  }
#endif
  // Threads take ranges of 8-column groups. One thread streams a small weight whole: a second
  // adds less than waking it costs.
  constexpr int64_t COLS = 8;
  const int64_t groups = (N + COLS - 1) / COLS;
  const bool parallel = N * row_bytes >= (2 << 20) || M * N * K >= (1 << 22);
  at::parallel_for(0, groups, parallel ? 1 : groups, [&](int64_t begin, int64_t end) {
    const avx2::FlushDenormals ftz;
    const int64_t n0 = begin * COLS, n1 = std::min(N, end * COLS);
    int64_t rowwise = n0;  // columns from here on run on the row-wise blocks
    if (packed_x8 != nullptr) {
      const int64_t octets_end = std::min(end, N / 8);
      if (octets_end > begin) gguf::x8_gemm_columns(g, packed_x8, begin, octets_end);
      rowwise = std::max(n0, octets_end * 8);
    }
    if (rowwise < n1) {
      const bool done = gguf::gemm_blocks32_columns(g, rowwise, n1) || gguf::gemm_kquant_columns(g, rowwise, n1) ||
                        gguf::gemm_float_columns(g, rowwise, n1);
      TORCH_CHECK(done, "gguf_linear: no kernel for ggml type ", type);
    }
    if (bp != nullptr)
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = n0; n < n1; ++n) g.out[m * N + n] += bp[n];
  });
  return out;
#else
  TORCH_CHECK(false, "gguf_linear: built without AVX2/FMA");
  return x;
#endif
}

}  // namespace cadence_kernels
