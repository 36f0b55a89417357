// ApiError: an error answered to an HTTP client in OpenAI's shape:
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
// The message names the field or value at fault; `param` names the field when there is one.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

namespace vesper::server {

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::optional<std::string> param;
  std::optional<std::string> code;

  nlohmann::json to_json() const {
    nlohmann::json e = {
        {"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
    if (param) e["param"] = *param;
    if (code) e["code"] = *code;
    return {{"error", e}};
  }
};

inline ApiError bad_request(std::string message, std::optional<std::string> param = std::nullopt) {
  return ApiError{400, std::move(message), "invalid_request_error", std::move(param), std::nullopt};
}

}  // namespace vesper::server
