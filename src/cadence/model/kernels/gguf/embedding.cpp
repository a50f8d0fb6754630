// gguf_embedding: rows of a GGUF weight's blocks decoded to float32, the values gguf-py's
// `gguf.quants.dequantize` gives bit for bit (GGUFWeight.embedding's reference), for the types a
// token embedding is usually stored in: Q4_K, Q6_K, Q8_0. A decode step looks up one row: gguf-py
// takes ~0.2 ms for it (numpy's per-call work on a 2048-value row), this a few microseconds.
//
// gguf-py computes in float32, one rounding per numpy operation: Q8_0 d * q; Q6_K (d * sc) * (q - 32);
// Q4_K (d * sc) * q - dmin * m. The Q4_K subtraction must not fuse with its product into an FMA
// (GCC contracts float expressions in C++ by default): q4k_value stores the product to a volatile
// first.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>

#include "../ops.h"
#include "blocks.h"

namespace cadence_kernels {

namespace {

float half_value(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, sizeof(h));
  return static_cast<float>(c10::Half(h, c10::Half::from_bits()));
}

// scale * q - minimum, each step rounded to float32 (never one FMA).
inline float q4k_value(float scale, float q, float minimum) {
  volatile float product = scale * q;
  return product - minimum;
}

// One Q4_K block (144 bytes: d, dmin, 12 bytes of 6-bit scales / minimums, 128 of nibbles) -> 256 values.
void q4k_block(const uint8_t* b, float* y) {
  const float d = half_value(b), dmin = half_value(b + 2);
  const uint8_t* s = b + 4;
  const uint8_t* qs = b + 16;
  for (int j = 0; j < 8; ++j) {
    const int sc = j < 4 ? s[j] & 63 : (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    const int m = j < 4 ? s[j + 4] & 63 : (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    const float scale = d * static_cast<float>(sc), minimum = dmin * static_cast<float>(m);
    const uint8_t* q = qs + 32 * (j / 2);
    const int shift = 4 * (j % 2);
    for (int l = 0; l < 32; ++l) y[32 * j + l] = q4k_value(scale, static_cast<float>((q[l] >> shift) & 0x0F), minimum);
  }
}

// One Q6_K block (210 bytes: 128 ql, 64 qh, 16 int8 scales, d) -> 256 values.
void q6k_block(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const int8_t* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = half_value(b + 208);
  for (int v = 0; v < 256; ++v) {
    const int h = v / 128, r = v % 128;
    const int low = (ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0F;
    const int high = (qh[32 * h + r % 32] >> (2 * (r / 32))) & 0x03;
    const int q = static_cast<int8_t>(low | (high << 4)) - 32;
    y[v] = (d * static_cast<float>(sc[v / 16])) * static_cast<float>(q);
  }
}

// One Q8_0 block (34 bytes: d, 32 int8) -> 32 values.
void q80_block(const uint8_t* b, float* y) {
  const float d = half_value(b);
  const int8_t* q = reinterpret_cast<const int8_t*>(b + 2);
  for (int l = 0; l < 32; ++l) y[l] = static_cast<float>(q[l]) * d;
}

}  // namespace

bool gguf_embedding_supported(int64_t type) {
  return type == gguf::Q4_K || type == gguf::Q6_K || type == gguf::Q8_0;
}

at::Tensor gguf_embedding(at::Tensor blocks, int64_t type, at::Tensor ids, int64_t K) {
  TORCH_CHECK(gguf_embedding_supported(type), "gguf_embedding: Q4_K, Q6_K or Q8_0 only, got ggml type ", type);
  const gguf::BlockSize size = gguf::block_size(static_cast<int>(type));
  TORCH_CHECK(K > 0 && K % size.elements == 0, "gguf_embedding: K must be a multiple of the type's blocks");
  const int64_t row_bytes = K / size.elements * size.bytes;
  TORCH_CHECK(blocks.device().is_cpu() && blocks.is_contiguous() && blocks.scalar_type() == at::kByte &&
                  blocks.dim() == 2 && blocks.size(1) == row_bytes,
              "gguf_embedding: blocks [N, ", row_bytes, "] contiguous uint8");
  TORCH_CHECK(ids.device().is_cpu() && ids.is_contiguous() && ids.scalar_type() == at::kLong && ids.dim() == 1,
              "gguf_embedding: ids [T] int64");
  const int64_t T = ids.size(0), N = blocks.size(0);
  auto out = at::empty({T, K}, blocks.options().dtype(at::kFloat));
  const int64_t* idp = ids.data_ptr<int64_t>();
  const uint8_t* w = blocks.data_ptr<uint8_t>();
  float* y = out.data_ptr<float>();
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK(idp[t] >= 0 && idp[t] < N, "gguf_embedding: id ", idp[t], " outside [0, ", N, ")");
    const uint8_t* row = w + idp[t] * row_bytes;
    for (int64_t b = 0; b < K / size.elements; ++b) {
      const uint8_t* blk = row + b * size.bytes;
      float* yb = y + t * K + b * size.elements;
      if (type == gguf::Q4_K) q4k_block(blk, yb);
      else if (type == gguf::Q6_K) q6k_block(blk, yb);
      else q80_block(blk, yb);
    }
  }
  return out;
}

}  // namespace cadence_kernels
