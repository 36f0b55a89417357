#include "tensor/ggml_type.h"

#include <array>
#include <cctype>
#include <string>

#include "core/check.h"

namespace vesper::tensor {
namespace {

struct Entry {
  uint32_t id;
  TypeTraits traits;
};

// Block sizes and byte sizes as ggml defines them (QK_K = 256).
constexpr std::array kTypes = {
    Entry{0, {"f32", 1, 4, true}},
    Entry{1, {"f16", 1, 2, true}},
    Entry{2, {"q4_0", 32, 18, true}},
    Entry{3, {"q4_1", 32, 20, true}},
    Entry{6, {"q5_0", 32, 22, true}},
    Entry{7, {"q5_1", 32, 24, true}},
    Entry{8, {"q8_0", 32, 34, true}},
    Entry{9, {"q8_1", 32, 36, false}},
    Entry{10, {"q2_K", 256, 84, true}},
    Entry{11, {"q3_K", 256, 110, true}},
    Entry{12, {"q4_K", 256, 144, true}},
    Entry{13, {"q5_K", 256, 176, true}},
    Entry{14, {"q6_K", 256, 210, true}},
    Entry{15, {"q8_K", 256, 292, true}},
    Entry{16, {"iq2_xxs", 256, 66, false}},
    Entry{17, {"iq2_xs", 256, 74, false}},
    Entry{18, {"iq3_xxs", 256, 98, false}},
    Entry{19, {"iq1_s", 256, 50, false}},
    Entry{20, {"iq4_nl", 32, 18, false}},
    Entry{21, {"iq3_s", 256, 110, false}},
    Entry{22, {"iq2_s", 256, 82, false}},
    Entry{23, {"iq4_xs", 256, 136, false}},
    Entry{24, {"i8", 1, 1, false}},
    Entry{25, {"i16", 1, 2, false}},
    Entry{26, {"i32", 1, 4, false}},
    Entry{27, {"i64", 1, 8, false}},
    Entry{28, {"f64", 1, 8, false}},
    Entry{29, {"iq1_m", 256, 56, false}},
    Entry{30, {"bf16", 1, 2, true}},
    Entry{34, {"tq1_0", 256, 54, false}},
    Entry{35, {"tq2_0", 256, 66, false}},
};

}  // namespace

std::optional<TypeTraits> type_traits(uint32_t type) {
  for (const Entry& e : kTypes)
    if (e.id == type) return e.traits;
  return std::nullopt;
}

const TypeTraits& traits(GgmlType type) {
  for (const Entry& e : kTypes)
    if (e.id == static_cast<uint32_t>(type)) return e.traits;
  VESPER_CHECK(false, "unknown ggml type %u", static_cast<unsigned>(type));
}

std::optional<GgmlType> parse_type_name(std::string_view name) {
  std::string lower;
  for (char c : name) lower.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  for (const Entry& e : kTypes) {
    std::string candidate;
    for (char c : e.traits.name)
      candidate.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
    if (candidate == lower) return static_cast<GgmlType>(e.id);
  }
  return std::nullopt;
}

}  // namespace vesper::tensor
