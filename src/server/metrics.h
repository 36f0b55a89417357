// Prometheus metrics of the server, with vLLM's metric names under the vesper: prefix:
// gauges of running / waiting / swapped requests and KV cache usage, counters of prompt and
// generation tokens, preemptions and finished requests, and histograms of time to first token,
// time per output token, end-to-end latency, request prompt / generation lengths, and the seconds
// each engine step spends per phase (engine/step_phases.h).
// Updated from the engine thread after every step; rendered on GET /metrics. Thread-safe.
#pragma once

#include <array>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "engine/engine.h"

namespace vesper::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds)
      : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}
  void observe(double v);
  // Appends the Prometheus text of this histogram (cumulative buckets, _sum, _count).
  void render(const std::string& name, const std::string& labels, std::string& out) const;

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Metrics {
 public:
  // `live_stats` gives the engine's current statistics when metrics are rendered (gauges must
  // reflect aborts and idle periods, not only the last step).
  Metrics(std::string model_name, std::function<engine::EngineStats()> live_stats);

  // After each engine step: the outputs of the step and the engine's statistics.
  void on_step(const std::vector<engine::RequestOutput>& outputs, const engine::EngineStats& stats);
  // Requests refused at admission (503) or rejected as invalid (4xx).
  void on_rejected(int status);

  std::string render() const;

 private:
  mutable std::mutex mutex_;
  std::string labels_;  // model_name="..."
  std::function<engine::EngineStats()> live_stats_;
  std::map<std::string, uint64_t> finished_by_reason_;
  std::map<int, uint64_t> rejected_by_status_;
  Histogram ttft_, tpot_, e2e_, queue_, prompt_len_, generation_len_;
  // vesper:engine_step_phase_seconds{phase=...}: each computing step's seconds per phase.
  std::vector<Histogram> step_phase_;
  int64_t steps_seen_ = 0;
};

}  // namespace vesper::server
