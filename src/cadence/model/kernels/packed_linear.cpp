// pack_linear_bf16 / linear_packed_bf16: a bf16 linear layer on weights packed once at load time
// for the AVX512-BF16 GEMM in packed_gemm.h (decode batches and the LM head).
#include "common.h"
#include "ops.h"
#include "packed_gemm.h"

namespace cadence_kernels {

#if CADENCE_HAVE_AVX512BF16
// Weight bytes below which one thread streams a whole GEMM: a second thread adds less than its
// wake-up costs.
constexpr int64_t PACKED_PARALLEL_MIN_BYTES = 2 << 20;
#endif

at::Tensor pack_linear_bf16(at::Tensor w, bool interleave_halves) {
  check_cpu_contiguous(w, "w");
  TORCH_CHECK(w.scalar_type() == at::kBFloat16 && w.dim() == 2, "pack_linear_bf16: w [N, K] bfloat16");
  const int64_t N = w.size(0), K = w.size(1);
  TORCH_CHECK(K % 2 == 0, "pack_linear_bf16: K must be even, got ", K);
  TORCH_CHECK(!interleave_halves || N % (2 * 16) == 0,
              "pack_linear_bf16: interleaving halves needs N a multiple of 32, got ", N);
  const int64_t blocks = (N + 15) / 16;
  auto packed = at::zeros({blocks, K / 2, 16, 2}, w.options());
  const uint16_t* src = reinterpret_cast<const uint16_t*>(w.data_ptr<c10::BFloat16>());
  uint16_t* dst = reinterpret_cast<uint16_t*>(packed.data_ptr<c10::BFloat16>());
  // interleave_halves (a fused gate/up weight [2I, K]): packed block 2j holds gate columns
  // [16j, 16j + 16) and block 2j + 1 the matching up columns, so one register tile sees both.
  at::parallel_for(0, blocks, 16, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const int64_t first_col = interleave_halves ? (b % 2) * (N / 2) + (b / 2) * 16 : b * 16;
      for (int64_t i = 0; i < 16; ++i) {
        const int64_t n = first_col + i;
        if (n >= N) continue;
        const uint16_t* row = src + n * K;
        uint16_t* out = dst + b * K * 16 + i * 2;
        for (int64_t kp = 0; kp < K / 2; ++kp) {
          out[kp * 32] = row[2 * kp];
          out[kp * 32 + 1] = row[2 * kp + 1];
        }
      }
    }
  });
  return packed;
}

at::Tensor linear_packed_bf16(at::Tensor x, at::Tensor packed, int64_t N, c10::optional<at::Tensor> bias,
                              bool float_out, c10::optional<at::Tensor> argmax_out) {
  check_cpu_contiguous(x, "x");
  check_cpu_contiguous(packed, "packed");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 && packed.scalar_type() == at::kBFloat16,
              "linear_packed_bf16: bfloat16 only");
  TORCH_CHECK(x.dim() == 2 && packed.dim() == 4 && packed.size(2) == 16 && packed.size(3) == 2 &&
                  packed.size(1) * 2 == x.size(1) && packed.size(0) == (N + 15) / 16,
              "linear_packed_bf16: x [M, K] and a packed [ceil(N/16), K/2, 16, 2] weight");
  const uint16_t* bp = nullptr;
  if (bias.has_value() && bias->defined()) {
    check_cpu_contiguous(*bias, "bias");
    TORCH_CHECK(bias->scalar_type() == at::kBFloat16 && bias->numel() == N, "linear_packed_bf16: bias [N] bfloat16");
    bp = reinterpret_cast<const uint16_t*>(bias->data_ptr<c10::BFloat16>());
  }
#if CADENCE_HAVE_AVX512BF16
  const int64_t M = x.size(0), K = x.size(1), blocks = packed.size(0);
  int64_t* argmax_ids = nullptr;
  if (argmax_out.has_value() && argmax_out->defined()) {
    check_cpu_contiguous(*argmax_out, "argmax_out");
    TORCH_CHECK(float_out && argmax_out->scalar_type() == at::kLong && argmax_out->numel() == M,
                "linear_packed_bf16: argmax_out must be [M] int64, with float_out");
    argmax_ids = argmax_out->data_ptr<int64_t>();
  }
  // argmax: one tracker per (thread, row), merged after the GEMM. at::parallel_for gives each
  // thread one contiguous block range, which the trackers rely on (ascending columns).
  const int64_t team = at::get_num_threads();
  std::vector<LaneArgmax> trackers(argmax_ids != nullptr ? team * M : 0);
  auto out = at::empty({M, N}, x.options().dtype(float_out ? at::kFloat : at::kBFloat16));
  const uint16_t* xp = reinterpret_cast<const uint16_t*>(x.data_ptr<c10::BFloat16>());
  const uint16_t* wp = reinterpret_cast<const uint16_t*>(packed.data_ptr<c10::BFloat16>());
  float* out_float = float_out ? out.data_ptr<float>() : nullptr;
  uint16_t* out_bf16 = float_out ? nullptr : reinterpret_cast<uint16_t*>(out.data_ptr<c10::BFloat16>());
  const bool parallel = blocks * K * 32 >= PACKED_PARALLEL_MIN_BYTES || M * N * K >= (1 << 22);
  at::parallel_for(0, blocks, parallel ? GEMM_NB : blocks + 1, [&](int64_t begin, int64_t end) {
    packed_gemm_blocks(xp, K, M, wp, K, begin, end,
                       [&](int64_t m0, int mr, int64_t b0, int nb, __m512 acc[GEMM_MR][GEMM_NB]) {
                         if (out_float != nullptr)
                           store_tile_bf16_as_float(acc, m0, mr, b0, nb, N, bp, out_float, N,
                                                    argmax_ids != nullptr ? trackers.data() + at::get_thread_num() * M : nullptr);
                         else store_tile_bf16(acc, m0, mr, b0, nb, N, bp, out_bf16, N);
                       });
    _mm_sfence();  // streaming stores (float_out) are visible before the threads join
  });
  for (int64_t r = 0; r < M && argmax_ids != nullptr; ++r) {
    argmax_ids[r] = lane_argmax_merge(trackers.data() + r, team, M);
    if (argmax_ids[r] < 0) argmax_ids[r] = argmax_row(out_float + r * N, N);  // saw a NaN
  }
  return out;
#else
  TORCH_CHECK(false, "linear_packed_bf16: built without AVX512-BF16");
  return x;
#endif
}

}  // namespace cadence_kernels
