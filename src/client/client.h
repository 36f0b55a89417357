// vesper::client: a serving benchmark client for OpenAI-compatible servers (Vesper's `vesper
// serve`, llama.cpp's llama-server, vLLM), the engine of `vesper bench serve`.
//
// run_benchmark() sends streaming completion requests at Poisson (or gamma) arrival times, with at
// most max_concurrency in flight, all from one thread over asynchronous HTTP/1.1, and measures
// each one (stream_reader.h) and the whole run (metrics.h) as vLLM's benchmark_serving does.
// Requests that fail (HTTP status, connection, timeout, a stream without content) are counted
// and reported, never fatal; what stops the run before it starts is an error value naming the
// URL or setting at fault: a bad URL, an unreachable server, no model, or a first test request
// that fails (as vLLM's initial test run).
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "client/metrics.h"
#include "client/prompts.h"
#include "client/request_output.h"
#include "core/result.h"

namespace vesper::client {

struct BenchConfig {
  std::string base_url = "http://127.0.0.1:8000";
  std::string endpoint = "/v1/completions";  // ".../chat/completions" sends chat messages instead
  std::string model;                         // empty: the first model of GET /v1/models
  // --lora-modules: adapter names requests go to in turn (request i: lora_modules[i % n]), as
  // vLLM's benchmark_serving spreads requests over adapters; empty: every request to `model`.
  std::vector<std::string> lora_modules;
  // --lora-ids N: llama-server's form of the same: request i sends "lora": [{"id": i mod N,
  // "scale": 1}] (adapters given to llama-server with --lora, in order); 0: none.
  int64_t lora_ids = 0;
  std::string api_key;  // sent as "Authorization: Bearer KEY" when set
  int64_t num_prompts = 1000;
  double request_rate = std::numeric_limits<double>::infinity();  // requests/s; inf: all at once
  double burstiness = 1.0;      // gamma shape of the arrival gaps; 1: Poisson
  int64_t max_concurrency = 0;  // requests in flight at most; 0: no limit
  // Prompts: `requests` if given, else the JSONL `dataset` if given, else random words.
  std::vector<BenchRequest> requests;
  std::string dataset;
  int64_t input_len = 128;
  int64_t output_len = 128;
  uint64_t seed = 0;
  bool ignore_eos = true;  // "ignore_eos": true, so every request makes output_len tokens
  // --extra-body: a JSON object whose fields are added to every request body (for example a
  // response_format, to measure structured output); empty: none.
  std::string extra_body;
  bool test_request = true;               // send the first prompt once before the run, as vLLM does
  double request_timeout_s = 6 * 3600.0;  // per request, the whole stream (vLLM's aiohttp timeout)
  std::vector<double> percentiles = {99};
  // Called on the benchmark's thread when the requests start (done = 0) and after each one ends.
  std::function<void(int64_t done, int64_t total, int64_t output_tokens)> on_progress;
};

struct BenchResult {
  std::string model;
  std::string backend;  // "openai" or "openai-chat", as vLLM names them
  BenchConfig config;   // as run: model filled in, requests generated (prompts not kept)
  std::vector<BenchRequest> requests;
  std::vector<RequestOutput> outputs;  // one per request, in request order
  BenchMetrics metrics;
};

// Checks the settings (each error names its flag), without contacting the server.
Status validate(const BenchConfig& config);

Result<BenchResult> run_benchmark(const BenchConfig& config);

// vLLM's result JSON: "duration", "completed", "failed", "total_input_tokens",
// "total_output_tokens", "request_throughput", "output_throughput", "total_token_throughput",
// "{mean,median,std,pNN}_{ttft,tpot,itl,e2el}_ms", plus the run's settings; with `detailed`,
// the per-request arrays "input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors".
nlohmann::json to_json(const BenchResult& result, bool detailed = false);

// vLLM's printed report ("============ Serving Benchmark Result ============" ...).
std::string format_report(const BenchResult& result);

}  // namespace vesper::client
