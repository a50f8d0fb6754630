// The thread team of the fused decode stacks (decode_stack.cpp, avx2/decode_stack_f32.cpp,
// gguf/decode_stack_gguf.cpp): a spinning barrier that yields, a per-thread clock that tells a
// thread pushed off its core by a neighbour process, work-stealing item ranges packed in one
// atomic word, and a step's parallel region (StepTeam) that every stack runs its layers in.
#pragma once

#include <immintrin.h>
#include <omp.h>
#include <sched.h>
#include <sys/resource.h>
#include <time.h>

#include <c10/util/Exception.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

namespace cadence_kernels {

// Sense-reversing team barrier. Spins briefly (the partner is usually microseconds away), then
// yields the core, so that a partner descheduled by a busy neighbour gets to run.
class TeamBarrier {
 public:
  explicit TeamBarrier(int team) : team_(team) {}
  void wait() {
    const int generation = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) == team_ - 1) {
      arrived_.store(0, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);
      return;
    }
    for (int spins = 0; generation_.load(std::memory_order_acquire) == generation; ++spins) {
      if (spins < SPIN_LIMIT) _mm_pause();
      else sched_yield();
    }
  }

 private:
  static constexpr int SPIN_LIMIT = 2000;
  const int team_;
  std::atomic<int> arrived_{0};
  std::atomic<int> generation_{0};
};

// This thread's CPU time, wall time (ns) and involuntary context switches, to tell a thread that
// a neighbour process pushed off its core from a busy one.
struct ThreadClock {
  static int64_t cpu_ns() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
  }
  static int64_t wall_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::now().time_since_epoch()).count();
  }
  static int64_t preemptions() {
    rusage usage;
    getrusage(RUSAGE_THREAD, &usage);
    return usage.ru_nivcsw;
  }
  const int64_t cpu0 = cpu_ns(), wall0 = wall_ns(), preempted0 = preemptions();
  // Whether the thread was preempted (the guest scheduler ran something else on its core) and
  // ran for less than `share` of the wall time since construction. Waits spin or yield on a
  // core, so only time off every core counts; the host taking the whole virtual CPU (steal
  // time) preempts nobody here and is no reason to drop a thread. Steps shorter than
  // MIN_WALL_NS say too little to judge.
  bool descheduled(double share) const {
    static constexpr int64_t MIN_WALL_NS = 500000;
    const int64_t wall = wall_ns() - wall0;
    return wall >= MIN_WALL_NS && preemptions() > preempted0 &&
           static_cast<double>(cpu_ns() - cpu0) < share * static_cast<double>(wall);
  }
};

// An item range [head, tail) in one atomic word (see the attention phase of forward).
inline uint64_t pack_range(int64_t head, int64_t tail) {
  return (static_cast<uint64_t>(head) << 32) | static_cast<uint64_t>(tail);
}
inline int64_t range_head(uint64_t range) { return static_cast<int64_t>(range >> 32); }
inline int64_t range_tail(uint64_t range) { return static_cast<int64_t>(range & 0xffffffffu); }
// Takes the head item (front) or the tail item (!front); -1 when the range is empty.
inline int64_t take_item(std::atomic<uint64_t>& range, bool front) {
  uint64_t cur = range.load(std::memory_order_acquire);
  while (true) {
    const int64_t head = range_head(cur), tail = range_tail(cur);
    if (head >= tail) return -1;
    const uint64_t rest = front ? pack_range(head + 1, tail) : pack_range(head, tail - 1);
    if (range.compare_exchange_weak(cur, rest, std::memory_order_acq_rel)) return front ? head : tail - 1;
  }
}
// The head item, left in place (-1 when the range is empty).
inline int64_t peek_front(const std::atomic<uint64_t>& range) {
  const uint64_t cur = range.load(std::memory_order_acquire);
  return range_head(cur) < range_tail(cur) ? range_head(cur) : -1;
}

// How many threads a fused stack's next step runs on: all of them, unless recent steps had a
// thread pushed off its core (a busy neighbour process): then one for a solo period, and the
// team is tried again after. One such step alone may be a passing burst (the host's steal time, an
// interrupt storm) that costs less than a solo period at half speed would: it takes
// LOST_STEPS_TO_SOLO in a row. The period starts short (FIRST_SOLO_STEPS) and doubles each time
// the team loses its core again soon after, up to MAX_SOLO_STEPS: a neighbour that stays busy is
// met with long periods after a few short ones, while a false alarm (a burst right after start
// that looked like a neighbour) costs 8 steps on one thread instead of 64. CLEAN_STEPS_TO_RESET
// team steps in a row without a lost core make the next period short again.
class SoloSchedule {
 public:
  static constexpr int FIRST_SOLO_STEPS = 8;
  static constexpr int MAX_SOLO_STEPS = 64;
  static constexpr int LOST_STEPS_TO_SOLO = 2;
  static constexpr int CLEAN_STEPS_TO_RESET = 64;

  int team_for_step(int threads) {
    const int solo_left = solo_steps_left_.load(std::memory_order_relaxed);
    if (solo_left > 0) {
      solo_steps_left_.store(solo_left - 1, std::memory_order_relaxed);
      return 1;
    }
    return threads;
  }
  // After a step on `team` threads; lost_core: a thread was pushed off its core in it.
  void after_step(int team, bool lost_core) {
    if (team <= 1) return;
    const int clean = lost_core ? 0 : clean_steps_.load(std::memory_order_relaxed) + 1;
    clean_steps_.store(clean, std::memory_order_relaxed);
    if (clean >= CLEAN_STEPS_TO_RESET) next_solo_steps_.store(FIRST_SOLO_STEPS, std::memory_order_relaxed);
    const int lost = lost_core ? lost_steps_.load(std::memory_order_relaxed) + 1 : 0;
    lost_steps_.store(lost >= LOST_STEPS_TO_SOLO ? 0 : lost, std::memory_order_relaxed);
    if (lost >= LOST_STEPS_TO_SOLO) {
      const int period = next_solo_steps_.load(std::memory_order_relaxed);
      solo_steps_left_.store(period, std::memory_order_relaxed);
      next_solo_steps_.store(std::min(2 * period, MAX_SOLO_STEPS), std::memory_order_relaxed);
    }
  }

 private:
  std::atomic<int> solo_steps_left_{0};
  std::atomic<int> lost_steps_{0};
  std::atomic<int> clean_steps_{0};
  std::atomic<int> next_solo_steps_{FIRST_SOLO_STEPS};
};

// Diagnostics of a stack's last forward: thread 0's nanoseconds per phase and the team size.
template <int PHASES>
class StepStats {
 public:
  void record(const std::array<int64_t, PHASES>& phase_ns, int team) {
    std::lock_guard<std::mutex> lock(mutex_);
    last_phase_ns_ = phase_ns;
    last_team_ = team;
  }
  std::vector<double> phase_seconds() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<double> out;
    for (int p = 0; p < PHASES; ++p) out.push_back(last_phase_ns_[p] * 1e-9);
    return out;
  }
  int last_team() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return last_team_;
  }

 private:
  mutable std::mutex mutex_;
  std::array<int64_t, PHASES> last_phase_ns_{};
  int last_team_ = 0;
};

// One thread of a step's team (StepTeam::run): its index and team size, the team barrier, and
// thread 0's wall time per phase (diagnostics: a stack's phase_seconds()).
template <int PHASES>
class StepThread {
 public:
  StepThread(int tid_, int nth_, TeamBarrier* barrier) : tid(tid_), nth(nth_), barrier_(barrier) {}
  const int tid, nth;
  // Waits for the whole team (nothing on a team of one).
  void sync() {
    if (barrier_ != nullptr) barrier_->wait();
  }
  // Thread 0: the time since the last lap counts to `phase` (barrier waits count to the phase
  // before them).
  void lap(int phase) {
    if (tid != 0) return;
    const auto now = std::chrono::steady_clock::now();
    phase_ns_[phase] += std::chrono::duration_cast<std::chrono::nanoseconds>(now - mark_).count();
    mark_ = now;
  }
  // This thread's part [begin, end) of `total` units split in near-equal runs over the team.
  std::pair<int64_t, int64_t> share(int64_t total) const { return {total * tid / nth, total * (tid + 1) / nth}; }
  const std::array<int64_t, PHASES>& phase_ns() const { return phase_ns_; }

 private:
  TeamBarrier* const barrier_;  // null on a team of one
  std::array<int64_t, PHASES> phase_ns_{};
  std::chrono::steady_clock::time_point mark_ = std::chrono::steady_clock::now();
};

// One step of a fused stack on its team: the thread count (all `threads`, or one during a solo
// period: SoloSchedule), then run(body) calls body(StepThread&) on every thread of one OpenMP
// parallel region, records thread 0's phase times, and tells the schedule whether a thread was
// pushed off its core.
template <int PHASES>
class StepTeam {
 public:
  StepTeam(SoloSchedule& solo, StepStats<PHASES>& stats, int threads)
      : solo_(solo), stats_(stats), size_(solo.team_for_step(std::max(1, threads))), barrier_(size_) {}
  int size() const { return size_; }

  template <typename Body>
  void run(Body&& body) {
    std::atomic<bool> lost_core{false};
    std::atomic<int> granted{0};
#pragma omp parallel num_threads(size_)
    {
      // The runtime may grant fewer threads (nested call): then run everything on one.
      if (omp_get_thread_num() == 0) granted.store(omp_get_num_threads());
#pragma omp barrier
      const bool full_team = granted.load() == size_;
      if (full_team || omp_get_thread_num() == 0) {
        const ThreadClock clock;
        StepThread<PHASES> thread(full_team ? omp_get_thread_num() : 0, full_team ? size_ : 1,
                                  full_team && size_ > 1 ? &barrier_ : nullptr);
        body(thread);
        // Off its core for over a quarter of the step: a neighbour process (or the host) holds
        // that core, and the partner waited on this thread at every barrier meanwhile.
        if (size_ > 1 && clock.descheduled(0.75)) lost_core.store(true, std::memory_order_relaxed);
        if (thread.tid == 0) stats_.record(thread.phase_ns(), thread.nth);
      }
    }
    solo_.after_step(size_, lost_core.load());
  }

 private:
  SoloSchedule& solo_;
  StepStats<PHASES>& stats_;
  const int size_;
  TeamBarrier barrier_;
};

// What a fused stack keeps from one step to the next for its team (the base of each stack):
// the solo schedule, and the last step's diagnostics, thread 0's wall seconds per phase
// (barrier waits count to the phase before them) and the number of threads it ran on (1 in a
// solo period after a busy-neighbour step).
template <int PHASES>
class StackTeam {
 public:
  static constexpr int NUM_PHASES = PHASES;
  std::vector<double> phase_seconds() const { return stats_.phase_seconds(); }
  int last_team() const { return stats_.last_team(); }

 protected:
  // The team of a step on `threads` threads (at::get_num_threads()), or of one in a solo period.
  StepTeam<PHASES> step_team(int threads) const { return StepTeam<PHASES>(solo_, stats_, threads); }

 private:
  mutable SoloSchedule solo_;
  mutable StepStats<PHASES> stats_;
};

// Bounds of a step's rows (slot, block-table row, context length, every block id they reach): a
// bad slot, table or length must fail here, not read or write arbitrary memory.
inline void check_step_rows(const char* who, int64_t T, const int64_t* slots, const int64_t* row_seq,
                            const int64_t* ctx_lens, const int32_t* tables, int64_t num_tables,
                            int64_t max_blocks, int64_t blocks, int64_t block_size) {
  for (int64_t t = 0; t < T; ++t) {
    TORCH_CHECK(slots[t] >= 0 && slots[t] < blocks * block_size, who, ": slot ", slots[t], " outside the cache");
    TORCH_CHECK(row_seq[t] >= 0 && row_seq[t] < num_tables, who, ": row_seq outside block_tables");
    TORCH_CHECK(ctx_lens[t] > 0 && ctx_lens[t] <= max_blocks * block_size, who, ": ctx_len ", ctx_lens[t],
                " outside the table");
    for (int64_t b = 0; b < (ctx_lens[t] + block_size - 1) / block_size; ++b) {
      const int32_t id = tables[row_seq[t] * max_blocks + b];
      TORCH_CHECK(id >= 0 && id < blocks, who, ": block id ", id, " outside pool of ", blocks);
    }
  }
}

}  // namespace cadence_kernels
