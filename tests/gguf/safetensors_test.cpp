// Safetensors reader: the real Medusa heads file, and hand-made files for each fault the reader
// must name (the file, and the tensor where there is one).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "gguf/safetensors.h"

namespace vesper::gguf {
namespace {

const char* kMedusa = "../shared/models/medusa/stories260K-medusa4.safetensors";

std::string safetensors_temp_path(const std::string& name) {
  return ::testing::TempDir() + "vesper_safetensors_" + name;
}

// A file of `header` (padded to the 8-byte length prefix's convention) and `data_bytes` of data.
std::string write_file(const std::string& name, const std::string& header, size_t data_bytes) {
  const std::string path = safetensors_temp_path(name);
  std::ofstream f(path, std::ios::binary);
  uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) f.put(static_cast<char>((n >> (8 * i)) & 0xff));
  f << header;
  const std::vector<char> zeros(data_bytes, 0);
  f.write(zeros.data(), static_cast<std::streamsize>(zeros.size()));
  return path;
}

std::string open_error(const std::string& name, const std::string& header, size_t data_bytes) {
  const std::string path = write_file(name, header, data_bytes);
  auto r = SafetensorsFile::open(path);
  EXPECT_FALSE(r.ok()) << name << " opened but should not";
  if (r.ok()) return "";
  EXPECT_NE(r.error().message.find(path), std::string::npos) << r.error().message;
  return r.error().message;
}

TEST(Safetensors, ReadsTheMedusaHeads) {
  auto r = SafetensorsFile::open(kMedusa);
  ASSERT_TRUE(r.ok()) << r.error().message;
  EXPECT_EQ(r->tensors().size(), 12u);
  auto w = r->require("2.1.weight");
  ASSERT_TRUE(w.ok());
  EXPECT_EQ((*w)->type, tensor::GgmlType::kF32);
  EXPECT_EQ((*w)->shape, (std::vector<int64_t>{512, 64}));
  EXPECT_EQ((*w)->size_bytes, 512u * 64 * 4);
  auto b = r->require("0.0.linear.bias");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ((*b)->num_elements(), 64);
  auto missing = r->require("4.1.weight");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("4.1.weight"), std::string::npos);
}

TEST(Safetensors, ReadsAValidHandMadeFile) {
  const std::string path = write_file(
      "good",
      R"({"__metadata__":{"format":"pt"},"a":{"dtype":"F16","shape":[2,3],"data_offsets":[0,12]},)"
      R"("b":{"dtype":"BF16","shape":[],"data_offsets":[12,14]}})",
      14);
  auto r = SafetensorsFile::open(path);
  ASSERT_TRUE(r.ok()) << r.error().message;
  ASSERT_NE(r->find("a"), nullptr);
  EXPECT_EQ(r->find("a")->type, tensor::GgmlType::kF16);
  EXPECT_EQ(r->find("b")->num_elements(), 1);
}

TEST(Safetensors, NamesEachFault) {
  {
    const std::string path = safetensors_temp_path("short");
    std::ofstream(path, std::ios::binary) << "abc";
    auto r = SafetensorsFile::open(path);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("shorter"), std::string::npos) << r.error().message;
  }
  {
    // A header length past the end of the file.
    const std::string path = safetensors_temp_path("long_header");
    std::ofstream f(path, std::ios::binary);
    const char len[8] = {static_cast<char>(0xff), 0x7f, 0, 0, 0, 0, 0, 0};
    f.write(len, 8);
    f << "{}";
    f.close();
    auto r = SafetensorsFile::open(path);
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.error().message.find("runs past the end"), std::string::npos) << r.error().message;
  }
  EXPECT_NE(open_error("not_json", "{\"a\":", 0).find("not a JSON object"), std::string::npos);
  EXPECT_NE(open_error("deep", std::string(100, '[') + std::string(100, ']'), 0).find("nests"),
            std::string::npos);
  const std::string dtype =
      open_error("dtype", R"({"w":{"dtype":"I8","shape":[4],"data_offsets":[0,4]}})", 4);
  EXPECT_NE(dtype.find("tensor w"), std::string::npos) << dtype;
  EXPECT_NE(dtype.find("I8"), std::string::npos) << dtype;
  EXPECT_NE(open_error("fields", R"({"w":{"dtype":"F32","shape":[4]}})", 16).find("data_offsets"),
            std::string::npos);
  EXPECT_NE(open_error("shape", R"({"w":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})", 16)
                .find("shape"),
            std::string::npos);
  EXPECT_NE(open_error("range", R"({"w":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8)
                .find("outside"),
            std::string::npos);
  EXPECT_NE(open_error("size", R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", 16)
                .find("12 bytes"),
            std::string::npos);
  const std::string overlap = open_error(
      "overlap",
      R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
      16);
  EXPECT_NE(overlap.find("overlap"), std::string::npos) << overlap;
}

}  // namespace
}  // namespace vesper::gguf
