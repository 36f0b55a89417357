// The `vesper bench` family: each benchmark registers itself on the `bench` subcommand.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "cli/commands.h"
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

CommandRunner add_bench_throughput_command(CLI::App& bench);
CommandRunner add_bench_latency_command(CLI::App& bench);
CommandRunner add_bench_serve_command(CLI::App& bench);
CommandRunner add_bench_grammar_command(CLI::App& bench);

}  // namespace vesper::cli
