// gguf_linear / gguf_linear_many: y = x @ W^T (+ bias) for GGUF weights in their own block
// formats (blocks.h), computed on the blocks as stored. One call may carry several weights of
// the same input (a layer's q, k and v; its gate and up), each in its own type: their outputs
// sit side by side in one [M, sum N] result. The activations are quantized once per call and
// kind (per 256 k for the K-quants, per 32 for the other quantized types; rounded to bf16 for
// BF16 weights on the avx512bf16 tier), then one parallel region splits every weight's 8-column
// groups over the threads by the bytes they read, and each thread runs each family's GEMM
// (gemm.h) over its columns for every row. One call in place of three (or two) saves the
// repeated quantization, the threads' wake-ups and the concatenation: a 1B model's decode step
// is ~100 such calls, each a few hundred microseconds.
//
// A column's result never depends on the thread split, the other weights of the call or the
// rows beside it (the column kernels' order over K is fixed): batch-invariant, bit for bit.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "../huge_pages.h"
#include "../ops.h"
#include "blocks.h"
#include "gemm.h"
#include "quantize.h"

namespace cadence_kernels {

#if CADENCE_HAVE_AVX2
namespace {

bool is_float_type(int type) { return type == gguf::F32 || type == gguf::F16 || type == gguf::BF16; }

// Rows [M, K] of x quantized into `out` (per 256 k, or per 32), many rows split over the threads.
void quantize_rows(const float* x, int64_t M, int64_t K, bool per_256, avx2::QuantizedRows& out) {
  const int64_t groups = K / avx2::Q8_GROUP;
  out.K = K;
  out.q.resize(static_cast<size_t>(M * K));
  out.mag.resize(static_cast<size_t>(M * K));
  out.scale.resize(static_cast<size_t>(M * groups));
  out.sum.resize(static_cast<size_t>(M * groups));
  if (per_256) out.group_sum.resize(static_cast<size_t>(M * groups));
  at::parallel_for(0, M, M * K >= (1 << 16) ? 16 : M, [&](int64_t begin, int64_t end) {
    for (int64_t m = begin; m < end; ++m) {
      int8_t* q = out.q.data() + m * K;
      uint8_t* mag = out.mag.data() + m * K;
      float* scale = out.scale.data() + m * groups;
      float* sum = out.sum.data() + m * groups;
      if (per_256) gguf::quantize_row_q8_per_256(x + m * K, K, q, mag, scale, sum, out.group_sum.data() + m * groups);
      else avx2::quantize_row_q8(x + m * K, K, q, mag, scale, sum);
    }
  });
}

// One weight of a call: its GEMM arguments (out pointing at its first column), its repacked
// octets (or null), its bias (or null), and the bytes one 8-column group of it reads.
struct Part {
  gguf::GemmArgs g;
  const uint8_t* packed_x8;
  const float* bias;
  int64_t groups;
  double group_bytes;
};

constexpr int64_t COLS = 8;  // columns per unit of the thread split (an octet of the repacked types)

// Columns of groups [begin, end) of one weight, every row.
void run_groups(const Part& p, int64_t begin, int64_t end) {
  const gguf::GemmArgs& g = p.g;
  const int64_t n0 = begin * COLS, n1 = std::min(g.N, end * COLS);
  int64_t rowwise = n0;  // columns from here on run on the row-wise blocks
  if (p.packed_x8 != nullptr) {
    const int64_t octets_end = std::min(end, g.N / 8);
    if (octets_end > begin) gguf::x8_gemm_columns(g, p.packed_x8, begin, octets_end);
    rowwise = std::max(n0, octets_end * 8);
  }
  if (rowwise < n1) {
    const bool done = gguf::gemm_blocks32_columns(g, rowwise, n1) || gguf::gemm_kquant_columns(g, rowwise, n1) ||
                      gguf::gemm_float_columns(g, rowwise, n1);
    TORCH_CHECK(done, "gguf_linear: no kernel for ggml type ", g.type);
  }
  if (p.bias != nullptr)
    for (int64_t m = 0; m < g.M; ++m)
      for (int64_t n = n0; n < n1; ++n) g.out[m * g.ldo + n] += p.bias[n];
}

}  // namespace
#endif

at::Tensor gguf_repack(at::Tensor blocks, int64_t type, int64_t N, int64_t K) {
  const int64_t octet_block = gguf::x8_block_bytes(static_cast<int>(type));
  TORCH_CHECK(octet_block > 0, "gguf_repack: only Q3_K, Q4_K, Q5_K and Q6_K have a repacked layout, got ggml type ", type);
  TORCH_CHECK(K % 256 == 0 && N >= 8, "gguf_repack: [N >= 8, K a multiple of 256]");
  TORCH_CHECK(blocks.device().is_cpu() && blocks.is_contiguous() && blocks.scalar_type() == at::kByte &&
                  blocks.numel() == N * (K / 256 * gguf::block_size(static_cast<int>(type)).bytes),
              "gguf_repack: blocks must be contiguous uint8 of the [N, K] weight");
  // Streamed whole by every decode step: on huge pages (huge_pages.h).
  auto out = huge_page_bytes(N / 8, K / 256 * octet_block);
#if CADENCE_HAVE_AVX2
  gguf::x8_repack(static_cast<int>(type), blocks.data_ptr<uint8_t>(), N, K, out.data_ptr<uint8_t>());
#else
  TORCH_CHECK(false, "gguf_repack: built without AVX2/FMA");
#endif
  return out;
}

at::Tensor gguf_linear_many(at::Tensor x, const std::vector<at::Tensor>& blocks, const std::vector<int64_t>& types,
                            const std::vector<int64_t>& Ns, int64_t K,
                            const std::vector<c10::optional<at::Tensor>>& biases,
                            const std::vector<c10::optional<at::Tensor>>& packed) {
  const size_t P = blocks.size();
  TORCH_CHECK(P > 0 && types.size() == P && Ns.size() == P && biases.size() == P && packed.size() == P,
              "gguf_linear_many: one type, N, bias and packed per weight");
  TORCH_CHECK(x.device().is_cpu() && x.is_contiguous() && x.scalar_type() == at::kFloat && x.dim() == 2 &&
                  x.size(1) == K,
              "gguf_linear: x [M, ", K, "] float32 contiguous");
  int64_t total_N = 0;
  for (size_t i = 0; i < P; ++i) {
    const int type = static_cast<int>(types[i]);
    const gguf::BlockSize size = gguf::block_size(type);
    const int64_t N = Ns[i];
    TORCH_CHECK(size.elements > 0, "gguf_linear: unsupported ggml type ", type);
    TORCH_CHECK(K > 0 && N > 0 && K % size.elements == 0, "gguf_linear: K = ", K, " is not a multiple of the type's ",
                size.elements, "-weight blocks");
    const at::Tensor& b = blocks[i];
    const bool has_packed = packed[i].has_value() && packed[i]->defined();
    // No row-wise blocks are needed (an empty tensor will do) when the packed octets hold every column.
    TORCH_CHECK(b.device().is_cpu() && b.is_contiguous() && b.scalar_type() == at::kByte &&
                    (b.numel() == N * (K / size.elements * size.bytes) || (b.numel() == 0 && has_packed && N % 8 == 0)),
                "gguf_linear: blocks must be contiguous uint8 of N * ", K / size.elements * size.bytes, " bytes");
    if (has_packed) {
      const int64_t octet_block = gguf::x8_block_bytes(type);
      TORCH_CHECK(octet_block > 0 && packed[i]->is_contiguous() && packed[i]->scalar_type() == at::kByte &&
                      packed[i]->numel() == N / 8 * (K / 256 * octet_block),
                  "gguf_linear: packed must be gguf_repack's output for this weight");
    }
    if (biases[i].has_value() && biases[i]->defined())
      TORCH_CHECK(biases[i]->is_contiguous() && biases[i]->scalar_type() == at::kFloat && biases[i]->numel() == N,
                  "gguf_linear: bias [N] float32");
    total_N += N;
  }
#if CADENCE_HAVE_AVX2
  const int64_t M = x.size(0);
  auto out = at::empty({M, total_N}, x.options());
  if (M == 0) return out;
  const float* xp = x.data_ptr<float>();
  // Prepared once per call, read by every thread: each kind of activations a weight needs.
  bool need_32 = false, need_256 = false, need_half_sums = false, need_bf16 = false;
  for (size_t i = 0; i < P; ++i) {
    const int type = static_cast<int>(types[i]);
    if (is_float_type(type)) {
      need_bf16 |= type == gguf::BF16;
    } else if (gguf::shares_scale_per_256(type)) {
      need_256 = true;
      need_half_sums |= gguf::reads_half_sums(type, packed[i].has_value() && packed[i]->defined());
    } else {
      need_32 = true;
    }
  }
  avx2::QuantizedRows xq32, xq256;
  if (need_32) quantize_rows(xp, M, K, false, xq32);
  if (need_256) quantize_rows(xp, M, K, true, xq256);
  // Repacked Q6_K (Q3_K) subtracts 32 (4) * (sum of a row's bytes) per 16 k, Q2_K its minimums times them:
  // once per row here, not per column.
  std::vector<int32_t> half_sums;
  if (need_half_sums) {
    half_sums.resize(static_cast<size_t>(M * (K / 16)));
    at::parallel_for(0, M, M * K >= (1 << 16) ? 16 : M, [&](int64_t begin, int64_t end) {
      gguf::byte_sums_per_16(xq256, begin * (K / 16), end * (K / 16), half_sums.data());
    });
  }
  std::vector<uint16_t> x_bf16;
#if defined(__AVX512BF16__) && defined(__AVX512F__)
  if (need_bf16) {
    x_bf16.resize(static_cast<size_t>(M * K));
    for (int64_t i = 0; i < M * K; ++i) x_bf16[i] = c10::BFloat16(xp[i]).x;  // round to nearest even
  }
#endif
  std::vector<Part> parts(P);
  double total_bytes = 0.0;
  int64_t col = 0;
  for (size_t i = 0; i < P; ++i) {
    const int type = static_cast<int>(types[i]);
    const int64_t N = Ns[i], row_bytes = K / gguf::block_size(type).elements * gguf::block_size(type).bytes;
    Part& p = parts[i];
    p.g = gguf::GemmArgs{type, blocks[i].data_ptr<uint8_t>(), row_bytes, N, K, M, total_N, xp,
                         x_bf16.empty() ? nullptr : x_bf16.data(),
                         is_float_type(type) ? nullptr : (gguf::shares_scale_per_256(type) ? &xq256 : &xq32),
                         out.data_ptr<float>() + col};
    p.g.half_sums = half_sums.empty() ? nullptr : half_sums.data();
    p.packed_x8 = packed[i].has_value() && packed[i]->defined() ? packed[i]->data_ptr<uint8_t>() : nullptr;
    p.bias = biases[i].has_value() && biases[i]->defined() ? biases[i]->data_ptr<float>() : nullptr;
    p.groups = (N + COLS - 1) / COLS;
    p.group_bytes = static_cast<double>(COLS * row_bytes);
    total_bytes += p.group_bytes * p.groups;
    col += N;
  }
  // One thread streams small weights whole: a second adds less than waking it costs.
  const double work = static_cast<double>(M) * static_cast<double>(total_N) * static_cast<double>(K);
  const int64_t threads = (total_bytes >= (2 << 20) || work >= (1 << 22)) ? at::get_num_threads() : 1;
  // Thread t takes the groups whose first byte (counting every weight's groups in order) falls in
  // [t, t + 1) * total_bytes / threads: equal bytes per thread, each weight's columns contiguous.
  at::parallel_for(0, threads, 1, [&](int64_t t_begin, int64_t t_end) {
    const avx2::FlushDenormals ftz;
    const double lo = total_bytes * static_cast<double>(t_begin) / static_cast<double>(threads);
    const double hi = total_bytes * static_cast<double>(t_end) / static_cast<double>(threads);
    double start = 0.0;
    for (const Part& p : parts) {
      const auto first_at_or_after = [&](double bound) {
        const double g = std::ceil((bound - start) / p.group_bytes);
        return std::clamp<int64_t>(static_cast<int64_t>(g), 0, p.groups);
      };
      const int64_t begin = first_at_or_after(lo), end = t_end == threads ? p.groups : first_at_or_after(hi);
      if (end > begin) run_groups(p, begin, end);
      start += p.group_bytes * p.groups;
    }
  });
  return out;
#else
  TORCH_CHECK(false, "gguf_linear: built without AVX2/FMA");
  return x;
#endif
}

at::Tensor gguf_linear(at::Tensor x, at::Tensor blocks, int64_t type, int64_t N, int64_t K,
                       c10::optional<at::Tensor> bias, c10::optional<at::Tensor> packed) {
  return gguf_linear_many(x, {blocks}, {type}, {N}, K, {bias}, {packed});
}

}  // namespace cadence_kernels
