// `vesper serve MODEL.gguf`: the OpenAI-compatible HTTP server (see server/http_server.h).
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "cli/commands.h"
#include "cli/engine_flags.h"
#include "core/logging.h"
#include "dist/job_end.h"
#include "dist/launch.h"
#include "engine/async_engine.h"
#include "hf/model_file.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/openai_service.h"
#include "server/tool_calls.h"

namespace vesper::cli {
namespace {

struct ServeOptions {
  EngineFlags engine;
  server::ServerConfig server;
  std::string max_request_body = "32M";
};

Result<tokenizer::ChatTemplate> load_chat_template(const std::string& path,
                                                   const gguf::GgufFile& model) {
  std::string source;
  std::string origin;
  if (!path.empty()) {
    std::ifstream f(path);
    if (!f) return make_error("--chat-template " + path + ": cannot open the file");
    std::stringstream ss;
    ss << f.rdbuf();
    source = ss.str();
    origin = path;
  } else {
    VESPER_ASSIGN_OR_RETURN(tokenizer::ModelChatTemplate shipped,
                            tokenizer::model_chat_template(model));
    source = std::move(shipped.source);
    origin = std::move(shipped.origin);
  }
  auto parsed = tokenizer::ChatTemplate::parse(source);
  if (!parsed) return make_error(origin + ": " + parsed.error().message);
  log_info("chat template: %s", origin.c_str());
  return parsed;
}

// Each connection is a file descriptor; the usual soft limit of 1024 would cap concurrent
// clients well below what the server holds, so it is raised to the hard limit.
void raise_fd_limit() {
  rlimit lim{};
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0 && lim.rlim_cur < lim.rlim_max) {
    lim.rlim_cur = lim.rlim_max;
    setrlimit(RLIMIT_NOFILE, &lim);
  }
  if (getrlimit(RLIMIT_NOFILE, &lim) == 0)
    log_info("open files limit: %llu (each client connection takes one)",
             static_cast<unsigned long long>(lim.rlim_cur));
}

// A parallel job (rank 0 serves) can end under the server: a rank that stops answering or a
// broken link aborts the job (every in-flight request gets a 500 naming why), and mpirun's kill
// sequence (a rank died, or mpirun was signalled) leaves a SIGTERM's drain a fixed time (what
// is left then gets a 503). Either way each client gets an answer, not a cut connection.
// Clears the job's abort handler when the server goes, however run_serve returns.
struct AbortHandlerScope {
  ~AbortHandlerScope() { dist::set_abort_handler({}); }
};

void answer_clients_when_the_job_ends(server::HttpServer& http) {
  dist::set_abort_handler([&http](const std::string& why) {
    http.fail_in_flight(server::ApiError{500, "the parallel job failed and is ending: " + why,
                                         "server_error", std::nullopt, std::nullopt},
                        /*wait_s=*/1.0);
  });
  char message[400];
  std::snprintf(message, sizeof message,
                "the server is shutting down: mpirun ends every rank %.1f s after their SIGTERM "
                "(a rank died, or mpirun itself was signalled), before this request could "
                "finish (mpirun's --mca odls_base_sigkill_timeout sets that time)",
                dist::launcher_kill_interval());
  http.set_kill_clock(dist::launcher_kill_in, message);
}

int run_serve(ServeOptions& o) {
  raise_fd_limit();
  // As vLLM reads VLLM_API_KEY: a key in the environment stays out of `ps` and shell history.
  if (o.server.api_key.empty())
    if (const char* key = std::getenv("VESPER_API_KEY"); key != nullptr && *key != '\0')
      o.server.api_key = key;
  auto body_limit = engine::parse_byte_size(o.max_request_body);
  if (!body_limit || *body_limit <= 0)
    return fail("--max-request-body: " +
                (body_limit ? std::string("must be positive") : body_limit.error().message));
  o.server.max_body_bytes = static_cast<size_t>(*body_limit);
  if (o.server.served_model_name.empty())
    o.server.served_model_name = hf::model_name(o.engine.model_path);
  o.server.enable_lora_runtime_updating = o.engine.enable_lora_runtime_updating;
  if (o.server.enable_auto_tool_choice && o.server.tool_call_parser.empty())
    return fail("--enable-auto-tool-choice needs --tool-call-parser (hermes or llama3_json)");
  if (!o.server.tool_call_parser.empty())
    if (auto p = server::tool_call_parser_from_name(o.server.tool_call_parser); !p)
      return fail("--tool-call-parser: " + p.error().message);
  auto config = to_engine_config(o.engine);
  if (!config) return fail(config.error().message);
  if (const std::optional<int> rc = run_if_follower(*config)) return *rc;
  auto created = engine::Engine::create(*config);
  if (!created) return fail(created.error().message);
  auto tmpl = load_chat_template(o.server.chat_template_path, (*created)->model().file());
  if (!tmpl) return fail(tmpl.error().message);

  engine::AsyncEngine engine(std::move(*created));
  server::Metrics metrics(o.server.served_model_name, [&engine] { return engine.stats(); });
  engine.set_step_observer(
      [&metrics](const std::vector<engine::RequestOutput>& outs, const engine::EngineStats& st) {
        metrics.on_step(outs, st);
      });
  server::OpenAiService service(o.server, engine, metrics, std::move(*tmpl));
  server::HttpServer http(o.server, service, engine);
  if (auto st = http.listen(); !st) return fail(st.error().message);
  AbortHandlerScope abort_handler_scope;  // declared after http: cleared before it goes
  if (dist::started_world() != nullptr) answer_clients_when_the_job_ends(http);
  log_info(
      "serving \"%s\" on http://%s:%d (OpenAI API: /v1/completions, /v1/chat/completions, "
      "/v1/models; "
      "also /health, /metrics, /tokenize, /detokenize%s)",
      o.server.served_model_name.c_str(), o.server.host.c_str(), http.port(),
      o.server.enable_lora_runtime_updating ? ", /v1/load_lora_adapter, /v1/unload_lora_adapter"
                                            : "");
  http.run();
  log_info("server stopped");
  return 0;
}

}  // namespace

CommandRunner add_serve_command(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand("serve", "Serve a model over an OpenAI-compatible HTTP API");
  add_engine_flags(cmd, o->engine);
  auto& s = o->server;
  cmd->add_option("--host", s.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", s.port, "Port to listen on (0: any free port)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", s.api_key,
                  "Require \"Authorization: Bearer KEY\" on API requests (default: the "
                  "VESPER_API_KEY environment "
                  "variable; /health and /metrics stay open)");
  cmd->add_option("--served-model-name", s.served_model_name,
                  "Model name in the API (default: the file name without .gguf)");
  cmd->add_option("--max-num-waiting", s.max_num_waiting,
                  "Queued requests beyond which new ones get HTTP 503 (admission control)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--chat-template", s.chat_template_path,
                  "Jinja chat template file (overrides the model's)");
  cmd->add_option("--io-threads", s.io_threads, "Threads serving connections")
      ->capture_default_str()
      ->check(CLI::Range(1, 64));
  cmd->add_option("--shutdown-timeout", s.shutdown_timeout_s,
                  "Seconds in-flight requests get to finish on SIGINT/SIGTERM (under mpirun, a "
                  "signal to mpirun leaves only its kill interval, 1 s by default: signal rank 0 "
                  "for the full drain; README: Parallelism)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--timeout-keep-alive", s.keep_alive_timeout_s,
                  "Seconds an idle kept-alive connection waits for its next request before it is "
                  "closed")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--timeout-request-header", s.header_timeout_s,
                  "Seconds a request's line and headers may take to arrive after its first byte "
                  "(then 408)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--allowed-origins", s.cors.allowed_origins,
                  "CORS: origins whose pages may call the API (\"*\": any)")
      ->capture_default_str()
      ->expected(1, -1);
  cmd->add_option("--allowed-methods", s.cors.allowed_methods,
                  "CORS: methods a cross-origin request may use (\"*\": any)")
      ->capture_default_str()
      ->expected(1, -1);
  cmd->add_option("--allowed-headers", s.cors.allowed_headers,
                  "CORS: request headers a cross-origin request may send (\"*\": any)")
      ->capture_default_str()
      ->expected(1, -1);
  cmd->add_flag("--allow-credentials", s.cors.allow_credentials,
                "CORS: let cross-origin requests carry credentials (cookies, Authorization); the "
                "allowed origin is then named, never \"*\"");
  cmd->add_flag("--enable-lora-runtime-updating", o->engine.enable_lora_runtime_updating,
                "Allow POST /v1/load_lora_adapter {lora_name, lora_path} and "
                "/v1/unload_lora_adapter {lora_name} while serving (needs --enable-lora)");
  cmd->add_option("--lora-allowed-dirs", o->engine.lora_allowed_dirs,
                  "Directories /v1/load_lora_adapter may read adapters from, judged after "
                  "resolving symlinks and '..' (default: the directories of --lora-modules)")
      ->expected(1, -1);
  cmd->add_flag("--enable-auto-tool-choice", s.enable_auto_tool_choice,
                "Let tool_choice \"auto\" (the default when a request has tools) find calls in the "
                "output with --tool-call-parser");
  cmd->add_option(
      "--tool-call-parser", s.tool_call_parser,
      "How tool calls are written by the model: hermes (<tool_call>{...}</tool_call>) or "
      "llama3_json ({\"name\", \"parameters\"})");
  cmd->add_option("--max-request-body", o->max_request_body,
                  "Largest request body accepted (e.g. 32M)")
      ->capture_default_str();
  return [o] { return run_serve(*o); };
}

}  // namespace vesper::cli
