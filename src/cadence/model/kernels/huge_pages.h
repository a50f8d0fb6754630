// Byte tensors for the weights a decode step streams whole (the repacked K-quant copies, gguf_repack),
// on memory marked for transparent huge pages (MADV_HUGEPAGE: a host whose THP setting is `madvise`
// backs only marked memory with them). A GEMV streaming 4 KiB pages pays a TLB walk per page and
// loses the hardware prefetcher at every page boundary. torch's allocator marks its large blocks too
// (THP_MEM_ALLOC_ENABLE, cadence/__init__.py), but a block's last partial 2 MiB stays on 4 KiB pages,
// and blocks under 2 MiB are never marked: a copy of 2 MiB or more whose own whole pages waste at most
// an eighth gets them (memory of its own, 2 MiB-aligned); smaller copies (q, k, v, o of a 1B model,
// 0.6-2.4 MB each, ~13% of its step's bytes: all on 4 KiB pages before, per /proc/self/smaps) share
// chunks of whole huge pages (HugePageArena), and so do the float32 stack's packed weights
// (huge_page_zeros, pack_weight_f32). Without THP (`never`, or PR_SET_THP_DISABLE) the advice
// does nothing and every copy is on 4 KiB pages, as torch's allocation would be.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/from_blob.h>
#include <sys/mman.h>

#include <cstdint>
#include <memory>
#include <mutex>

namespace cadence_kernels {

constexpr int64_t HUGE_PAGE_BYTES = 2 << 20;

// `size` bytes (a multiple of 2 MiB) mapped 2 MiB-aligned and marked for huge pages, or null.
inline void* map_huge_pages(int64_t size) {
  // Map one huge page more than needed, then unmap what lies outside the aligned range.
  void* raw = mmap(nullptr, size + HUGE_PAGE_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + HUGE_PAGE_BYTES - 1) / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES;
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = start + size + HUGE_PAGE_BYTES;
  if (end > aligned + size) munmap(reinterpret_cast<void*>(aligned + size), end - (aligned + size));
  void* data = reinterpret_cast<void*>(aligned);
  madvise(data, size, MADV_HUGEPAGE);  // advice only: without THP the pages are 4 KiB, nothing else changes
  return data;
}

// Copies under the one-of-its-own rule share chunks of CHUNK_BYTES, carved in allocation order (a
// model's loader repacks a layer's weights one after the other, so a step reads each chunk nearly
// in order). A chunk is unmapped when the last tensor carved from it is freed; a chunk's unused
// tail is never touched, so it costs address space, not memory (at most one partly written huge
// page per chunk: under 1/16 of it).
class HugePageArena {
 public:
  static constexpr int64_t CHUNK_BYTES = 16 * HUGE_PAGE_BYTES;
  static constexpr int64_t MIN_BYTES = 16 << 10;  // smaller copies: a negligible share of a step's bytes
  static constexpr int64_t ALIGN = 64;            // a cache line: what the kernels' loads assume

  // An uninitialised [rows, cols] uint8 tensor carved from the process's current chunk (a new
  // chunk where it does not fit), or an undefined tensor where mapping one fails.
  static at::Tensor take(int64_t rows, int64_t cols) {
    static HugePageArena arena;
    return arena.carve(rows, cols);
  }

 private:
  struct Chunk {
    explicit Chunk(void* b) : base(b) {}
    Chunk(const Chunk&) = delete;
    Chunk& operator=(const Chunk&) = delete;
    ~Chunk() { munmap(base, CHUNK_BYTES); }
    void* const base;
  };

  at::Tensor carve(int64_t rows, int64_t cols) {
    const int64_t bytes = rows * cols;
    std::shared_ptr<Chunk> chunk;
    int64_t offset = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!chunk_ || used_ + bytes > CHUNK_BYTES) {
        void* base = map_huge_pages(CHUNK_BYTES);
        if (base == nullptr) return at::Tensor();
        chunk_ = std::make_shared<Chunk>(base);
        used_ = 0;
      }
      chunk = chunk_;
      offset = used_;
      used_ = (used_ + bytes + ALIGN - 1) / ALIGN * ALIGN;
    }
    // Each tensor holds its chunk: the last one freed unmaps it.
    return at::from_blob(static_cast<uint8_t*>(chunk->base) + offset, {rows, cols}, [chunk](void*) {},
                         at::TensorOptions().dtype(at::kByte));
  }

  std::mutex mutex_;
  std::shared_ptr<Chunk> chunk_;  // the chunk new copies are carved from
  int64_t used_ = 0;
};

// An uninitialised [rows, cols] uint8 tensor on huge pages: memory of its own rounded up to whole
// 2 MiB pages where that wastes at most an eighth of its bytes, else (under 16 MiB) a slice of a
// shared chunk; tiny tensors, or a failing mmap, get torch's allocation.
inline at::Tensor huge_page_bytes(int64_t rows, int64_t cols) {
  const int64_t bytes = rows * cols;
  const int64_t size = (bytes + HUGE_PAGE_BYTES - 1) / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES;
  if (bytes >= HUGE_PAGE_BYTES && (size - bytes) * 8 <= bytes) {
    void* data = map_huge_pages(size);
    if (data != nullptr)
      return at::from_blob(data, {rows, cols}, [size](void* p) { munmap(p, size); },
                           at::TensorOptions().dtype(at::kByte));
  } else if (bytes >= HugePageArena::MIN_BYTES) {
    at::Tensor t = HugePageArena::take(rows, cols);
    if (t.defined()) return t;
  }
  return at::empty({rows, cols}, at::kByte);
}

// A zero-filled tensor of `sizes` and `dtype` on huge pages by huge_page_bytes' rules (the float32
// stack's packed weights: SmolLM2's are 0.05-1.2 MB each, none 2 MiB).
inline at::Tensor huge_page_zeros(at::IntArrayRef sizes, at::ScalarType dtype) {
  int64_t numel = 1;
  for (const int64_t s : sizes) numel *= s;
  const int64_t bytes = numel * static_cast<int64_t>(c10::elementSize(dtype));
  if (bytes == 0) return at::empty(sizes, at::TensorOptions().dtype(dtype));
  at::Tensor t = huge_page_bytes(1, bytes);
  t.zero_();
  return t.view(dtype).view(sizes);
}

}  // namespace cadence_kernels
