#include "server/metrics.h"

#include <chrono>
#include <cstdio>

namespace vesper::server {
namespace {

std::vector<double> latency_buckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25, 0.5,
          0.75,  1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0};
}
std::vector<double> length_buckets() {
  return {1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000};
}

// Seconds, from 10 microseconds (a scheduling pass) to seconds (a long prompt's forward pass).
std::vector<double> phase_buckets() {
  return {1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3,
          0.01, 0.025,  0.05, 0.1,  0.25,   0.5,  1.0,  2.5,    5.0};
}

std::string fmt(double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.10g", v);
  return buf;
}

void line(std::string& out, const std::string& name, const std::string& labels, double v) {
  out += name + "{" + labels + "} " + fmt(v) + "\n";
}

// A label value as Prometheus' text format wants it: backslash, quote and newline escaped.
std::string escape_label(const std::string& v) {
  std::string out;
  for (const char c : v) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

void header(std::string& out, const std::string& name, const char* type, const char* help) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

}  // namespace

void Histogram::observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::render(const std::string& name, const std::string& labels, std::string& out) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += name + "_bucket{" + labels + ",le=\"" + fmt(bounds_[i]) + "\"} " +
           std::to_string(cumulative) + "\n";
  }
  cumulative += counts_.back();
  out += name + "_bucket{" + labels + ",le=\"+Inf\"} " + std::to_string(cumulative) + "\n";
  out += name + "_sum{" + labels + "} " + fmt(sum_) + "\n";
  out += name + "_count{" + labels + "} " + std::to_string(count_) + "\n";
}

Metrics::Metrics(std::string model_name, std::function<engine::EngineStats()> live_stats)
    : labels_("model_name=\"" + model_name + "\""),
      live_stats_(std::move(live_stats)),
      ttft_(latency_buckets()),
      tpot_(latency_buckets()),
      e2e_(latency_buckets()),
      queue_(latency_buckets()),
      prompt_len_(length_buckets()),
      generation_len_(length_buckets()),
      step_phase_(engine::kNumStepPhases, Histogram(phase_buckets())) {}

void Metrics::on_step(const std::vector<engine::RequestOutput>& outputs,
                      const engine::EngineStats& stats) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (stats.num_steps > steps_seen_) {
    steps_seen_ = stats.num_steps;
    for (int i = 0; i < engine::kNumStepPhases; ++i)
      step_phase_[static_cast<size_t>(i)].observe(
          stats.last_step_phase_seconds[static_cast<engine::StepPhase>(i)]);
  }
  for (const auto& out : outputs) {
    if (!out.finished) continue;
    const auto& m = out.metrics;
    size_t generated = 0;
    for (const auto& c : out.outputs) {
      generated += c.token_ids.size();
      ++finished_by_reason_[c.finish_reason.value_or("stop")];
    }
    if (m.first_token_time > 0) ttft_.observe(m.first_token_time - m.arrival_time);
    if (generated > 1 && m.last_token_time > m.first_token_time)
      tpot_.observe((m.last_token_time - m.first_token_time) / static_cast<double>(generated - 1));
    e2e_.observe(m.finished_time - m.arrival_time);
    if (m.first_scheduled_time > 0) queue_.observe(m.first_scheduled_time - m.arrival_time);
    prompt_len_.observe(static_cast<double>(out.prompt_token_ids.size()));
    generation_len_.observe(static_cast<double>(generated));
  }
}

void Metrics::on_rejected(int status) {
  std::lock_guard<std::mutex> lock(mutex_);
  ++rejected_by_status_[status];
}

std::string Metrics::render() const {
  const engine::EngineStats s = live_stats_();
  std::lock_guard<std::mutex> lock(mutex_);
  std::string out;
  auto gauge = [&](const char* name, const char* help, double v) {
    header(out, name, "gauge", help);
    line(out, name, labels_, v);
  };
  auto counter = [&](const char* name, const char* help, double v) {
    header(out, name, "counter", help);
    line(out, name, labels_, v);
  };
  gauge("vesper:num_requests_running", "Number of sequences in the running batch.",
        static_cast<double>(s.num_running));
  gauge("vesper:num_requests_waiting", "Number of sequences waiting to be scheduled.",
        static_cast<double>(s.num_waiting));
  gauge("vesper:num_requests_swapped", "Number of sequences swapped out to host memory.",
        static_cast<double>(s.num_swapped));
  gauge("vesper:kv_cache_usage_perc", "Fraction of KV cache blocks in use (1 = 100%).",
        s.kv_usage());
  gauge("vesper:gpu_cache_usage_perc", "KV cache usage of the compute device (vLLM's older name).",
        s.kv_usage());
  gauge("vesper:kv_cache_blocks_used", "KV cache blocks in use.",
        static_cast<double>(s.kv_blocks_used));
  gauge("vesper:kv_cache_blocks_total", "KV cache blocks in all.",
        static_cast<double>(s.kv_blocks_total));
  counter("vesper:prefix_cache_queries_total",
          "Prompt tokens looked up in the prefix cache at admission.",
          static_cast<double>(s.prefix_cache_queries));
  counter("vesper:prefix_cache_hits_total", "Prompt tokens found in the prefix cache at admission.",
          static_cast<double>(s.prefix_cache_hits));
  gauge("vesper:gpu_prefix_cache_hit_rate",
        "Prefix cache hits / queries since start, in tokens (vLLM's older gauge).",
        s.prefix_cache_queries
            ? static_cast<double>(s.prefix_cache_hits) / static_cast<double>(s.prefix_cache_queries)
            : 0.0);
  gauge("vesper:kv_cache_blocks_cached",
        "KV blocks indexed by the prefix cache (in use or evictable).",
        static_cast<double>(s.kv_blocks_cached));
  counter("vesper:prefix_cache_evictions_total", "Cached KV blocks evicted to make room.",
          static_cast<double>(s.prefix_cache_evictions));
  counter("vesper:num_preemptions_total", "Preemptions (recompute and swap) since start.",
          static_cast<double>(s.num_preemptions));
  counter("vesper:prompt_tokens_total", "Prompt tokens of requests admitted.",
          static_cast<double>(s.prompt_tokens));
  counter("vesper:prefill_tokens_computed_total",
          "Tokens computed in prefill, recomputation included.",
          static_cast<double>(s.prefill_tokens_computed));
  counter("vesper:generation_tokens_total", "Generated tokens.",
          static_cast<double>(s.generation_tokens));
  counter("vesper:spec_decode_num_drafts_total",
          "Speculative verifications: one sequence's proposals checked in a step.",
          static_cast<double>(s.spec_num_drafts));
  counter("vesper:spec_decode_num_draft_tokens_total", "Speculative tokens proposed and verified.",
          static_cast<double>(s.spec_num_draft_tokens));
  counter("vesper:spec_decode_num_accepted_tokens_total", "Speculative tokens accepted.",
          static_cast<double>(s.spec_num_accepted_tokens));
  header(out, "vesper:spec_decode_num_accepted_tokens_per_pos", "counter",
         "Speculative tokens accepted, by their position among a sequence's proposals.");
  for (size_t i = 0; i < s.spec_accepted_per_pos.size(); ++i)
    line(out, "vesper:spec_decode_num_accepted_tokens_per_pos",
         labels_ + ",position=\"" + std::to_string(i) + "\"",
         static_cast<double>(s.spec_accepted_per_pos[i]));
  if (s.lora_enabled) {
    // vLLM's gauge: the adapters in use as labels, the time of the reading as the value.
    auto joined = [](const std::vector<std::string>& names) {
      std::string j;
      for (const std::string& n : names) j += (j.empty() ? "" : ",") + n;
      return j;
    };
    header(
        out, "vesper:lora_requests_info", "gauge",
        "Adapters of running and waiting requests (labels); the value is the time of the reading.");
    line(out, "vesper:lora_requests_info",
         labels_ + ",running_lora_adapters=\"" + escape_label(joined(s.running_adapters)) +
             "\",waiting_lora_adapters=\"" + escape_label(joined(s.waiting_adapters)) +
             "\",max_lora=\"" + std::to_string(s.max_loras) + "\"",
         static_cast<double>(std::chrono::duration_cast<std::chrono::seconds>(
                                 std::chrono::system_clock::now().time_since_epoch())
                                 .count()));
    counter("vesper:lora_adapter_loads_total", "Adapter files read (loads and reloads).",
            static_cast<double>(s.adapter_loads));
  }
  counter("vesper:grammar_masks_prefetched_total",
          "Structured output: grammar masks computed ahead of their step, off the step loop.",
          static_cast<double>(s.grammar_masks_prefetched));
  header(out, "vesper:request_success_total", "counter", "Finished sequences by finish reason.");
  for (const auto& [reason, n] : finished_by_reason_)
    line(out, "vesper:request_success_total", labels_ + ",finished_reason=\"" + reason + "\"",
         static_cast<double>(n));
  header(out, "vesper:request_rejected_total", "counter",
         "Requests refused with an HTTP error, by status.");
  for (const auto& [status, n] : rejected_by_status_)
    line(out, "vesper:request_rejected_total",
         labels_ + ",status=\"" + std::to_string(status) + "\"", static_cast<double>(n));
  header(out, "vesper:time_to_first_token_seconds", "histogram", "Time to first token.");
  ttft_.render("vesper:time_to_first_token_seconds", labels_, out);
  header(out, "vesper:time_per_output_token_seconds", "histogram",
         "Time per output token after the first.");
  tpot_.render("vesper:time_per_output_token_seconds", labels_, out);
  header(out, "vesper:e2e_request_latency_seconds", "histogram", "End-to-end request latency.");
  e2e_.render("vesper:e2e_request_latency_seconds", labels_, out);
  header(out, "vesper:request_queue_time_seconds", "histogram",
         "Time from arrival to first scheduling.");
  queue_.render("vesper:request_queue_time_seconds", labels_, out);
  header(out, "vesper:request_prompt_tokens", "histogram", "Prompt length of finished requests.");
  prompt_len_.render("vesper:request_prompt_tokens", labels_, out);
  header(out, "vesper:request_generation_tokens", "histogram",
         "Generated length of finished requests.");
  generation_len_.render("vesper:request_generation_tokens", labels_, out);
  header(out, "vesper:engine_step_phase_seconds", "histogram",
         "Seconds each engine step spent per phase (schedule, batch_build, forward, sample, "
         "propose, output).");
  for (int i = 0; i < engine::kNumStepPhases; ++i)
    step_phase_[static_cast<size_t>(i)].render(
        "vesper:engine_step_phase_seconds",
        labels_ + ",phase=\"" +
            std::string(engine::step_phase_name(static_cast<engine::StepPhase>(i))) + "\"",
        out);
  return out;
}

}  // namespace vesper::server
