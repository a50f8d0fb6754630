// pack_weight_f32 / linear_packed_f32: a float32-compute linear layer on weights packed once in
// a compressed format (avx2/packed_gemm_f32.h): the AVX2 tier's LM head and, inside
// DecodeStackF32, every projection.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/zeros.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <c10/util/Exception.h>

#include <tuple>
#include <vector>

#include "../huge_pages.h"
#include "../ops.h"
#include "packed_gemm_f32.h"

namespace cadence_kernels {

using avx2::INT8_GROUP;
using avx2::PACK_COLS;
using avx2::WeightFormat;

namespace {

float weight_at(const at::Tensor& w, int64_t n, int64_t k) {
  const int64_t K = w.size(1);
  if (w.scalar_type() == at::kFloat) return w.data_ptr<float>()[n * K + k];
  return static_cast<float>(w.data_ptr<c10::BFloat16>()[n * K + k]);
}

// The weight column in lane 0 of packed block b. interleave_halves (a fused gate/up weight
// [2I, K]): packed block 2j holds gate columns [16j, 16j + 16) and block 2j + 1 the matching up
// columns, so a thread's range of block pairs holds whole (gate, up) pairs.
int64_t first_packed_column(int64_t b, int64_t N, bool interleave_halves) {
  return interleave_halves ? (b % 2) * (N / 2) + (b / 2) * PACK_COLS : b * PACK_COLS;
}

// The int4 format (avx2/q4_gemm.h): per column and group of 32 k, d = (max - min) / 15 and
// m = min, both rounded to float16, then q = round((w - m) / d) clamped to [0, 15]
// (fused_decode.stored_values computes the same values in torch).
std::tuple<at::Tensor, at::Tensor> pack_weight_int4(const at::Tensor& w, bool interleave_halves) {
  const int64_t N = w.size(0), K = w.size(1), groups = K / INT8_GROUP;
  const int64_t blocks = avx2::packed_blocks(N);
  // Streamed whole by every decode step: on huge pages (huge_pages.h).
  auto data = huge_page_zeros({blocks, K / 2, PACK_COLS}, at::kByte);
  auto scales = huge_page_zeros({blocks, groups, 2, PACK_COLS}, at::kHalf);
  uint8_t* dp = data.data_ptr<uint8_t>();
  c10::Half* sp = scales.data_ptr<c10::Half>();
  at::parallel_for(0, blocks, 4, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t first_col = first_packed_column(b, N, interleave_halves);
      for (int64_t i = 0; i < PACK_COLS; ++i) {
        const int64_t n = first_col + i;
        if (n >= N) continue;
        for (int64_t g = 0; g < groups; ++g) {
          float lo = INFINITY, hi = -INFINITY;
          for (int64_t k = g * INT8_GROUP; k < (g + 1) * INT8_GROUP; ++k) {
            lo = std::min(lo, weight_at(w, n, k));
            hi = std::max(hi, weight_at(w, n, k));
          }
          const c10::Half d_h((hi - lo) / 15.f), m_h(lo);
          const float d = static_cast<float>(d_h), m = static_cast<float>(m_h);
          sp[((b * groups + g) * 2) * PACK_COLS + i] = d_h;
          sp[((b * groups + g) * 2 + 1) * PACK_COLS + i] = m_h;
          for (int64_t k = g * INT8_GROUP; k < (g + 1) * INT8_GROUP; ++k) {
            const float q = d == 0.f ? 0.f : std::nearbyint((weight_at(w, n, k) - m) / d);
            const auto v = static_cast<uint8_t>(std::max(0.f, std::min(15.f, q)));
            // [K/8][16][4] bytes: k-octet o, column i, byte j = k % 4; low nibble k % 8 < 4.
            uint8_t& byte = dp[b * K * 8 + (k / 8) * 64 + i * 4 + (k % 4)];
            byte = static_cast<uint8_t>(k % 8 < 4 ? (byte & 0xF0) | v : (byte & 0x0F) | (v << 4));
          }
        }
      }
    }
  });
  return {data, scales};
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> pack_weight_f32(at::Tensor w, int64_t format, bool interleave_halves) {
  TORCH_CHECK(w.device().is_cpu() && w.dim() == 2 &&
                  (w.scalar_type() == at::kFloat || w.scalar_type() == at::kBFloat16),
              "pack_weight_f32: w [N, K] float32 or bfloat16 on CPU");
  TORCH_CHECK(format >= 0 && format <= 3, "pack_weight_f32: format 0 (f32), 1 (bf16), 2 (int8) or 3 (int4)");
  w = w.contiguous();
  const auto fmt = static_cast<WeightFormat>(format);
  const int64_t N = w.size(0), K = w.size(1);
  TORCH_CHECK((fmt != WeightFormat::INT8 && fmt != WeightFormat::INT4) || K % INT8_GROUP == 0,
              "pack_weight_f32: int8 and int4 need K a multiple of ", INT8_GROUP, ", got ", K);
  if (fmt == WeightFormat::INT4) return pack_weight_int4(w, interleave_halves);
  TORCH_CHECK(!interleave_halves || N % (2 * PACK_COLS) == 0,
              "pack_weight_f32: interleaving halves needs N a multiple of 32, got ", N);
  const int64_t blocks = avx2::packed_blocks(N);
  const int64_t bytes = avx2::format_bytes(fmt);
  auto data = huge_page_zeros({blocks, K, PACK_COLS * bytes}, at::kByte);  // as pack_weight_int4's
  auto scales = fmt == WeightFormat::INT8 ? huge_page_zeros({blocks, K / INT8_GROUP, PACK_COLS}, at::kFloat)
                                          : at::empty({0}, w.options().dtype(at::kFloat));
  uint8_t* dp = data.data_ptr<uint8_t>();
  float* sp = scales.data_ptr<float>();
  at::parallel_for(0, blocks, 4, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t first_col = first_packed_column(b, N, interleave_halves);
      for (int64_t i = 0; i < PACK_COLS; ++i) {
        const int64_t n = first_col + i;
        if (n >= N) continue;
        for (int64_t g = 0; g < (fmt == WeightFormat::INT8 ? K / INT8_GROUP : 0); ++g) {
          float amax = 0.f;
          for (int64_t k = g * INT8_GROUP; k < (g + 1) * INT8_GROUP; ++k) amax = std::max(amax, std::abs(weight_at(w, n, k)));
          const float scale = amax / 127.f;
          sp[(b * (K / INT8_GROUP) + g) * PACK_COLS + i] = scale;
          for (int64_t k = g * INT8_GROUP; k < (g + 1) * INT8_GROUP; ++k) {
            const float q = scale == 0.f ? 0.f : std::nearbyint(weight_at(w, n, k) / scale);
            // [K/4][16][4] within the block (q8_gemm.h): column i's 4 consecutive k side by side.
            reinterpret_cast<int8_t*>(dp)[b * K * PACK_COLS + (k / 4) * 4 * PACK_COLS + i * 4 + k % 4] =
                static_cast<int8_t>(std::max(-127.f, std::min(127.f, q)));
          }
        }
        for (int64_t k = 0; k < (fmt == WeightFormat::INT8 ? 0 : K); ++k) {
          const float v = weight_at(w, n, k);
          if (fmt == WeightFormat::F32) reinterpret_cast<float*>(dp)[(b * K + k) * PACK_COLS + i] = v;
          else reinterpret_cast<uint16_t*>(dp)[(b * K + k) * PACK_COLS + i] = c10::BFloat16(v).x;
        }
      }
    }
  });
  return {data, scales};
}

at::Tensor quantize_activations_q8(at::Tensor x) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat && x.dim() == 2 && x.size(1) % INT8_GROUP == 0,
              "quantize_activations_q8: x [M, K] float32 with K a multiple of ", INT8_GROUP);
#if CADENCE_HAVE_AVX2
  x = x.contiguous();
  const int64_t M = x.size(0), K = x.size(1);
  auto out = at::empty({M, K}, x.options());
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  at::parallel_for(0, M, 16, [&](int64_t begin, int64_t end) {
    std::vector<int8_t> q(K);
    std::vector<uint8_t> mag(K);
    std::vector<float> scale(K / INT8_GROUP);
    for (int64_t m = begin; m < end; ++m) {
      avx2::quantize_row_q8(xp + m * K, K, q.data(), mag.data(), scale.data());
      for (int64_t k = 0; k < K; ++k) op[m * K + k] = static_cast<float>(q[k]) * scale[k / INT8_GROUP];
    }
  });
  return out;
#else
  TORCH_CHECK(false, "quantize_activations_q8: built without AVX2/FMA");
  return x;
#endif
}

avx2::PackedWeight packed_view(const at::Tensor& data, const at::Tensor& scales, int64_t format, int64_t N) {
  TORCH_CHECK(data.device().is_cpu() && data.is_contiguous() && data.scalar_type() == at::kByte && data.dim() == 3,
              "packed weight: a uint8 [blocks, K, 16 * bytes] tensor from pack_weight_f32");
  const auto fmt = static_cast<WeightFormat>(format);
  if (fmt == WeightFormat::INT4) {
    const int64_t K = data.size(1) * 2;
    TORCH_CHECK(data.size(2) == PACK_COLS && data.size(0) == avx2::packed_blocks(N),
                "packed weight: int4 data [blocks, K/2, 16] does not match N");
    TORCH_CHECK(scales.is_contiguous() && scales.scalar_type() == at::kHalf &&
                    scales.numel() == data.size(0) * (K / INT8_GROUP) * 2 * PACK_COLS,
                "packed weight: int4 scales [blocks, K/32, 2, 16] float16");
    return {fmt, data.data_ptr(), nullptr, K, N, reinterpret_cast<const uint16_t*>(scales.data_ptr<c10::Half>())};
  }
  TORCH_CHECK(format >= 0 && format <= 2 && data.size(2) == PACK_COLS * avx2::format_bytes(fmt) &&
                  data.size(0) == avx2::packed_blocks(N),
              "packed weight: format / N do not match the packed data");
  const int64_t K = data.size(1);
  if (fmt == WeightFormat::INT8)
    TORCH_CHECK(scales.is_contiguous() && scales.scalar_type() == at::kFloat &&
                    scales.numel() == data.size(0) * (K / INT8_GROUP) * PACK_COLS,
                "packed weight: int8 scales [blocks, K/32, 16] float32");
  return {fmt, data.data_ptr(), fmt == WeightFormat::INT8 ? scales.data_ptr<float>() : nullptr, K, N};
}

at::Tensor linear_packed_f32(at::Tensor x, at::Tensor data, at::Tensor scales, int64_t format, int64_t N,
                             c10::optional<at::Tensor> bias, c10::optional<at::Tensor> argmax_out) {
  TORCH_CHECK(x.device().is_cpu() && x.is_contiguous() && x.scalar_type() == at::kFloat && x.dim() == 2,
              "linear_packed_f32: x [M, K] float32 contiguous");
  const avx2::PackedWeight w = packed_view(data, scales, format, N);
  TORCH_CHECK(x.size(1) == w.K, "linear_packed_f32: x has K = ", x.size(1), ", the weight ", w.K);
  const float* bp = nullptr;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->is_contiguous() && bias->scalar_type() == at::kFloat && bias->numel() == N,
                "linear_packed_f32: bias [N] float32");
    bp = bias->data_ptr<float>();
  }
#if CADENCE_HAVE_AVX2
  const int64_t M = x.size(0), blocks = data.size(0);
  int64_t* argmax_ids = nullptr;
  if (argmax_out.has_value() && argmax_out->defined()) {
    TORCH_CHECK(argmax_out->is_contiguous() && argmax_out->scalar_type() == at::kLong && argmax_out->numel() == M,
                "linear_packed_f32: argmax_out [M] int64");
    argmax_ids = argmax_out->data_ptr<int64_t>();
  }
  const int64_t team = at::get_num_threads();
  std::vector<avx2::LaneArgmax8> trackers(argmax_ids != nullptr ? team * M : 0);
  auto out = at::empty({M, N}, x.options());
  float* op = out.data_ptr<float>();
  const float* xp = x.data_ptr<float>();
  // One thread streams small weights whole: a second adds less than waking it costs.
  const bool parallel = data.numel() >= (2 << 20) || M * N * w.K >= (1 << 22);
  at::parallel_for(0, blocks, parallel ? 4 : blocks + 1, [&](int64_t begin, int64_t end) {
    const avx2::FlushDenormals ftz;
    avx2::LaneArgmax8* mine = argmax_ids != nullptr ? trackers.data() + at::get_thread_num() * M : nullptr;
    avx2::gemm_blocks(xp, w.K, M, w, begin, end,
                      [&](int64_t m0, int mr, int64_t b0, int nb, __m256 acc[avx2::MAX_MR][2 * avx2::MAX_NB]) {
                        avx2::for_tile_pieces(acc, m0, mr, b0, nb, N, bp, [&](int64_t row, int64_t col, int64_t n, __m256 v) {
                          avx2::store_n(op + row * N + col, v, n);
                          if (mine != nullptr) mine[row].update(v, col, n);
                        });
                      });
  });
  for (int64_t r = 0; r < M && argmax_ids != nullptr; ++r) {
    argmax_ids[r] = avx2::lane_argmax_merge(trackers.data() + r, team, M);
    if (argmax_ids[r] < 0) argmax_ids[r] = argmax_row(op + r * N, N);  // saw a NaN
  }
  return out;
#else
  TORCH_CHECK(false, "linear_packed_f32: built without AVX2/FMA");
  return x;
#endif
}

}  // namespace cadence_kernels
