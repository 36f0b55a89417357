#include "client/stream_reader.h"

#include <nlohmann/json.hpp>

#include "core/error_text.h"

namespace vesper::client {
namespace {

using nlohmann::json;

// The generated text of a chunk's first choice, and whether the chunk carries any content.
bool content_of(const json& choice, ApiKind kind, std::string& text) {
  if (!choice.is_object()) return false;
  const json* holder = &choice;
  if (kind == ApiKind::kChatCompletions) {
    auto delta = choice.find("delta");
    if (delta == choice.end() || !delta->is_object()) return false;
    holder = &*delta;
  }
  bool content = false;
  for (const char* key : {"text", "content", "reasoning_content"}) {
    auto it = holder->find(key);
    if (it != holder->end() && it->is_string() && !it->get_ref<const std::string&>().empty()) {
      text += it->get_ref<const std::string&>();
      content = true;
    }
  }
  for (const char* key : {"token_ids", "tokens"}) {
    auto it = choice.find(key);
    if (it != choice.end() && it->is_array() && !it->empty()) content = true;
  }
  return content;
}

}  // namespace

void StreamReader::on_body(std::string_view bytes, double now_s) {
  if (done()) return;
  sse_.feed(bytes, [&](std::string_view data) { on_event(data, now_s); });
}

void StreamReader::on_end(double now_s) {
  if (!done()) sse_.finish([&](std::string_view data) { on_event(data, now_s); });
  if (end_s_ < 0) end_s_ = now_s;
}

void StreamReader::on_error(std::string error) {
  if (error_.empty()) error_ = std::move(error);
}

void StreamReader::on_event(std::string_view data, double now_s) {
  if (done()) return;
  if (data == "[DONE]") {
    done_ = true;
    end_s_ = now_s;
    return;
  }
  const json j = json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    error_ =
        std::string("the stream sent an event that is not a JSON object: ") + excerpt(data, 200);
    return;
  }
  if (auto err = j.find("error"); err != j.end() && !err->is_null()) {
    const json* message = err->is_object() && err->contains("message") ? &(*err)["message"] : &*err;
    error_ = "the server reported an error in the stream: " +
             (message->is_string() ? message->get<std::string>() : excerpt(message->dump(), 200));
    return;
  }
  if (auto choices = j.find("choices");
      choices != j.end() && choices->is_array() && !choices->empty()) {
    if (content_of(choices->front(), kind_, out_.generated_text)) {
      if (out_.num_content_chunks == 0)
        out_.ttft_s = now_s - send_time_s_;
      else
        out_.itl_s.push_back(now_s - last_content_s_);
      last_content_s_ = now_s;
      ++out_.num_content_chunks;
    }
  }
  if (auto usage = j.find("usage"); usage != j.end() && usage->is_object()) {
    if (auto ct = usage->find("completion_tokens"); ct != usage->end() && ct->is_number_integer()) {
      out_.output_tokens = ct->get<int64_t>();
      out_.usage_reported = true;
    }
    if (auto pt = usage->find("prompt_tokens");
        pt != usage->end() && pt->is_number_integer() && pt->get<int64_t>() > 0) {
      out_.prompt_len = pt->get<int64_t>();
      out_.prompt_len_reported = true;
    }
  }
}

RequestOutput StreamReader::take_output() {
  RequestOutput out = std::move(out_);
  out_ = RequestOutput{};
  if (!error_.empty()) {
    out.success = false;
    out.error = error_;
  } else if (out.num_content_chunks == 0) {
    out.success = false;
    out.error = "the stream ended without a content chunk, so TTFT is undefined";
  } else {
    out.success = true;
    out.latency_s = (end_s_ >= 0 ? end_s_ : last_content_s_) - send_time_s_;
    if (!out.usage_reported) out.output_tokens = out.num_content_chunks;
  }
  return out;
}

}  // namespace vesper::client
