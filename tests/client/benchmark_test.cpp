// run_benchmark against an in-process fake OpenAI server on 127.0.0.1: the request it sends, SSE
// over chunked HTTP, concurrency (unlimited and capped), keep-alive reuse, failed requests, and
// the errors that stop a run before it starts.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "client/client.h"

namespace vesper::client {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using asio::ip::tcp;
using nlohmann::json;

// A blocking HTTP/1.1 server, one thread per connection, speaking just enough of the OpenAI API:
// GET /v1/models and streaming POST /v1/completions (one SSE chunk per token, a usage chunk,
// [DONE]).
class FakeOpenAiServer {
 public:
  struct Options {
    int hold_until_arrived = 0;  // hold the first N generating requests until N have arrived
    bool close_after_response =
        false;  // close each connection after one response, without saying so
  };

  explicit FakeOpenAiServer(Options options)
      : options_(options), acceptor_(io_, {asio::ip::make_address("127.0.0.1"), 0}) {
    port_ = acceptor_.local_endpoint().port();
    accept_thread_ = std::thread([this] { accept_loop(); });
  }

  ~FakeOpenAiServer() {
    stop_ = true;
    {
      std::lock_guard lock(mu_);
      cv_.notify_all();
    }
    boost::system::error_code ec;
    tcp::socket wake(io_);
    wake.connect({asio::ip::make_address("127.0.0.1"), port_}, ec);
    accept_thread_.join();
    for (auto& t : connection_threads_) t.join();
  }

  std::string url() const { return std::string("http://127.0.0.1:") + std::to_string(port_); }
  int max_in_flight() const { return max_in_flight_; }
  int connections() const { return connections_; }
  json last_body() {
    std::lock_guard lock(mu_);
    return last_body_;
  }

 private:
  void accept_loop() {
    for (;;) {
      tcp::socket socket(io_);
      boost::system::error_code ec;
      acceptor_.accept(socket, ec);
      if (stop_ || ec) return;
      socket.set_option(tcp::no_delay(true), ec);  // as real servers: each SSE chunk leaves at once
      ++connections_;
      connection_threads_.emplace_back(
          [this, s = std::move(socket)]() mutable { serve(std::move(s)); });
    }
  }

  void serve(tcp::socket socket) {
    beast::flat_buffer buffer;
    for (;;) {
      http::request<http::string_body> req;
      boost::system::error_code ec;
      http::read(socket, buffer, req, ec);
      if (ec) return;
      if (req.method() == http::verb::get && req.target() == "/v1/models") {
        respond(socket, req, 200,
                R"({"object":"list","data":[{"id":"fake-model","object":"model"}]})");
      } else if (req.method() == http::verb::post && req.target() == "/v1/completions") {
        complete(socket, req);
      } else {
        respond(socket, req, 404, R"({"error":{"message":"not found"}})");
      }
      if (!req.keep_alive() || options_.close_after_response) return;
    }
  }

  void respond(tcp::socket& socket, const http::request<http::string_body>& req, int status,
               std::string body) {
    http::response<http::string_body> res{static_cast<http::status>(status), 11};
    res.set(http::field::content_type, "application/json");
    res.keep_alive(req.keep_alive());
    res.body() = std::move(body);
    res.prepare_payload();
    boost::system::error_code ec;
    http::write(socket, res, ec);
  }

  void complete(tcp::socket& socket, const http::request<http::string_body>& req) {
    const json body = json::parse(req.body());
    {
      std::lock_guard lock(mu_);
      last_body_ = body;
    }
    const std::string prompt = body.value("prompt", "");
    if (prompt.find("FAIL") != std::string::npos) {
      respond(socket, req, 500, R"({"error":{"message":"asked to fail"}})");
      return;
    }
    const int max_tokens = body.value("max_tokens", 16);
    const int now = ++in_flight_;
    for (int m = max_in_flight_; now > m && !max_in_flight_.compare_exchange_weak(m, now);) {
    }
    if (max_tokens > 1 && options_.hold_until_arrived > 0) {
      std::unique_lock lock(mu_);
      if (++arrived_ <= options_.hold_until_arrived) {
        cv_.notify_all();
        cv_.wait_for(lock, std::chrono::seconds(10),
                     [&] { return stop_ || arrived_ >= options_.hold_until_arrived; });
      }
    }
    http::response<http::empty_body> res{http::status::ok, 11};
    res.set(http::field::content_type, "text/event-stream");
    res.keep_alive(req.keep_alive());
    res.chunked(true);
    http::response_serializer<http::empty_body> sr{res};
    boost::system::error_code ec;
    http::write_header(socket, sr, ec);
    auto send = [&](const std::string& event) {
      if (!ec) asio::write(socket, http::make_chunk(asio::buffer(event)), ec);
    };
    for (int i = 0; i < max_tokens; ++i)
      send(
          "data: " +
          json{{"choices", {{{"index", 0}, {"text", " tok"}, {"finish_reason", nullptr}}}}}.dump() +
          "\n\n");
    send("data: " +
         json{{"choices", json::array()},
              {"usage", {{"prompt_tokens", 11}, {"completion_tokens", max_tokens}}}}
             .dump() +
         "\n\n");
    send("data: [DONE]\n\n");
    if (!ec) asio::write(socket, http::make_chunk_last(), ec);
    --in_flight_;
  }

  Options options_;
  asio::io_context io_;
  tcp::acceptor acceptor_;
  unsigned short port_ = 0;
  std::thread accept_thread_;
  std::vector<std::thread> connection_threads_;
  std::atomic<bool> stop_{false};
  std::atomic<int> in_flight_{0};
  std::atomic<int> max_in_flight_{0};
  std::atomic<int> connections_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  int arrived_ = 0;
  json last_body_;
};

BenchConfig config_for(const FakeOpenAiServer& server, int64_t n) {
  BenchConfig c;
  c.base_url = server.url();
  c.num_prompts = n;
  c.input_len = 16;
  c.output_len = 8;
  c.seed = 1;
  c.percentiles = {50, 99};
  return c;
}

TEST(RunBenchmark, SendsVllmStyleStreamingRequestsAndMeasuresThem) {
  FakeOpenAiServer server({});
  BenchConfig c = config_for(server, 12);
  c.request_rate = 200;  // Poisson arrivals, short
  int64_t progress_calls = 0;
  c.on_progress = [&](int64_t done, int64_t total, int64_t) {
    EXPECT_EQ(total, 12);
    EXPECT_EQ(done, progress_calls);  // 0 at the start, then one call per request
    ++progress_calls;
  };
  auto r = run_benchmark(c);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->model, "fake-model");  // from GET /v1/models
  EXPECT_EQ(progress_calls, 13);
  const BenchMetrics& m = r->metrics;
  EXPECT_EQ(m.completed, 12);
  EXPECT_EQ(m.failed, 0);
  EXPECT_EQ(m.total_output, 12 * 8);
  EXPECT_EQ(m.total_input, 12 * 11);  // the server's usage.prompt_tokens, not the word estimate
  EXPECT_GT(m.duration_s, 0);
  EXPECT_NEAR(m.request_throughput, 12 / m.duration_s, 1e-9);
  for (const RequestOutput& o : r->outputs) {
    EXPECT_TRUE(o.success) << o.error;
    EXPECT_EQ(o.itl_s.size(), 7u);
    EXPECT_GT(o.ttft_s, 0);
    EXPECT_GE(o.latency_s, o.ttft_s);
    EXPECT_EQ(o.generated_text, std::string(" tok tok tok tok tok tok tok tok"));
  }
  const json body = server.last_body();
  EXPECT_EQ(body["model"], "fake-model");
  EXPECT_EQ(body["max_tokens"], 8);
  EXPECT_EQ(body["stream"], true);
  EXPECT_EQ(body["stream_options"]["include_usage"], true);
  EXPECT_EQ(body["temperature"], 0.0);
  EXPECT_EQ(body["ignore_eos"], true);
  EXPECT_TRUE(body["prompt"].is_string());

  const json j = to_json(*r);
  for (const char* key :
       {"completed", "failed", "duration", "request_throughput", "output_throughput",
        "total_token_throughput", "total_input_tokens", "total_output_tokens", "mean_ttft_ms",
        "median_ttft_ms", "p99_ttft_ms", "p50_ttft_ms", "std_ttft_ms", "mean_tpot_ms",
        "p99_tpot_ms", "mean_itl_ms", "p99_itl_ms", "mean_e2el_ms", "p99_e2el_ms"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_EQ(j["completed"], 12);
  EXPECT_EQ(j["request_rate"], 200.0);
  EXPECT_FALSE(j.contains("ttfts"));
  EXPECT_EQ(to_json(*r, true)["itls"].size(), 12u);
  EXPECT_NE(format_report(*r).find("Successful requests:                     12"),
            std::string::npos)
      << format_report(*r);
}

TEST(RunBenchmark, InfiniteRateSendsAllRequestsAtOnce) {
  FakeOpenAiServer server({.hold_until_arrived = 8});
  BenchConfig c = config_for(server, 8);
  auto r = run_benchmark(c);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->metrics.completed, 8);
  EXPECT_EQ(server.max_in_flight(), 8);
  EXPECT_EQ(to_json(*r)["request_rate"], "inf");
}

TEST(RunBenchmark, MaxConcurrencyCapsRequestsInFlight) {
  FakeOpenAiServer server({.hold_until_arrived = 3});
  BenchConfig c = config_for(server, 10);
  c.max_concurrency = 3;
  auto r = run_benchmark(c);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->metrics.completed, 10);
  EXPECT_EQ(server.max_in_flight(), 3);
}

TEST(RunBenchmark, ReusesKeptAliveConnections) {
  FakeOpenAiServer server({});
  BenchConfig c = config_for(server, 10);
  c.max_concurrency = 1;
  auto r = run_benchmark(c);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->metrics.completed, 10);
  EXPECT_EQ(server.connections(), 1);  // models, test request and all 10 on one connection
}

TEST(RunBenchmark, RetriesWhenTheServerClosedAnIdleConnection) {
  FakeOpenAiServer server({.close_after_response = true});
  BenchConfig c = config_for(server, 6);
  c.max_concurrency = 1;
  auto r = run_benchmark(c);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->metrics.completed, 6);
  EXPECT_EQ(r->metrics.failed, 0);
}

TEST(RunBenchmark, FailedRequestsAreCountedNotFatal) {
  FakeOpenAiServer server({});
  BenchConfig c = config_for(server, 4);
  c.requests = {
      {"good one", 2, 4}, {"FAIL please", 2, 4}, {"good two", 2, 4}, {"FAIL again", 2, 4}};
  auto r = run_benchmark(c);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->metrics.completed, 2);
  EXPECT_EQ(r->metrics.failed, 2);
  EXPECT_EQ(r->metrics.total_output, 8);
  EXPECT_FALSE(r->outputs[1].success);
  EXPECT_NE(r->outputs[1].error.find("HTTP 500"), std::string::npos) << r->outputs[1].error;
  EXPECT_NE(r->outputs[1].error.find("asked to fail"), std::string::npos) << r->outputs[1].error;
}

TEST(RunBenchmark, FailingTestRequestStopsTheRunWithTheServersAnswer) {
  FakeOpenAiServer server({});
  BenchConfig c = config_for(server, 4);
  c.endpoint = "/v1/nothing";
  auto r = run_benchmark(c);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find(server.url() + "/v1/nothing"), std::string::npos)
      << r.error().message;
  EXPECT_NE(r.error().message.find("HTTP 404"), std::string::npos) << r.error().message;
}

TEST(RunBenchmark, UnreachableServerIsAnErrorNamingTheUrl) {
  unsigned short port = 0;
  {
    asio::io_context io;
    tcp::acceptor a(io, {asio::ip::make_address("127.0.0.1"), 0});
    port = a.local_endpoint().port();
  }  // closed: nothing listens there now
  BenchConfig c;
  c.base_url = std::string("http://127.0.0.1:") + std::to_string(port);
  c.num_prompts = 2;
  auto r = run_benchmark(c);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find(c.base_url + "/v1/models"), std::string::npos)
      << r.error().message;
  EXPECT_NE(r.error().message.find("connect"), std::string::npos) << r.error().message;
}

TEST(RunBenchmark, BadSettingsNameTheirFlag) {
  BenchConfig c;
  c.base_url = "localhost:8000";
  EXPECT_NE(run_benchmark(c).error().message.find("--base-url"), std::string::npos);
  c = BenchConfig{};
  c.request_rate = 0;
  EXPECT_NE(run_benchmark(c).error().message.find("--request-rate"), std::string::npos);
  c = BenchConfig{};
  c.num_prompts = 0;
  EXPECT_NE(run_benchmark(c).error().message.find("--num-prompts"), std::string::npos);
  c = BenchConfig{};
  c.endpoint = "v1/completions";
  EXPECT_NE(run_benchmark(c).error().message.find("--endpoint"), std::string::npos);
}

}  // namespace
}  // namespace vesper::client
