#include "client/client.h"

#include <sys/resource.h>

#include <algorithm>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/redirect_error.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <deque>
#include <exception>

#include "client/arrivals.h"
#include "client/http_client.h"
#include "client/stream_reader.h"
#include "client/url.h"
#include "core/error_text.h"

namespace vesper::client {
namespace {

namespace asio = boost::asio;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

constexpr auto kModelsTimeout = std::chrono::seconds(30);

ApiKind api_kind(const std::string& endpoint) {
  constexpr std::string_view kChat = "chat/completions";
  return endpoint.size() >= kChat.size() &&
                 endpoint.compare(endpoint.size() - kChat.size(), kChat.size(), kChat) == 0
             ? ApiKind::kChatCompletions
             : ApiKind::kCompletions;
}

// "/v1/completions" and "/v1/chat/completions" -> "/v1/models"; anything else -> "/v1/models".
std::string models_path(const std::string& endpoint) {
  for (std::string_view suffix : {"/chat/completions", "/completions"}) {
    if (endpoint.size() > suffix.size() &&
        endpoint.compare(endpoint.size() - suffix.size(), suffix.size(), suffix) == 0)
      return endpoint.substr(0, endpoint.size() - suffix.size()) + "/models";
  }
  return "/v1/models";
}

std::string request_body(const BenchConfig& c, ApiKind kind, const std::string& model,
                         const BenchRequest& r, int64_t max_tokens) {
  json j = {{"model", r.model.empty() ? model : r.model},
            {"max_tokens", max_tokens},
            {"stream", true},
            {"stream_options", {{"include_usage", true}}},
            {"temperature", 0.0}};
  if (kind == ApiKind::kChatCompletions) {
    j["messages"] = json::array({{{"role", "user"}, {"content", r.prompt}}});
    j["max_completion_tokens"] = max_tokens;
  } else {
    j["prompt"] = r.prompt;
  }
  if (c.ignore_eos) j["ignore_eos"] = true;
  if (r.lora_id >= 0) j["lora"] = json::array({{{"id", r.lora_id}, {"scale", 1.0}}});
  if (!c.extra_body.empty()) j.update(json::parse(c.extra_body));  // checked by the CLI
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

// Many requests in flight need many sockets: lift the soft limit on open files to the hard one.
void raise_open_file_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
}

// The state of one run, shared by the coroutines on the benchmark's one thread.
struct Run {
  Run(asio::any_io_executor ex, const BenchConfig& c, HttpClient& h, ApiKind k,
      std::vector<BenchRequest>& reqs, std::vector<RequestOutput>& outs)
      : executor(std::move(ex)), config(c), http(h), kind(k), requests(reqs), outputs(outs) {}

  asio::any_io_executor executor;
  const BenchConfig& config;
  HttpClient& http;
  ApiKind kind;
  std::string model;
  std::vector<BenchRequest>& requests;
  std::vector<RequestOutput>& outputs;
  Clock::time_point origin{};
  Clock::time_point end{};
  std::deque<size_t> ready;  // arrived, waiting for a concurrency slot
  int64_t in_flight = 0;
  int64_t done = 0;
  int64_t output_tokens = 0;

  double seconds(Clock::time_point t) const {
    return std::chrono::duration<double>(t - origin).count();
  }
  Clock::duration timeout() const {
    constexpr double kMaxTimeout =
        365 * 24 * 3600.0;  // far beyond any run; keeps the cast in range
    return std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(std::min(config.request_timeout_s, kMaxTimeout)));
  }
};

asio::awaitable<RequestOutput> send_request(Run& run, const BenchRequest& request,
                                            int64_t max_tokens) {
  const std::string body = request_body(run.config, run.kind, run.model, request, max_tokens);
  StreamReader reader(run.kind, run.seconds(Clock::now()));
  const HttpClient::OnBody on_body = [&](std::string_view piece) {
    reader.on_body(piece, run.seconds(Clock::now()));
    return !reader.done();
  };
  auto response =
      co_await run.http.post_streaming(run.config.endpoint, body, on_body, run.timeout());
  if (!response.ok())
    reader.on_error(response.error().message);
  else if (response->status / 100 != 2)
    reader.on_error(std::string("HTTP ") + std::to_string(response->status) + ": " +
                    excerpt(response->body));
  else
    reader.on_end(run.seconds(Clock::now()));
  RequestOutput out = reader.take_output();
  if (!out.prompt_len_reported) out.prompt_len = request.prompt_len;
  co_return out;
}

void launch_ready(Run& run);

asio::awaitable<void> run_request(Run& run, size_t i) {
  try {
    run.outputs[i] = co_await send_request(run, run.requests[i], run.requests[i].output_len);
  } catch (const std::exception& e) {
    run.outputs[i] = RequestOutput{};
    run.outputs[i].error = std::string("internal error: ") + e.what();
  }
  --run.in_flight;
  ++run.done;
  if (run.outputs[i].success) run.output_tokens += run.outputs[i].output_tokens;
  if (run.done == static_cast<int64_t>(run.requests.size())) run.end = Clock::now();
  if (run.config.on_progress)
    run.config.on_progress(run.done, static_cast<int64_t>(run.requests.size()), run.output_tokens);
  launch_ready(run);
}

void launch_ready(Run& run) {
  while (!run.ready.empty() &&
         (run.config.max_concurrency <= 0 || run.in_flight < run.config.max_concurrency)) {
    const size_t i = run.ready.front();
    run.ready.pop_front();
    ++run.in_flight;
    asio::co_spawn(run.executor, run_request(run, i), asio::detached);
  }
}

// Finds the model: the configured one, else the first that the server lists.
asio::awaitable<Result<std::string>> find_model(Run& run) {
  const std::string path = models_path(run.config.endpoint);
  const std::string where = "GET " + run.http.url().str(path);
  auto response = co_await run.http.get(path, kModelsTimeout);
  if (!response.ok())
    co_return make_error(where + ": " + response.error().message + " (is the server running?)");
  if (!run.config.model.empty())
    co_return run.config.model;  // the listing is only a reachability check then
  if (response->status != 200)
    co_return make_error(where + ": HTTP " + std::to_string(response->status) + ": " +
                         excerpt(response->body) + "; pass --model");
  const json j = json::parse(response->body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("data") && j["data"].is_array() && !j["data"].empty() &&
      j["data"][0].is_object() && j["data"][0].contains("id") && j["data"][0]["id"].is_string())
    co_return j["data"][0]["id"].get<std::string>();
  co_return make_error(where + ": no model listed in " + excerpt(response->body) +
                       "; pass --model");
}

// Resolves, finds the model, sends the test request, then releases the requests at their arrival
// times.
asio::awaitable<Status> drive(Run& run) {
  auto resolved = co_await run.http.resolve();
  if (!resolved.ok())
    co_return make_error("--base-url " + run.config.base_url + ": " + resolved.error().message);
  auto model = co_await find_model(run);
  if (!model.ok()) co_return model.error();
  run.model = *model;
  if (run.config.test_request) {
    // As vLLM's "initial test run": one short request, so a wrong endpoint, model or protocol stops
    // the benchmark with the server's answer instead of failing every request.
    const RequestOutput test = co_await send_request(run, run.requests.front(), 1);
    if (!test.success)
      co_return make_error("test request to POST " + run.http.url().str(run.config.endpoint) +
                           " (model \"" + run.model + "\") failed: " + test.error);
  }
  const std::vector<double> offsets =
      arrival_offsets(static_cast<int64_t>(run.requests.size()), run.config.request_rate,
                      run.config.burstiness, run.config.seed);
  run.origin = Clock::now();
  if (run.config.on_progress)
    run.config.on_progress(0, static_cast<int64_t>(run.requests.size()), 0);
  asio::steady_timer timer(run.executor);
  for (size_t i = 0; i < run.requests.size(); ++i) {
    const auto at = run.origin + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(offsets[i]));
    if (at > Clock::now()) {
      timer.expires_at(at);
      boost::system::error_code ec;
      co_await timer.async_wait(asio::redirect_error(asio::use_awaitable, ec));
    }
    run.ready.push_back(i);
    launch_ready(run);
  }
  co_return Status();
}

// "99", "99.9": how vLLM writes a percentile in its keys and labels.
std::string percentile_word(double p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", p);
  return buf;
}

// `before` + percentile_word(p) + `after`, built by appending (GCC 12 gives a false -Wrestrict
// warning for a short literal + a temporary string).
std::string with_percentile(std::string before, double p, std::string_view after) {
  before += percentile_word(p);
  before += after;
  return before;
}

}  // namespace

Status validate(const BenchConfig& c) {
  if (auto url = Url::parse(c.base_url); !url.ok())
    return make_error("--base-url " + url.error().message);
  if (c.endpoint.empty() || c.endpoint.front() != '/')
    return make_error("--endpoint \"" + c.endpoint +
                      "\": a path starting with '/', e.g. /v1/completions");
  if (c.num_prompts < 1) return make_error("--num-prompts must be at least 1");
  if (!(c.request_rate > 0)) return make_error("--request-rate must be > 0 (or inf)");
  if (!(c.burstiness > 0) || std::isinf(c.burstiness))
    return make_error("--burstiness must be a finite number > 0");
  if (c.max_concurrency < 0)
    return make_error("--max-concurrency must be >= 1 (or absent for no limit)");
  if (c.requests.empty() && c.dataset.empty() && c.input_len < 1)
    return make_error("--input-len must be at least 1");
  if (c.output_len < 1) return make_error("--output-len must be at least 1");
  if (!(c.request_timeout_s > 0)) return make_error("--request-timeout must be > 0 seconds");
  for (double p : c.percentiles)
    if (!(p >= 0 && p <= 100))
      return make_error(std::string("--metric-percentiles: ") + percentile_word(p) +
                        " is not in [0, 100]");
  return Status();
}

Result<BenchResult> run_benchmark(const BenchConfig& config) {
  VESPER_TRY(validate(config));
  VESPER_ASSIGN_OR_RETURN(Url url, Url::parse(config.base_url));
  BenchResult result;
  result.config = config;
  result.config.requests.clear();
  if (!config.requests.empty()) {
    result.requests = config.requests;
  } else if (!config.dataset.empty()) {
    VESPER_ASSIGN_OR_RETURN(result.requests,
                            load_dataset(config.dataset, config.num_prompts, config.output_len));
  } else {
    result.requests =
        random_requests(config.num_prompts, config.input_len, config.output_len, config.seed);
  }
  if (!config.lora_modules.empty())
    for (size_t i = 0; i < result.requests.size(); ++i)
      result.requests[i].model = config.lora_modules[i % config.lora_modules.size()];
  if (config.lora_ids > 0)
    for (size_t i = 0; i < result.requests.size(); ++i)
      result.requests[i].lora_id = static_cast<int64_t>(i) % config.lora_ids;
  result.outputs.resize(result.requests.size());
  const ApiKind kind = api_kind(config.endpoint);
  result.backend = kind == ApiKind::kChatCompletions ? "openai-chat" : "openai";
  raise_open_file_limit();

  asio::io_context io(1);
  HttpClient http(io.get_executor(), url, config.api_key);
  Run run(io.get_executor(), config, http, kind, result.requests, result.outputs);
  Status status = make_error("the benchmark did not start");
  asio::co_spawn(io, drive(run), [&](std::exception_ptr e, Status s) {
    if (e) {
      try {
        std::rethrow_exception(e);
      } catch (const std::exception& ex) {
        s = make_error(std::string("internal error: ") + ex.what());
      }
    }
    status = std::move(s);
  });
  io.run();
  if (!status.ok()) return status.error();
  result.model = run.model;
  result.config.model = run.model;
  result.config.num_prompts = static_cast<int64_t>(result.requests.size());
  const double duration = std::chrono::duration<double>(run.end - run.origin).count();
  result.metrics = calculate_metrics(result.outputs, duration, config.percentiles);
  return result;
}

json to_json(const BenchResult& r, bool detailed) {
  const BenchConfig& c = r.config;
  const BenchMetrics& m = r.metrics;
  char date[32];
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  std::strftime(date, sizeof date, "%Y%m%d-%H%M%S", &tm);
  json j = {{"date", date},
            {"backend", r.backend},
            {"model_id", r.model},
            {"base_url", c.base_url},
            {"endpoint", c.endpoint},
            {"num_prompts", c.num_prompts},
            {"burstiness", c.burstiness},
            {"max_concurrency", nullptr},
            {"duration", m.duration_s},
            {"completed", m.completed},
            {"failed", m.failed},
            {"total_input_tokens", m.total_input},
            {"total_output_tokens", m.total_output},
            {"request_throughput", m.request_throughput},
            {"output_throughput", m.output_throughput},
            {"total_token_throughput", m.total_token_throughput}};
  if (std::isinf(c.request_rate))
    j["request_rate"] = "inf";
  else
    j["request_rate"] = c.request_rate;
  if (c.max_concurrency > 0) j["max_concurrency"] = c.max_concurrency;
  bool estimated = false;
  for (const RequestOutput& o : r.outputs)
    estimated = estimated || (o.success && !o.prompt_len_reported);
  j["input_tokens_estimated"] = estimated;
  const std::pair<const char*, const Distribution*> metrics[] = {
      {"ttft", &m.ttft_ms}, {"tpot", &m.tpot_ms}, {"itl", &m.itl_ms}, {"e2el", &m.e2el_ms}};
  for (const auto& [name, d] : metrics) {
    const std::string suffix = std::string("_") + name + "_ms";
    j["mean" + suffix] = d->mean;
    j["median" + suffix] = d->median;
    j["std" + suffix] = d->std;
    for (const auto& [p, v] : d->percentiles) j[with_percentile("p", p, suffix)] = v;
  }
  if (detailed) {
    json input_lens = json::array(), output_lens = json::array(), ttfts = json::array(),
         itls = json::array(), texts = json::array(), errors = json::array();
    for (const RequestOutput& o : r.outputs) {
      input_lens.push_back(o.prompt_len);
      output_lens.push_back(o.success ? o.output_tokens : 0);
      ttfts.push_back(o.ttft_s);
      itls.push_back(o.itl_s);
      texts.push_back(o.generated_text);
      errors.push_back(o.error);
    }
    j["input_lens"] = std::move(input_lens);
    j["output_lens"] = std::move(output_lens);
    j["ttfts"] = std::move(ttfts);
    j["itls"] = std::move(itls);
    j["generated_texts"] = std::move(texts);
    j["errors"] = std::move(errors);
  }
  return j;
}

namespace {

// Python's "{s:{c}^{n}}".format(...): `s` centred in `width` columns of `fill`.
std::string centered(const std::string& s, size_t width, char fill) {
  if (s.size() >= width) return s;
  const size_t pad = width - s.size();
  return std::string(pad / 2, fill) + s + std::string(pad - pad / 2, fill);
}

void line(std::string& out, const std::string& label, const std::string& value) {
  char buf[128];
  std::snprintf(buf, sizeof buf, "%-40s %s\n", label.c_str(), value.c_str());
  out += buf;
}

std::string fixed2(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", v);
  return buf;
}

}  // namespace

std::string format_report(const BenchResult& r) {
  const BenchMetrics& m = r.metrics;
  const BenchConfig& c = r.config;
  std::string out = centered(" Serving Benchmark Result ", 50, '=') + "\n";
  line(out, "Successful requests:", std::to_string(m.completed));
  line(out, "Failed requests:", std::to_string(m.failed));
  if (c.max_concurrency > 0)
    line(out, "Maximum request concurrency:", std::to_string(c.max_concurrency));
  if (!std::isinf(c.request_rate))
    line(out, "Request rate configured (RPS):", fixed2(c.request_rate));
  line(out, "Benchmark duration (s):", fixed2(m.duration_s));
  line(out, "Total input tokens:", std::to_string(m.total_input));
  line(out, "Total generated tokens:", std::to_string(m.total_output));
  line(out, "Request throughput (req/s):", fixed2(m.request_throughput));
  line(out, "Output token throughput (tok/s):", fixed2(m.output_throughput));
  line(out, "Total Token throughput (tok/s):", fixed2(m.total_token_throughput));
  struct Section {
    const char* header;
    const char* name;
    const Distribution* d;
  };
  const Section sections[] = {{"Time to First Token", "TTFT", &m.ttft_ms},
                              {"Time per Output Token (excl. 1st token)", "TPOT", &m.tpot_ms},
                              {"Inter-token Latency", "ITL", &m.itl_ms},
                              {"End-to-end Latency", "E2EL", &m.e2el_ms}};
  for (const Section& s : sections) {
    out += centered(s.header, 50, '-') + "\n";
    line(out, std::string("Mean ") + s.name + " (ms):", fixed2(s.d->mean));
    line(out, std::string("Median ") + s.name + " (ms):", fixed2(s.d->median));
    for (const auto& [p, v] : s.d->percentiles)
      line(out, with_percentile("P", p, std::string(" ") + s.name + " (ms):"), fixed2(v));
  }
  out += std::string(50, '=') + "\n";
  return out;
}

}  // namespace vesper::client
