// The `vesper bench` family: each benchmark registers itself on the `bench` subcommand.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
#include "engine/engine.h"
#include "engine/memory_plan.h"

namespace vesper::cli {

// The KV cache a benchmark ran with, as its JSON reports it: the element types, bytes per token
// (scales included), tokens of capacity (with KIVI, quantized tokens) and how many max_model_len
// sequences it holds at once (with KIVI, their f16 residual windows included).
inline nlohmann::json kv_cache_json(const engine::MemoryPlan& plan) {
  return {{"dtype", plan.kv_dtype},
          {"bytes_per_token", plan.bytes_per_token},
          {"tokens", plan.token_capacity()},
          {"max_model_len", plan.max_model_len},
          {"sequences_at_once", plan.max_concurrency()}};
}

// Seconds per engine step phase over the run (engine/step_phases.h), their share of the phases'
// sum, and the mean per step that computed something.
inline nlohmann::json step_phases_json(const engine::EngineStats& stats) {
  nlohmann::json j = nlohmann::json::object();
  const double total = stats.phase_seconds.total();
  for (int i = 0; i < engine::kNumStepPhases; ++i) {
    const auto phase = static_cast<engine::StepPhase>(i);
    const double s = stats.phase_seconds[phase];
    j[std::string(engine::step_phase_name(phase))] = {
        {"seconds", s},
        {"share", total > 0 ? s / total : 0.0},
        {"mean_ms_per_step",
         stats.num_steps > 0 ? 1e3 * s / static_cast<double>(stats.num_steps) : 0.0}};
  }
  return j;
}

CommandRunner add_bench_throughput_command(CLI::App& bench);
CommandRunner add_bench_latency_command(CLI::App& bench);
CommandRunner add_bench_serve_command(CLI::App& bench);
CommandRunner add_bench_grammar_command(CLI::App& bench);

}  // namespace vesper::cli
