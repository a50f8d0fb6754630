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
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <tuple>
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

// Each thread's part of a step's GEMVs, fitted to the rates the threads streamed at (a stack's
// feedback: StepTeam::run with balanced phases). Equal bytes do not finish together: on the test
// host either thread waited 0.5-1.1 ms a step at the barriers, which one moving between
// processes, though both start within ~0.03 ms of each other (docs/performance.md).
// After each clean team step, every thread's rate in the balanced phases (its part over its
// busy time there, barrier waits left out) moves the parts a fifth of the way to the split that
// would have finished together. Which thread computes a column never changes its bits.
// CADENCE_THREAD_SPLIT (read when a stack is built) fixes the parts instead: `equal` (the split
// before this fit; an A/B switch), or a fraction F in (0, 1): thread 0 takes F, the others equal
// parts of the rest (experiments, and the tests' uneven splits).
class ThreadSplit {
 public:
  static constexpr double STEP = 0.2;    // how far one step's rates move the parts
  static constexpr double SPREAD = 0.5;  // a part stays within (1 +- SPREAD) / nth
  ThreadSplit() {
    const char* mode = std::getenv("CADENCE_THREAD_SPLIT");
    if (mode == nullptr || std::strcmp(mode, "fit") == 0) return;
    fit_ = false;
    char* end = nullptr;
    const double first = std::strtod(mode, &end);
    TORCH_CHECK(std::strcmp(mode, "equal") == 0 || (end != mode && *end == '\0' && first > 0.0 && first < 1.0),
                "CADENCE_THREAD_SPLIT: fit, equal or thread 0's fraction in (0, 1), got ", mode);
    if (std::strcmp(mode, "equal") != 0) fixed_first_ = first;
  }
  // The parts' cumulative bounds for a team of nth: nth + 1 fractions from 0 to 1.
  std::vector<double> bounds(int nth) const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<double> cum(nth + 1, 0.0);
    for (int t = 0; t < nth; ++t) {
      double part = static_cast<int>(part_.size()) == nth ? part_[t] : 1.0 / nth;
      if (fixed_first_ > 0.0 && nth > 1) part = t == 0 ? fixed_first_ : (1.0 - fixed_first_) / (nth - 1);
      cum[t + 1] = cum[t] + part;
    }
    cum[nth] = 1.0;
    return cum;
  }
  // One step's busy nanoseconds per thread in the balanced phases, at the bounds it ran with.
  void observe(const std::vector<double>& cum, const std::vector<int64_t>& busy_ns) {
    const int nth = static_cast<int>(busy_ns.size());
    if (nth < 2 || !fit_) return;
    std::vector<double> rate(nth);
    double total = 0.0;
    for (int t = 0; t < nth; ++t) {
      if (busy_ns[t] <= 0) return;
      rate[t] = (cum[t + 1] - cum[t]) / static_cast<double>(busy_ns[t]);
      total += rate[t];
    }
    std::lock_guard<std::mutex> lock(mutex_);
    if (static_cast<int>(part_.size()) != nth) part_.assign(nth, 1.0 / nth);
    double sum = 0.0;
    for (int t = 0; t < nth; ++t) {
      const double moved = part_[t] + STEP * (rate[t] / total - part_[t]);
      part_[t] = std::clamp(moved, (1.0 - SPREAD) / nth, (1.0 + SPREAD) / nth);
      sum += part_[t];
    }
    for (double& p : part_) p /= sum;
  }

 private:
  mutable std::mutex mutex_;
  std::vector<double> part_;  // empty: equal parts
  bool fit_ = true;            // refit by observe (CADENCE_THREAD_SPLIT unset or `fit`)
  double fixed_first_ = 0.0;   // > 0: thread 0's fixed fraction
};

// Diagnostics of a stack's last forward: thread 0's nanoseconds per phase, the team size, and
// per thread its start (ns after the region's first thread), its wall time per phase and the
// part of it spent waiting at the team's barriers (how balanced the threads' shares were).
template <int PHASES>
class StepStats {
 public:
  using PhaseNs = std::array<int64_t, PHASES>;
  void record(const PhaseNs& phase_ns, int team) {
    std::lock_guard<std::mutex> lock(mutex_);
    last_phase_ns_ = phase_ns;
    last_team_ = team;
  }
  // Thread tid's times in a step on `team` threads (every thread calls it).
  void record_thread(int tid, int team, int64_t start_ns, const PhaseNs& wall_ns, const PhaseNs& wait_ns) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (static_cast<int>(threads_.size()) != team) threads_.assign(team, ThreadTimes{});
    threads_[tid] = ThreadTimes{start_ns, wall_ns, wait_ns};
  }
  std::vector<double> phase_seconds() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<double> out;
    for (int p = 0; p < PHASES; ++p) out.push_back(last_phase_ns_[p] * 1e-9);
    return out;
  }
  // Per thread of the last step: (start delay, [wall per phase], [barrier wait per phase]), seconds.
  std::vector<std::tuple<double, std::vector<double>, std::vector<double>>> thread_seconds() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::vector<std::tuple<double, std::vector<double>, std::vector<double>>> out;
    for (const ThreadTimes& t : threads_) {
      std::vector<double> wall, wait;
      for (int p = 0; p < PHASES; ++p) {
        wall.push_back(t.wall_ns[p] * 1e-9);
        wait.push_back(t.wait_ns[p] * 1e-9);
      }
      out.emplace_back(t.start_ns * 1e-9, std::move(wall), std::move(wait));
    }
    return out;
  }
  int last_team() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return last_team_;
  }

 private:
  struct ThreadTimes {
    int64_t start_ns = 0;
    PhaseNs wall_ns{}, wait_ns{};
  };
  mutable std::mutex mutex_;
  PhaseNs last_phase_ns_{};
  int last_team_ = 0;
  std::vector<ThreadTimes> threads_;
};

// One thread of a step's team (StepTeam::run): its index and team size, the team barrier, and
// its wall time per phase and the part of it spent at the barrier (diagnostics: a stack's
// phase_seconds() for thread 0, thread_seconds() for all).
template <int PHASES>
class StepThread {
 public:
  StepThread(int tid_, int nth_, TeamBarrier* barrier, const double* bounds = nullptr)
      : tid(tid_), nth(nth_), barrier_(barrier), bounds_(bounds) {}
  const int tid, nth;
  // Waits for the whole team (nothing on a team of one).
  void sync() {
    if (barrier_ == nullptr) return;
    const auto start = std::chrono::steady_clock::now();
    barrier_->wait();
    waited_ns_ += std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
  }
  // The time since the last lap counts to `phase`, and so do the barrier waits in it.
  void lap(int phase) {
    const auto now = std::chrono::steady_clock::now();
    phase_ns_[phase] += std::chrono::duration_cast<std::chrono::nanoseconds>(now - mark_).count();
    wait_ns_[phase] += waited_ns_;
    waited_ns_ = 0;
    mark_ = now;
  }
  // This thread's part [begin, end) of `total` units split in near-equal runs over the team.
  std::pair<int64_t, int64_t> share(int64_t total) const { return {total * tid / nth, total * (tid + 1) / nth}; }
  // This thread's part [lo, hi) of a balanced phase's work, as fractions (ThreadSplit; equal
  // parts without one), and of `total` units: the runs meet exactly and the last ends at total.
  std::pair<double, double> part() const {
    if (bounds_ == nullptr) return {static_cast<double>(tid) / nth, static_cast<double>(tid + 1) / nth};
    return {bounds_[tid], bounds_[tid + 1]};
  }
  std::pair<int64_t, int64_t> balanced_share(int64_t total) const {
    const auto [lo, hi] = part();
    const auto at = [&](double f, int t) {
      return t == nth ? total : std::clamp<int64_t>(std::llround(f * static_cast<double>(total)), 0, total);
    };
    return {at(lo, tid), at(hi, tid + 1)};
  }
  const std::array<int64_t, PHASES>& phase_ns() const { return phase_ns_; }
  const std::array<int64_t, PHASES>& wait_ns() const { return wait_ns_; }
  std::chrono::steady_clock::time_point started() const { return started_; }

 private:
  TeamBarrier* const barrier_;  // null on a team of one
  const double* const bounds_;  // the team's part bounds (nth + 1), or null: equal parts
  std::array<int64_t, PHASES> phase_ns_{}, wait_ns_{};
  int64_t waited_ns_ = 0;  // at the barrier since the last lap
  const std::chrono::steady_clock::time_point started_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point mark_ = started_;
};

// One step of a fused stack on its team: the thread count (all `threads`, or one during a solo
// period: SoloSchedule), then run(body) calls body(StepThread&) on every thread of one OpenMP
// parallel region, records thread 0's phase times (and every thread's), and tells the schedule
// whether a thread was pushed off its core. With balanced phases (a bit mask of phase indices),
// the threads' parts of those phases (StepThread::part) come from the stack's ThreadSplit, and
// each clean team step's busy time in them refits it.
template <int PHASES>
class StepTeam {
 public:
  StepTeam(SoloSchedule& solo, StepStats<PHASES>& stats, ThreadSplit& split, int threads)
      : solo_(solo), stats_(stats), split_(split), size_(solo.team_for_step(std::max(1, threads))), barrier_(size_),
        bounds_(split.bounds(size_)) {}
  int size() const { return size_; }

  template <typename Body>
  void run(Body&& body, uint32_t balanced_phases = 0) {
    std::atomic<bool> lost_core{false};
    std::atomic<int> granted{0};
    std::vector<int64_t> busy_ns(size_, 0);  // per thread, in the balanced phases
    const auto entered = std::chrono::steady_clock::now();
#pragma omp parallel num_threads(size_)
    {
      // The runtime may grant fewer threads (nested call): then run everything on one.
      if (omp_get_thread_num() == 0) granted.store(omp_get_num_threads());
#pragma omp barrier
      const bool full_team = granted.load() == size_;
      if (full_team || omp_get_thread_num() == 0) {
        const ThreadClock clock;
        StepThread<PHASES> thread(full_team ? omp_get_thread_num() : 0, full_team ? size_ : 1,
                                  full_team && size_ > 1 ? &barrier_ : nullptr,
                                  full_team && balanced_phases != 0 ? bounds_.data() : nullptr);
        body(thread);
        // Off its core for over a quarter of the step: a neighbour process (or the host) holds
        // that core, and the partner waited on this thread at every barrier meanwhile.
        if (size_ > 1 && clock.descheduled(0.75)) lost_core.store(true, std::memory_order_relaxed);
        if (thread.tid == 0) stats_.record(thread.phase_ns(), thread.nth);
        stats_.record_thread(thread.tid, thread.nth,
                             std::chrono::duration_cast<std::chrono::nanoseconds>(thread.started() - entered).count(),
                             thread.phase_ns(), thread.wait_ns());
        if (full_team)
          for (int p = 0; p < PHASES; ++p)
            if (balanced_phases >> p & 1u) busy_ns[thread.tid] += thread.phase_ns()[p] - thread.wait_ns()[p];
      }
    }
    solo_.after_step(size_, lost_core.load());
    // A step with a thread off its core says nothing about the threads' own rates.
    if (balanced_phases != 0 && granted.load() == size_ && !lost_core.load()) split_.observe(bounds_, busy_ns);
  }

 private:
  SoloSchedule& solo_;
  StepStats<PHASES>& stats_;
  ThreadSplit& split_;
  const int size_;
  TeamBarrier barrier_;
  const std::vector<double> bounds_;  // split_'s bounds when the step began
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
  std::vector<std::tuple<double, std::vector<double>, std::vector<double>>> thread_seconds() const {
    return stats_.thread_seconds();
  }
  int last_team() const { return stats_.last_team(); }
  // The balanced phases' part bounds a step on `threads` threads would take now (ThreadSplit).
  std::vector<double> thread_parts(int64_t threads) const { return split_.bounds(static_cast<int>(threads)); }

 protected:
  // The team of a step on `threads` threads (at::get_num_threads()), or of one in a solo period.
  StepTeam<PHASES> step_team(int threads) const { return StepTeam<PHASES>(solo_, stats_, split_, threads); }

 private:
  mutable SoloSchedule solo_;
  mutable StepStats<PHASES> stats_;
  mutable ThreadSplit split_;
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
