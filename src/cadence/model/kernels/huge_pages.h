// Byte tensors for the weights a decode step streams whole (the repacked K-quant copies, gguf_repack):
// memory of their own, 2 MiB-aligned and a whole number of 2 MiB pages, marked for transparent huge
// pages (MADV_HUGEPAGE: a host whose THP setting is `madvise` backs only marked memory with them).
// torch's allocator marks its large blocks too (THP_MEM_ALLOC_ENABLE, cadence/__init__.py), but a
// block's last partial 2 MiB stays on 4 KiB pages: ~25% of a 1B model's repacked bytes were, and a
// GEMV streaming 4 KiB pages pays a TLB walk per page and loses the hardware prefetcher at every
// page boundary.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <sys/mman.h>

#include <cstdint>

namespace cadence_kernels {

constexpr int64_t HUGE_PAGE_BYTES = 2 << 20;

// An uninitialised [rows, cols] uint8 tensor on whole huge pages where that wastes at most an eighth
// of its bytes (rounding up to 2 MiB), else (small tensors, or mmap failing) torch's allocation.
inline at::Tensor huge_page_bytes(int64_t rows, int64_t cols) {
  const int64_t bytes = rows * cols;
  const int64_t size = (bytes + HUGE_PAGE_BYTES - 1) / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES;
  if (bytes < HUGE_PAGE_BYTES || (size - bytes) * 8 > bytes) return at::empty({rows, cols}, at::kByte);
  // Map one huge page more than needed, then unmap what lies outside the aligned range.
  void* raw = mmap(nullptr, size + HUGE_PAGE_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return at::empty({rows, cols}, at::kByte);
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + HUGE_PAGE_BYTES - 1) / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES;
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = start + size + HUGE_PAGE_BYTES;
  if (end > aligned + size) munmap(reinterpret_cast<void*>(aligned + size), end - (aligned + size));
  void* data = reinterpret_cast<void*>(aligned);
  madvise(data, size, MADV_HUGEPAGE);  // advice only: without THP the pages are 4 KiB, nothing else changes
  return at::from_blob(data, {rows, cols}, [size](void* p) { munmap(p, size); }, at::TensorOptions().dtype(at::kByte));
}

}  // namespace cadence_kernels
