// ServerConfig: the HTTP server's settings (vLLM's flag names where vLLM has them).
#pragma once

#include <cstdint>
#include <string>

#include "server/cors.h"

namespace vesper::server {

struct ServerConfig {
  std::string host = "127.0.0.1";  // --host
  int port = 8000;                 // --port
  std::string api_key;  // --api-key: when set, requests need "Authorization: Bearer <key>"
  std::string served_model_name;      // --served-model-name (default: the model file's name)
  int64_t max_num_waiting = 1024;     // --max-num-waiting: beyond this many queued requests, 503
  size_t max_body_bytes = 32u << 20;  // --max-request-body: larger bodies get 413
  int io_threads = 1;                 // --io-threads
  double shutdown_timeout_s =
      30;  // --shutdown-timeout: in-flight requests get this long on SIGTERM
  // --timeout-keep-alive (uvicorn's flag, 5 s as in vLLM): an idle kept-alive connection is
  // closed after this long without a new request.
  double keep_alive_timeout_s = 5;
  // --timeout-request-header: a request's line and headers must arrive within this long of its
  // first byte (a client sending a byte at a time holds no connection longer); else 408.
  double header_timeout_s = 10;
  CorsConfig cors;  // --allowed-origins, --allowed-methods, --allowed-headers, --allow-credentials
  std::string chat_template_path;  // --chat-template: a Jinja file overriding the GGUF's template
  // --enable-lora-runtime-updating: POST /v1/load_lora_adapter and /v1/unload_lora_adapter
  bool enable_lora_runtime_updating = false;
  // --enable-auto-tool-choice with --tool-call-parser (hermes, llama3_json): tool_choice "auto"
  // reads calls out of the model's output (server/tool_calls.h); without them "auto" is a 400.
  bool enable_auto_tool_choice = false;
  std::string tool_call_parser;
};

}  // namespace vesper::server
