#include "server/http_server.h"

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

struct Counters {
  std::atomic<int64_t> pending_responses{0};
  std::atomic<int64_t> connections{0};
};

class Session : public ResponseSink, public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, OpenAiService& service, const ServerConfig& config,
          Counters& counters)
      : stream_(std::move(socket)), service_(service), config_(config), counters_(counters) {
    counters_.connections.fetch_add(1);
  }
  ~Session() override { counters_.connections.fetch_sub(1); }

  void start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read_request(); });
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
  void read_request() {
    if (closed_) return;
    response_started_ = false;
    parser_.emplace();
    parser_->body_limit(config_.max_body_bytes);
    parser_->header_limit(kMaxHeaderBytes);
    stream_.expires_after(kReadTimeout);
    http::async_read(
        stream_, buffer_, *parser_,
        [self = shared_from_this()](beast::error_code ec, size_t) { self->on_read(ec); });
  }

  void on_read(beast::error_code ec) {
    stream_.expires_never();
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == beast::error::timeout ||
        ec == net::error::operation_aborted || ec == net::error::connection_reset) {
      return close();
    }
    if (ec) {
      // Malformed HTTP, or limits exceeded: answer, then close (the stream is out of sync).
      keep_alive_ = false;
      int status = 400;
      std::string message = "Malformed HTTP request: " + ec.message();
      if (ec == http::error::body_limit) {
        status = 413;
        message = "The request body is larger than the limit of " +
                  std::to_string(config_.max_body_bytes) + " bytes (--max-request-body)";
      } else if (ec == http::error::header_limit) {
        status = 431;
        message = "The request headers are too large";
      }
      counters_.pending_responses.fetch_add(1);
      response_pending_ = true;
      // Closing with unread request bytes would reset the connection and could destroy the
      // answer before the client reads it, so the rest of the upload is read and dropped first.
      drain_before_close_ = true;
      return do_send(status, "application/json", error_body(message, "invalid_request_error"));
    }
    auto& req = parser_->get();
    keep_alive_ = req.keep_alive();
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
    head += keep_alive_ ? "Connection: keep-alive\r\n" : "Connection: close\r\n";
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
        std::string(keep_alive_ ? "Connection: keep-alive\r\n" : "Connection: close\r\n") + "\r\n");
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
  Counters& counters_;
  std::deque<std::string> writes_;
  std::mutex disconnect_mutex_;
  std::function<void()> on_disconnect_;
  net::steady_timer probe_timer_{stream_.get_executor()};
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
  std::vector<char> drain_buffer_;
  size_t drained_ = 0;
  beast::error_code drain_ec_;
};

}  // namespace

struct HttpServer::Impl {
  Impl(const ServerConfig& c, OpenAiService& s, engine::AsyncEngine& e)
      : config(c), service(s), engine(e), acceptor(ioc), signals(ioc, SIGINT, SIGTERM) {}

  void accept() {
    acceptor.async_accept(net::make_strand(ioc), [this](beast::error_code ec, tcp::socket socket) {
      if (ec == net::error::operation_aborted || !acceptor.is_open()) return;
      if (!ec) {
        beast::error_code ignored;
        socket.set_option(tcp::no_delay(true), ignored);
        std::make_shared<Session>(std::move(socket), service, config, counters)->start();
      }
      accept();
    });
  }

  ServerConfig config;
  OpenAiService& service;
  engine::AsyncEngine& engine;
  net::io_context ioc;
  tcp::acceptor acceptor;
  net::signal_set signals;
  Counters counters;
  std::thread shutdown_thread;
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

void HttpServer::run() {
  auto& im = *impl_;
  im.accept();
  im.signals.async_wait([&im](beast::error_code ec, int signal) {
    if (ec) return;
    log_info("received signal %d: no new connections; finishing in-flight requests (up to %.0f s)",
             signal, im.config.shutdown_timeout_s);
    beast::error_code ignored;
    im.acceptor.close(ignored);
    // Refuse new requests (503) from here on, before this handler returns: a request that
    // arrives on a kept-alive connection while the drain's thread starts must not be admitted.
    im.engine.begin_shutdown(im.config.shutdown_timeout_s);
    // Draining blocks, so it runs off the I/O threads, which keep streaming meanwhile.
    im.shutdown_thread = std::thread([&im] {
      im.engine.shutdown(im.config.shutdown_timeout_s);
      // Let the last responses reach their clients.
      for (int i = 0; i < 500 && im.counters.pending_responses.load() > 0; ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      im.ioc.stop();
    });
  });
  std::vector<std::thread> threads;
  for (int i = 1; i < im.config.io_threads; ++i) threads.emplace_back([&im] { im.ioc.run(); });
  im.ioc.run();
  for (auto& t : threads) t.join();
  if (im.shutdown_thread.joinable()) im.shutdown_thread.join();
  im.service.stop();
}

}  // namespace vesper::server
