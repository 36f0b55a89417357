#include "server/http_server.h"

#include <algorithm>
#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <deque>
#include <mutex>
#include <thread>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include "core/logging.h"
#include "server/weak_list.h"

namespace vesper::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

namespace {

// Idle keep-alive connections and slow request uploads are closed after this long.
constexpr auto kReadTimeout = std::chrono::seconds(120);
// After a client ends its sending side with a response pending: how soon the first probe's
// answer is checked, and how often it is probed again (see Session::probe_peer).
constexpr auto kFirstProbeCheck = std::chrono::milliseconds(100);
constexpr auto kProbeInterval = std::chrono::seconds(1);
// After the engine drained on SIGTERM: how long connections get to deliver their last responses
// and close before the process exits regardless (it exits within --shutdown-timeout and this).
constexpr auto kCloseWait = std::chrono::seconds(2);
// Under a launcher that kills the process on its own schedule (mpirun's kill sequence): how long
// before that kill the requests still in flight are answered with a 503, so that each client
// gets an answer instead of a cut connection.
constexpr double kAnswerBeforeKill = 0.4;

const char* reason_phrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 411:
      return "Length Required";
    case 413:
      return "Payload Too Large";
    case 415:
      return "Unsupported Media Type";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 503:
      return "Service Unavailable";
    default:
      return "Unknown";
  }
}

std::string error_body(const std::string& message, const std::string& type) {
  nlohmann::json j = {
      {"error", {{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}}}};
  return j.dump();
}

// How long an overloaded or stopping server asks clients to wait before retrying (a 503's
// Retry-After).
constexpr int kRetryAfterSeconds = 1;

std::chrono::milliseconds seconds(double s) {
  return std::chrono::milliseconds(static_cast<int64_t>(s * 1000));
}

std::string format_seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", s);
  return buf;
}

struct Counters {
  std::atomic<int64_t> pending_responses{0};
  std::atomic<int64_t> connections{0};
  std::atomic<bool> shutting_down{false};  // SIGTERM: no connection is kept alive
};

class Session : public ResponseSink, public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, OpenAiService& service, const ServerConfig& config,
          const CorsPolicy& cors, Counters& counters)
      : stream_(std::move(socket)),
        service_(service),
        config_(config),
        cors_(cors),
        counters_(counters) {
    counters_.connections.fetch_add(1);
  }
  ~Session() override { counters_.connections.fetch_sub(1); }

  void start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read_request(); });
  }
  void notify_shutdown() {
    net::post(stream_.get_executor(), [self = shared_from_this()] { self->on_server_shutdown(); });
  }

  // ResponseSink: every call hops onto the connection's strand.
  void send(int status, std::string content_type, std::string body) override {
    net::post(stream_.get_executor(),
              [self = shared_from_this(), status, ct = std::move(content_type),
               b = std::move(body)]() mutable { self->do_send(status, ct, std::move(b)); });
  }
  void start_stream() override {
    net::post(stream_.get_executor(), [self = shared_from_this()] { self->do_start_stream(); });
  }
  void send_event(std::string data) override {
    net::post(stream_.get_executor(), [self = shared_from_this(), d = std::move(data)]() mutable {
      self->do_event(std::move(d));
    });
  }
  void end_stream() override {
    net::post(stream_.get_executor(), [self = shared_from_this()] { self->do_end_stream(); });
  }
  void post(std::function<void()> work) override {
    net::post(stream_.get_executor(), [self = shared_from_this(), w = std::move(work)] { w(); });
  }
  void on_disconnect(std::function<void()> callback) override {
    std::lock_guard<std::mutex> lock(disconnect_mutex_);
    on_disconnect_ = std::move(callback);
  }

 private:
  // A request is read in three phases, each under its own deadline: the first byte (an idle
  // kept-alive connection waits --timeout-keep-alive for it, then closes), the head (line and
  // headers within --timeout-request-header of the first byte, else 408) and the body
  // (kReadTimeout).
  void read_request() {
    if (closed_) return;
    response_started_ = false;
    parser_.emplace();
    parser_->body_limit(config_.max_body_bytes);
    parser_->header_limit(kMaxHeaderBytes);
    if (buffer_.size() > 0) return read_head();  // a pipelined request is here already
    // Shutting down: a connection with no request sent closes now rather than wait for one it
    // would refuse.
    beast::error_code avail_ec;
    if (counters_.shutting_down.load() && stream_.socket().available(avail_ec) == 0) return drain();
    stream_.expires_after(seconds(config_.keep_alive_timeout_s));
    stream_.async_read_some(buffer_.prepare(4096),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              self->stream_.expires_never();
                              if (ec == net::error::operation_aborted && !self->closed_ &&
                                  self->counters_.shutting_down.load())
                                return self->drain();
                              if (ec || self->closed_) return self->close();  // timed out or closed
                              self->buffer_.commit(n);
                              self->read_head();
                            });
  }

  // SIGTERM: a connection with a response pending finishes it (keep-alive ends); any other
  // closes now: an idle one (read_request's handler drains it), and one whose request is still
  // arriving (it would be refused; a client sending its headers slowly must not hold up the exit).
  void on_server_shutdown() {
    if (response_pending_ || closed_) return;
    head_timer_.cancel();
    stream_.cancel();
  }

  void read_head() {
    // A timer of its own rather than the stream's expiry, which would close the socket before
    // the 408 is written.
    head_timed_out_ = false;
    head_timer_.expires_after(seconds(config_.header_timeout_s));
    head_timer_.async_wait(net::bind_executor(stream_.get_executor(),
                                              [self = shared_from_this()](beast::error_code ec) {
                                                if (ec) return;
                                                self->head_timed_out_ = true;
                                                self->stream_.cancel();
                                              }));
    http::async_read_header(stream_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              self->head_timer_.cancel();
                              if (self->head_timed_out_) ec = beast::error::timeout;
                              if (ec) return self->on_read(ec, /*in_head=*/true);
                              self->on_head();
                            });
  }

  void on_head() {
    const auto& req = parser_->get();
    origin_ = std::string(req[http::field::origin]);
    // A POST says how long its body is (Content-Length or chunked): without either, the body's
    // end could only be its connection's end.
    if (req.method() == http::verb::post && !req.has_content_length() && !req.chunked())
      return refuse(411, "A POST request needs a Content-Length header (or chunked encoding)");
    if (CorsPolicy::is_preflight(std::string(req.method_string()), origin_,
                                 std::string(req[http::field::access_control_request_method])))
      return answer_preflight();
    if (parser_->is_done()) return on_read({}, false);
    stream_.expires_after(kReadTimeout);
    http::async_read(stream_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) {
                       self->stream_.expires_never();
                       self->on_read(ec, /*in_head=*/false);
                     });
  }

  void answer_preflight() {
    const auto& req = parser_->get();
    keep_alive_ = req.keep_alive() && !counters_.shutting_down.load();
    http11_ = req.version() >= 11;
    const CorsPolicy::Preflight p =
        cors_.preflight(origin_, std::string(req[http::field::access_control_request_method]),
                        std::string(req[http::field::access_control_request_headers]));
    counters_.pending_responses.fetch_add(1);
    response_pending_ = true;
    head_only_ = false;
    if (!parser_->is_done()) drain_before_close_ = true, keep_alive_ = false;
    preflight_headers_ = p.headers;
    do_send(p.status, "text/plain; charset=utf-8", p.status == 200 ? "OK" : p.refusal);
  }

  // Answers an error before the request reaches the service, then closes (the rest of the
  // request, unread, is drained first so that the answer is not lost to a reset).
  void refuse(int status, const std::string& message) {
    keep_alive_ = false;
    counters_.pending_responses.fetch_add(1);
    response_pending_ = true;
    drain_before_close_ = true;
    do_send(status, "application/json", error_body(message, "invalid_request_error"));
  }

  void on_read(beast::error_code ec, bool in_head) {
    if (ec == beast::error::timeout)
      return refuse(408, in_head ? "The request's headers did not arrive within " +
                                       format_seconds(config_.header_timeout_s) +
                                       " s (--timeout-request-header)"
                                 : "The request's body did not arrive within " +
                                       std::to_string(kReadTimeout.count()) + " s");
    if (ec == http::error::end_of_stream || ec == net::error::eof ||
        ec == net::error::operation_aborted || ec == net::error::connection_reset) {
      return close();
    }
    if (ec) {
      // Malformed HTTP, or limits exceeded: answer, then close (the stream is out of sync).
      if (ec == http::error::body_limit)
        return refuse(413, "The request body is larger than the limit of " +
                               std::to_string(config_.max_body_bytes) +
                               " bytes (--max-request-body)");
      if (ec == http::error::header_limit) return refuse(431, "The request headers are too large");
      return refuse(400, "Malformed HTTP request: " + ec.message());
    }
    auto& req = parser_->get();
    keep_alive_ = req.keep_alive() && !counters_.shutting_down.load();
    http11_ = req.version() >= 11;
    HttpRequest r;
    r.method = std::string(req.method_string());
    r.target = std::string(req.target());
    r.content_type = std::string(req[http::field::content_type]);
    r.authorization = std::string(req[http::field::authorization]);
    r.body = std::move(req.body());
    counters_.pending_responses.fetch_add(1);
    response_pending_ = true;
    head_only_ = r.method == "HEAD";
    watch_for_disconnect();
    // The service catches what its handlers throw; this is the connection's own last line, so
    // that nothing a request does can end the process or leave its client without an answer.
    try {
      service_.handle(std::move(r), shared_from_this());
    } catch (const std::exception& e) {
      log_error("internal error while handling a request: %s", e.what());
      do_send(
          500, "application/json",
          error_body(std::string("Internal server error: ") + e.what(), "internal_server_error"));
    } catch (...) {
      log_error("internal error while handling a request");
      do_send(500, "application/json",
              error_body("Internal server error", "internal_server_error"));
    }
  }

  // While a response is pending, a readable socket with nothing to read means the peer ended its
  // sending side: it went away, or it only half-closed (shutdown(SHUT_WR), as `nc -N` does) and
  // still reads the answer. probe_peer() tells the two apart.
  void watch_for_disconnect() {
    stream_.socket().async_wait(
        tcp::socket::wait_read,
        net::bind_executor(
            stream_.get_executor(), [self = shared_from_this()](beast::error_code ec) {
              if (!self->response_pending_ || self->closed_) return;
              if (ec == net::error::operation_aborted) return;
              beast::error_code avail_ec;
              const size_t available = self->stream_.socket().available(avail_ec);
              if (ec || avail_ec) return self->client_gone();
              if (available > 0)
                return;  // a pipelined request: it stays in the socket for the next read
              self->probe_peer();
            }));
  }

  // Only a write tells a half-closed client from one that closed its socket: the peer's kernel
  // answers data for a closed socket with a reset. So while the response is pending, a probe that
  // readers ignore is written now and then (an interim "100 Continue" before an HTTP/1.1
  // response starts, an SSE comment inside a stream) and the connection is checked for a reset.
  void probe_peer() {
    if (closed_ || !response_pending_) return;
    if (peer_reset()) return client_gone();
    if (streaming_) {
      queue_write(chunk(":\n\n"));
    } else if (!response_started_) {
      // HTTP/1.0 has no interim responses: such a client cannot be probed, and is taken at its
      // word.
      if (!http11_) return client_gone();
      queue_write("HTTP/1.1 100 Continue\r\n\r\n");
    }
    // A response being written is its own probe: a reset fails the write (on_write).
    probe_timer_.expires_after(
        probes_sent_++ == 0
            ? std::chrono::duration_cast<std::chrono::milliseconds>(kFirstProbeCheck)
            : std::chrono::duration_cast<std::chrono::milliseconds>(kProbeInterval));
    probe_timer_.async_wait(net::bind_executor(stream_.get_executor(),
                                               [self = shared_from_this()](beast::error_code ec) {
                                                 if (ec) return;
                                                 self->probe_peer();
                                               }));
  }

  // True when the peer reset the connection (TCP state CLOSE; a half-closed peer leaves it in
  // CLOSE_WAIT).
  bool peer_reset() {
    tcp_info info{};
    socklen_t len = sizeof(info);
    if (getsockopt(stream_.socket().native_handle(), IPPROTO_TCP, TCP_INFO, &info, &len) != 0)
      return true;
    return info.tcpi_state == TCP_CLOSE;
  }

  void client_gone() {
    std::function<void()> cb;
    {
      std::lock_guard<std::mutex> lock(disconnect_mutex_);
      cb = std::move(on_disconnect_);
      on_disconnect_ = nullptr;
    }
    if (cb) cb();
    close();
  }

  void do_send(int status, const std::string& content_type, std::string body) {
    if (closed_ || !response_pending_) return;
    if (streaming_) {
      // The stream's head is out: the error ends the stream as an event.
      do_event(std::move(body));
      return do_end_stream();
    }
    if (response_started_) return;
    response_started_ = true;
    std::string head = "HTTP/1.1 " + std::to_string(status) + " " + reason_phrase(status) + "\r\n";
    head += "Content-Type: " + content_type + "\r\n";
    head += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    if (status == 503) head += "Retry-After: " + std::to_string(kRetryAfterSeconds) + "\r\n";
    head += common_headers();
    head += "\r\n";
    if (!head_only_) head += body;
    finish_response_after_write_ = true;
    queue_write(std::move(head));
  }

  void do_start_stream() {
    if (closed_ || !response_pending_ || response_started_) return;
    response_started_ = true;
    streaming_ = true;
    queue_write(
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
        "Transfer-Encoding: chunked\r\n" +
        common_headers() + "\r\n");
  }

  // Connection and CORS headers. A response that starts once shutdown began ends its connection.
  std::string common_headers() {
    if (counters_.shutting_down.load()) keep_alive_ = false;
    std::string h = keep_alive_ ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
    if (!preflight_headers_.empty())
      h += std::exchange(preflight_headers_, std::string());
    else
      h += cors_.response_headers(origin_);
    return h;
  }

  static std::string chunk(const std::string& payload) {
    char len[32];
    std::snprintf(len, sizeof(len), "%zx\r\n", payload.size());
    return len + payload + "\r\n";
  }

  void do_event(std::string data) {
    if (closed_ || !streaming_) return;
    queue_write(chunk("data: " + data + "\n\n"));
  }

  void do_end_stream() {
    if (closed_ || !streaming_) return;
    streaming_ = false;
    finish_response_after_write_ = true;
    queue_write(chunk("data: [DONE]\n\n") + "0\r\n\r\n");
  }

  void queue_write(std::string bytes) {
    writes_.push_back(std::move(bytes));
    if (writes_.size() == 1) write_next();
  }

  void write_next() {
    net::async_write(stream_.socket(), net::buffer(writes_.front()),
                     net::bind_executor(stream_.get_executor(),
                                        [self = shared_from_this()](beast::error_code ec, size_t) {
                                          self->on_write(ec);
                                        }));
  }

  void on_write(beast::error_code ec) {
    if (ec) return client_gone();
    writes_.pop_front();
    if (!writes_.empty()) return write_next();
    if (finish_response_after_write_) {
      finish_response_after_write_ = false;
      end_response();
    }
  }

  void end_response() {
    if (response_pending_) {
      response_pending_ = false;
      counters_.pending_responses.fetch_sub(1);
    }
    probe_timer_.cancel();
    probes_sent_ = 0;
    {
      std::lock_guard<std::mutex> lock(disconnect_mutex_);
      on_disconnect_ = nullptr;  // breaks the job <-> session cycle
    }
    beast::error_code ignored;
    stream_.socket().cancel(ignored);  // ends the disconnect watch
    if (drain_before_close_) return drain();
    if (!keep_alive_) return close();
    // After shutdown began, a response that began with keep-alive is followed by what the client
    // pipelined meanwhile (answered 503, Connection: close) or by the connection's end.
    read_request();
  }

  // Reads and drops whatever the client still sends (bounded in bytes and time), then closes.
  void drain() {
    stream_.socket().shutdown(tcp::socket::shutdown_send, drain_ec_);
    drain_buffer_.resize(64 * 1024);
    stream_.expires_after(std::chrono::seconds(10));
    drain_some();
  }
  void drain_some() {
    stream_.async_read_some(net::buffer(drain_buffer_),
                            [self = shared_from_this()](beast::error_code ec, size_t n) {
                              self->drained_ += n;
                              if (ec || self->drained_ > (size_t{1} << 30)) return self->close();
                              self->drain_some();
                            });
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    probe_timer_.cancel();
    head_timer_.cancel();
    if (response_pending_) {
      response_pending_ = false;
      counters_.pending_responses.fetch_sub(1);
    }
    {
      std::lock_guard<std::mutex> lock(disconnect_mutex_);
      on_disconnect_ = nullptr;
    }
    beast::error_code ignored;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ignored);
    stream_.socket().close(ignored);
  }

  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  OpenAiService& service_;
  const ServerConfig& config_;
  const CorsPolicy& cors_;
  Counters& counters_;
  std::deque<std::string> writes_;
  std::mutex disconnect_mutex_;
  std::function<void()> on_disconnect_;
  net::steady_timer probe_timer_{stream_.get_executor()};
  net::steady_timer head_timer_{stream_.get_executor()};
  bool head_timed_out_ = false;
  int probes_sent_ = 0;
  bool keep_alive_ = true;
  bool http11_ = true;
  bool response_started_ = false;  // the response's head is queued
  bool head_only_ = false;
  bool streaming_ = false;
  bool response_pending_ = false;
  bool finish_response_after_write_ = false;
  bool closed_ = false;
  bool drain_before_close_ = false;
  std::string origin_;             // the request's Origin header (CORS)
  std::string preflight_headers_;  // a preflight answer's CORS headers
  std::vector<char> drain_buffer_;
  size_t drained_ = 0;
  beast::error_code drain_ec_;
};

}  // namespace

struct HttpServer::Impl {
  Impl(const ServerConfig& c, OpenAiService& s, engine::AsyncEngine& e)
      : config(c),
        service(s),
        engine(e),
        cors(c.cors),
        acceptor(ioc),
        signals(ioc, SIGINT, SIGTERM) {}

  // Shutting down (a signal, or a parallel job's end): new requests get a 503 from here on, the
  // engine drains for `drain_s` seconds (0: aborts now), and every connection stops keeping
  // alive (idle ones close now). Thread-safe.
  void refuse_new_work(double drain_s) {
    engine.begin_shutdown(drain_s);
    counters.shutting_down.store(true);
    sessions.for_each([](Session& session) { session.notify_shutdown(); });
  }

  // Thread-safe: see HttpServer::fail_in_flight.
  void fail_in_flight(const ApiError& error, double wait_s) {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(wait_s));
    net::post(ioc, [this] {
      beast::error_code ignored;
      acceptor.close(ignored);
    });
    refuse_new_work(0);
    service.fail_in_flight(error);
    // Each connection closes once its answer is out (none is kept alive from here on).
    while (counters.connections.load() > 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }

  // SIGINT / SIGTERM's drain, off the I/O threads. Under a launcher's kill sequence the drain
  // also ends, with a 503 for what is left, just before the launcher kills the process: the
  // engine may be unable to finish anything (a rank of the job is gone, and the engine thread
  // waits for it), so the answers go out without it.
  void drain_then_stop() {
    bool answered = false;
    while (!engine.stopped() && !answered) {
      if (kill_clock)
        if (const std::optional<double> left = kill_clock(); left && *left <= kAnswerBeforeKill) {
          log_warning(
              "the launcher ends this process in %.1f s: answering the %zu requests left "
              "with 503",
              *left, service.num_in_flight());
          fail_in_flight(
              ApiError{503, kill_message, "service_unavailable", std::nullopt, std::nullopt},
              *left);
          answered = true;
        }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    // After a 503 for what was left this waits for ever if the engine thread is stuck in an MPI
    // wait for a dead rank: on purpose, since the I/O threads must go on writing the answers
    // until the launcher's SIGKILL, which is due within a second.
    engine.shutdown(config.shutdown_timeout_s);
    // Let the last responses reach their clients and the connections end (each closes once
    // its response is out and what its client pipelined is answered).
    const auto deadline = std::chrono::steady_clock::now() + kCloseWait;
    while (counters.connections.load() > 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ioc.stop();
  }

  void accept() {
    acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
      if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
      if (!ec) {
        beast::error_code ignored;
        socket.set_option(tcp::no_delay(true), ignored);
        auto session =
            std::make_shared<Session>(std::move(socket), service, config, cors, counters);
        sessions.add(session);
        session->start();
      }
      accept();
    });
  }

  ServerConfig config;
  OpenAiService& service;
  engine::AsyncEngine& engine;
  CorsPolicy cors;
  WeakList<Session> sessions;
  net::io_context ioc;
  tcp::acceptor acceptor;
  net::signal_set signals;
  Counters counters;
  std::thread shutdown_thread;
  std::function<std::optional<double>()> kill_clock;  // set_kill_clock
  std::string kill_message;
};

HttpServer::HttpServer(const ServerConfig& config, OpenAiService& service,
                       engine::AsyncEngine& engine)
    : impl_(std::make_unique<Impl>(config, service, engine)) {}

HttpServer::~HttpServer() {
  if (impl_->shutdown_thread.joinable()) impl_->shutdown_thread.join();
}

Status HttpServer::listen() {
  auto& im = *impl_;
  beast::error_code ec;
  const auto address = net::ip::make_address(im.config.host, ec);
  const std::string where = im.config.host + ":" + std::to_string(im.config.port);
  if (ec) return make_error("--host " + im.config.host + " is not an IP address: " + ec.message());
  tcp::endpoint endpoint(address, static_cast<unsigned short>(im.config.port));
  im.acceptor.open(endpoint.protocol(), ec);
  if (!ec) im.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) im.acceptor.bind(endpoint, ec);
  if (!ec) im.acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) return make_error("cannot listen on " + where + ": " + ec.message());
  return {};
}

int HttpServer::port() const {
  return impl_->acceptor.local_endpoint().port();
}

void HttpServer::fail_in_flight(const ApiError& error, double wait_s) {
  impl_->fail_in_flight(error, wait_s);
}

void HttpServer::set_kill_clock(std::function<std::optional<double>()> seconds_until_kill,
                                std::string message) {
  impl_->kill_clock = std::move(seconds_until_kill);
  impl_->kill_message = std::move(message);
}

void HttpServer::run() {
  auto& im = *impl_;
  // The I/O threads run until the shutdown thread stops them. Without this, once SIGTERM's
  // handler closed the acceptor, a moment with no socket operation pending (a stream between
  // two tokens, its disconnect watch done because the client pipelined a request) would end
  // run(), and the outputs the engine posts afterwards would never be written.
  auto work = net::make_work_guard(im.ioc);
  im.accept();
  im.signals.async_wait([&im](beast::error_code ec, int signal) {
    if (ec) return;
    const std::optional<double> kill_in = im.kill_clock ? im.kill_clock() : std::nullopt;
    if (kill_in)
      log_info(
          "received signal %d: no new connections; finishing in-flight requests (up to %.1f s: "
          "the launcher ends the process then; the rest get a 503)",
          signal,
          std::max(0.0, std::min(im.config.shutdown_timeout_s, *kill_in - kAnswerBeforeKill)));
    else
      log_info(
          "received signal %d: no new connections; finishing in-flight requests (up to %.0f s)",
          signal, im.config.shutdown_timeout_s);
    beast::error_code ignored;
    im.acceptor.close(ignored);
    // Refuse new requests (503) from here on, before this handler returns: a request that
    // arrives on a kept-alive connection while the drain's thread starts must not be admitted.
    im.refuse_new_work(im.config.shutdown_timeout_s);
    // Draining blocks, so it runs off the I/O threads, which keep streaming meanwhile.
    im.shutdown_thread = std::thread([&im] { im.drain_then_stop(); });
  });
  std::vector<std::thread> threads;
  for (int i = 1; i < im.config.io_threads; ++i) threads.emplace_back([&im] { im.ioc.run(); });
  im.ioc.run();
  for (auto& t : threads) t.join();
  if (im.shutdown_thread.joinable()) im.shutdown_thread.join();
  im.service.stop();
}

}  // namespace vesper::server
