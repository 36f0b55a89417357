// `vesper bench serve --base-url URL --num-prompts N --request-rate R [...]`: online serving
// benchmark against any OpenAI-compatible server (vesper serve, llama-server, vLLM), with vLLM
// benchmark_serving's flags, arrival process and metric definitions (client/client.h).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

#include <nlohmann/json.hpp>

#include "cli/bench_commands.h"
#include "cli/commands.h"
#include "cli/progress_bar.h"
#include "client/client.h"
#include "client/url.h"

namespace vesper::cli {
namespace {

struct ServeBenchOptions {
  client::BenchConfig config;
  std::string request_rate = "inf";
  std::string percentiles = "99";
  bool json = false;
  bool save_detailed = false;
};

Result<double> parse_request_rate(const std::string& text) {
  if (text == "inf" || text == "Inf" || text == "INF")
    return std::numeric_limits<double>::infinity();
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (text.empty() || *end != '\0' || !(v > 0) || std::isinf(v))
    return make_error("\"" + text + "\": expected a number of requests/s > 0, or inf");
  return v;
}

Result<std::vector<double>> parse_percentiles(const std::string& text) {
  std::vector<double> out;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    if (item.empty() || *end != '\0' || !(v >= 0 && v <= 100))
      return make_error("\"" + text +
                        "\": expected comma-separated numbers in [0, 100], e.g. 50,90,99");
    out.push_back(v);
  }
  if (out.empty()) return make_error("\"" + text + "\": no percentile given");
  return out;
}

// CLI11 2.1's PositiveNumber prints the whole double range in its message; this says it plainly.
CLI::Validator positive() {
  return CLI::Validator(
      [](std::string& text) {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || *end != '\0' || !(v > 0) || std::isinf(v))
          return "\"" + text + "\": expected a number > 0";
        return std::string();
      },
      "POSITIVE");
}

// Failed requests, grouped by message: the few most useful lines for stderr.
void report_failures(const client::BenchResult& r) {
  std::map<std::string, int64_t> counts;
  for (const auto& o : r.outputs)
    if (!o.success) ++counts[o.error];
  int shown = 0;
  for (const auto& [message, n] : counts) {
    if (++shown > 5) {
      std::fprintf(stderr, "vesper: ... and %zu other errors\n", counts.size() - 5);
      break;
    }
    std::fprintf(stderr, "vesper: %lld request(s) failed: %s\n", static_cast<long long>(n),
                 message.c_str());
  }
}

int run_bench_serve(ServeBenchOptions& o) {
  auto rate = parse_request_rate(o.request_rate);
  if (!rate) return fail("--request-rate " + rate.error().message);
  o.config.request_rate = *rate;
  auto percentiles = parse_percentiles(o.percentiles);
  if (!percentiles) return fail("--metric-percentiles " + percentiles.error().message);
  o.config.percentiles = *percentiles;
  if (auto st = client::validate(o.config); !st) return fail(st.error().message);

  std::optional<ProgressBar> progress;  // made when the run starts and the total is known
  o.config.on_progress = [&](int64_t done, int64_t total, int64_t tokens) {
    if (!progress) progress.emplace("bench serve", total);
    progress->update(done, tokens);
  };
  auto result = client::run_benchmark(o.config);
  if (!result) return fail(result.error().message);
  if (static_cast<int64_t>(result->requests.size()) < o.config.num_prompts)
    std::fprintf(stderr, "vesper: note: %s holds %zu requests; ran those, not --num-prompts %lld\n",
                 o.config.dataset.c_str(), result->requests.size(),
                 static_cast<long long>(o.config.num_prompts));
  if (o.json)
    std::printf("%s\n", client::to_json(*result, o.save_detailed).dump().c_str());
  else
    std::fputs(client::format_report(*result).c_str(), stdout);
  std::fflush(stdout);
  report_failures(*result);
  if (result->metrics.completed == 0)
    return fail(std::string("all ") + std::to_string(result->metrics.failed) + " requests to " +
                o.config.base_url + o.config.endpoint + " failed");
  return 0;
}

}  // namespace

CommandRunner add_bench_serve_command(CLI::App& bench) {
  auto o = std::make_shared<ServeBenchOptions>();
  client::BenchConfig& c = o->config;
  if (const char* key = std::getenv("OPENAI_API_KEY")) c.api_key = key;
  CLI::App* cmd = bench.add_subcommand("serve",
                                       "Online serving benchmark of an OpenAI-compatible server "
                                       "(metrics as vLLM's benchmark_serving)");
  cmd->add_option("--base-url", c.base_url, "Server URL, http://HOST[:PORT][/PATH]")
      ->capture_default_str()
      ->check([](const std::string& s) {
        auto url = client::Url::parse(s);
        return url.ok() ? std::string() : url.error().message;
      });
  cmd->add_option("--endpoint", c.endpoint,
                  "OpenAI completions path (.../chat/completions sends chat messages)")
      ->capture_default_str();
  cmd->add_option("--model", c.model,
                  "Model name to request (default: the first of GET /v1/models)");
  CLI::Option* lora_modules =
      cmd->add_option("--lora-modules", c.lora_modules,
                      "Adapter names (as the server lists them) that requests go to in turn: "
                      "request i asks for name i mod N");
  cmd->add_option("--lora-ids", c.lora_ids,
                  "llama-server's form: request i sends \"lora\": [{\"id\": i mod N, \"scale\": "
                  "1}], the adapters given to llama-server with --lora (in order)")
      ->check(CLI::NonNegativeNumber)
      ->excludes(lora_modules);
  cmd->add_option("--num-prompts", c.num_prompts, "Requests to send")
      ->capture_default_str()
      ->check(positive());
  cmd->add_option("--request-rate", o->request_rate,
                  "Requests per second, Poisson arrivals (see --burstiness); inf sends all at once")
      ->capture_default_str()
      ->check([](const std::string& s) {
        auto r = parse_request_rate(s);
        return r.ok() ? std::string() : r.error().message;
      });
  cmd->add_option("--burstiness", c.burstiness,
                  "Gamma shape of the arrival gaps: 1 is Poisson, < 1 burstier, > 1 more regular")
      ->capture_default_str()
      ->check(positive());
  cmd->add_option("--max-concurrency", c.max_concurrency,
                  "Requests in flight at most (default: no limit)")
      ->check(positive());
  auto* input_len = cmd->add_option("--input-len", c.input_len,
                                    "Random prompts of this many common English words (~1 token "
                                    "each for llama vocabularies)")
                        ->capture_default_str()
                        ->check(positive());
  cmd->add_option("--output-len", c.output_len,
                  "Tokens to generate per request (max_tokens; default for --dataset)")
      ->capture_default_str()
      ->check(positive());
  cmd->add_option("--dataset", c.dataset,
                  "JSONL file of {\"prompt\": str, \"output_len\": int} instead of random prompts")
      ->check(CLI::ExistingFile)
      ->excludes(input_len);
  cmd->add_option("--seed", c.seed, "Seed of the random prompts and the arrival times")
      ->capture_default_str();
  cmd->add_flag(
      "--ignore-eos,!--no-ignore-eos", c.ignore_eos,
      "Send \"ignore_eos\": true so that every request generates --output-len tokens (default on)");
  cmd->add_option("--extra-body", c.extra_body,
                  "JSON object whose fields are added to every request (e.g. "
                  "'{\"response_format\": {...}}' to measure structured output)")
      ->check([](const std::string& s) {
        const nlohmann::json j = nlohmann::json::parse(s, nullptr, false);
        return j.is_object() ? std::string() : std::string("--extra-body must be a JSON object");
      });
  cmd->add_option("--api-key", c.api_key,
                  "Sent as \"Authorization: Bearer KEY\" (default: $OPENAI_API_KEY)");
  cmd->add_option("--metric-percentiles", o->percentiles,
                  "Comma-separated percentiles to report, e.g. 50,90,99")
      ->capture_default_str()
      ->check([](const std::string& s) {
        auto p = parse_percentiles(s);
        return p.ok() ? std::string() : p.error().message;
      });
  cmd->add_option("--request-timeout", c.request_timeout_s,
                  "Seconds a request (its whole stream) may take")
      ->capture_default_str()
      ->check(positive());
  auto* json = cmd->add_flag("--json", o->json,
                             "Print the results as one JSON object with vLLM's key names");
  cmd->add_flag("--save-detailed", o->save_detailed,
                "With --json: add per-request input_lens, output_lens, ttfts, itls, "
                "generated_texts, errors")
      ->needs(json);
  return [o] { return run_bench_serve(*o); };
}

}  // namespace vesper::cli
