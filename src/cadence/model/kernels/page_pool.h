// PagePool: float32 tensors on memory that stays mapped (and faulted in) between uses, for an
// output that every decode step writes whole and the caller drops soon after: the GGUF stack's
// logits ([T, vocab] float32, 16 MB for a 32-row step of a 128k vocabulary). torch.empty maps
// such a block fresh each step, and the kernel that first writes it takes ~1000 page faults (the
// kernel zeroing each page first): 1B shape, b32 ctx512, the LM head phase 34.5 -> 28.5 ms with
// the block kept (one call, main vs this). A tensor of the pool is an ordinary tensor to its
// holders (views included); when the last of them lets go, its storage's deleter hands the block
// back to the pool instead of unmapping it, so a block is never written while anything reads it.
#pragma once

#include <ATen/core/Tensor.h>
#include <ATen/ops/from_blob.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "huge_pages.h"

namespace cadence_kernels {

class PagePool {
 public:
  // Free blocks kept at most (a step's logits and the previous step's, still held by its
  // sampler, plus a spare); more are unmapped as they come back.
  static constexpr size_t MAX_FREE = 3;

  static std::shared_ptr<PagePool> create() { return std::shared_ptr<PagePool>(new PagePool()); }

  ~PagePool() {
    for (const Block& b : free_) munmap(b.data, b.bytes);
  }

  // An uninitialised [rows, cols] float32 tensor: a free block of at least its bytes (and at most
  // twice them, so a small step does not hold a large block), else a new one of whole 2 MiB pages,
  // marked for transparent huge pages (huge_pages.h). `self` keeps the pool alive for as long as a
  // tensor of it lives.
  static at::Tensor take(const std::shared_ptr<PagePool>& self, int64_t rows, int64_t cols) {
    const size_t need = static_cast<size_t>(std::max<int64_t>(1, rows * cols)) * sizeof(float);
    Block block = self->reuse(need);
    if (block.data == nullptr) {
      block.bytes = (need + HUGE_PAGE_BYTES - 1) / HUGE_PAGE_BYTES * HUGE_PAGE_BYTES;
      block.data = mmap(nullptr, block.bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (block.data == MAP_FAILED) return at::empty({rows, cols}, at::kFloat);
      madvise(block.data, block.bytes, MADV_HUGEPAGE);  // advice only
    }
    std::weak_ptr<PagePool> pool = self;
    return at::from_blob(
        block.data, {rows, cols},
        [pool, block](void*) {
          if (auto p = pool.lock()) p->give_back(block);
          else munmap(block.data, block.bytes);
        },
        at::TensorOptions().dtype(at::kFloat));
  }

 private:
  struct Block {
    void* data = nullptr;
    size_t bytes = 0;
  };
  PagePool() = default;

  Block reuse(size_t need) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < free_.size(); ++i) {
      if (free_[i].bytes >= need && free_[i].bytes <= 2 * need + HUGE_PAGE_BYTES) {
        const Block b = free_[i];
        free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
        return b;
      }
    }
    return {};
  }

  void give_back(const Block& b) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(b);
    if (free_.size() > MAX_FREE) {  // the oldest goes
      munmap(free_.front().data, free_.front().bytes);
      free_.erase(free_.begin());
    }
  }

  mutable std::mutex mutex_;
  std::vector<Block> free_;
};

}  // namespace cadence_kernels
