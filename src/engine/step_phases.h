// Where an engine step's time goes, phase by phase: scheduling (the plan, adapters bound), batch
// build (the runner's mirror, memory moves, the flat batch), the forward pass, sampling (and
// speculative verification), proposing the next step's speculative tokens, and output processing
// (detokenization, stop strings, the per-request outputs). The engine adds each step's seconds per
// phase to its statistics; the server exports them as the Prometheus histogram
// vesper:engine_step_phase_seconds{phase=...} and `vesper bench throughput --json` reports the
// totals.
#pragma once

#include <array>
#include <chrono>
#include <string_view>

namespace vesper::engine {

enum class StepPhase : int { kSchedule, kBatchBuild, kForward, kSample, kPropose, kOutput };
inline constexpr int kNumStepPhases = 6;

// "schedule", "batch_build", "forward", "sample", "propose", "output": the label values.
constexpr std::string_view step_phase_name(StepPhase phase) {
  constexpr std::array<std::string_view, kNumStepPhases> names = {
      "schedule", "batch_build", "forward", "sample", "propose", "output"};
  return names[static_cast<size_t>(phase)];
}

// Seconds spent in each phase (of one step, or summed over many).
struct StepPhaseTimes {
  std::array<double, kNumStepPhases> seconds{};

  double& operator[](StepPhase p) { return seconds[static_cast<size_t>(p)]; }
  double operator[](StepPhase p) const { return seconds[static_cast<size_t>(p)]; }
  double total() const {
    double t = 0;
    for (const double s : seconds) t += s;
    return t;
  }
  StepPhaseTimes& operator+=(const StepPhaseTimes& o) {
    for (size_t i = 0; i < seconds.size(); ++i) seconds[i] += o.seconds[i];
    return *this;
  }
};

// Adds the seconds from its construction (or the last lap) to a phase: `PhaseClock clock(times);
// ...; clock.lap(StepPhase::kSchedule); ...; clock.lap(StepPhase::kForward);`.
class PhaseClock {
 public:
  explicit PhaseClock(StepPhaseTimes& times) : times_(times), last_(now()) {}
  void lap(StepPhase phase) {
    const auto t = now();
    times_[phase] += std::chrono::duration<double>(t - last_).count();
    last_ = t;
  }
  // Starts the next lap here without charging the time since the last one to any phase.
  void restart() { last_ = now(); }

 private:
  static std::chrono::steady_clock::time_point now() { return std::chrono::steady_clock::now(); }
  StepPhaseTimes& times_;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace vesper::engine
