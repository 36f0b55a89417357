// GGUF reader and writer: round trips of every value type, the real stories260K file, and a
// corrupted copy of a real file for each fault the reader must name.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>

#include "gguf/gguf.h"

namespace vesper::gguf {
namespace {

const char* kStories = "../shared/models/stories260K.gguf";

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "vesper_gguf_" + name;
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// The error message from opening `bytes` as a file.
std::string open_error(const std::vector<uint8_t>& bytes, const std::string& name) {
  const std::string path = temp_path(name);
  write_bytes(path, bytes);
  auto r = GgufFile::open(path);
  EXPECT_FALSE(r.ok()) << name << " opened but should not";
  if (r.ok()) return "";
  EXPECT_NE(r.error().message.find(path), std::string::npos)
      << "error does not name the file: " << r.error().message;
  return r.error().message;
}

// A writer holding an exact copy of stories260K (metadata and tensors).
GgufWriter copy_of_stories() {
  auto file = GgufFile::open(kStories);
  EXPECT_TRUE(file.ok());
  GgufWriter w;
  w.copy_metadata(*file);
  for (const TensorInfo& t : file->tensors())
    EXPECT_TRUE(w.add_tensor(t.name, t.shape, t.type, {t.data, t.size_bytes}).ok());
  return w;
}

// Byte offset of the tensor-info record of `name` (its name string's length prefix).
size_t tensor_info_offset(const std::vector<uint8_t>& bytes, const std::string& name) {
  std::vector<uint8_t> needle(8 + name.size());
  uint64_t len = name.size();
  std::memcpy(needle.data(), &len, 8);
  std::copy(name.begin(), name.end(), needle.begin() + 8);
  auto it = std::search(bytes.begin(), bytes.end(), needle.begin(), needle.end());
  EXPECT_NE(it, bytes.end());
  return static_cast<size_t>(it - bytes.begin());
}

TEST(Gguf, ReadsStories260K) {
  auto file = GgufFile::open(kStories);
  ASSERT_TRUE(file.ok()) << file.error().message;
  EXPECT_EQ(file->version(), 3u);
  EXPECT_EQ(file->tensors().size(), 48u);
  EXPECT_EQ(file->metadata().size(), 19u);
  EXPECT_EQ(file->data_offset(), 14176u);
  EXPECT_EQ(file->alignment(), 32u);
  EXPECT_EQ(*file->require_string("general.architecture"), "llama");
  EXPECT_EQ(*file->require_int("llama.embedding_length"), 64);
  EXPECT_EQ(*file->require_int("llama.context_length"), 128);
  auto tokens = file->get_array("tokenizer.ggml.tokens", ValueType::kString);
  ASSERT_TRUE(tokens.ok());
  ASSERT_NE(*tokens, nullptr);
  EXPECT_EQ((*tokens)->items.size(), 512u);
  EXPECT_EQ(*(*tokens)->items[1].as_string(), "<s>");
  const TensorInfo* embd = file->find_tensor("token_embd.weight");
  ASSERT_NE(embd, nullptr);
  EXPECT_EQ(embd->shape, (std::vector<int64_t>{64, 512}));
  EXPECT_EQ(embd->type, tensor::GgmlType::kF32);
  EXPECT_EQ(embd->size_bytes, 64u * 512u * 4u);
  // Zero-copy: tensor data points into the mapping at data_offset + offset.
  int64_t params = 0;
  for (const auto& t : file->tensors()) params += t.num_elements();
  EXPECT_EQ(params, 292800);
  // An unsigned value that does not fit in a signed type is a type error, not a crash.
  auto sep = file->get_int("tokenizer.ggml.seperator_token_id");
  ASSERT_TRUE(sep.ok());
  EXPECT_EQ(**sep, 4294967295LL);
}

TEST(Gguf, WriterRoundTripsEveryValueTypeAndNestedArrays) {
  GgufWriter w;
  w.set("u8", Value::u8(200));
  w.set("i8", Value::i8(-100));
  w.set("u16", Value::u16(60000));
  w.set("i16", Value::i16(-30000));
  w.set("u32", Value::u32(4000000000u));
  w.set("i32", Value::i32(-2000000000));
  w.set("u64", Value::u64(18000000000000000000ull));
  w.set("i64", Value::i64(-9000000000000000000ll));
  w.set("f32", Value::f32(1.5f));
  w.set("f64", Value::f64(-2.25));
  w.set("bool", Value::boolean(true));
  w.set("str", Value::string("h\xC3\xA9llo"));
  w.set("empty_array", Value::array(ValueType::kInt32, {}));
  w.set("nested",
        Value::array(ValueType::kArray, {Value::i32_array({1, 2}), Value::i32_array({3})}));
  w.set("general.alignment", Value::u32(64));
  std::vector<float> data(96);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<float>(i);
  ASSERT_TRUE(w.add_tensor("a", {32, 3}, tensor::GgmlType::kF32,
                           {reinterpret_cast<const uint8_t*>(data.data()), data.size() * 4})
                  .ok());
  ASSERT_TRUE(w.add_tensor("b", {8}, tensor::GgmlType::kF32,
                           {reinterpret_cast<const uint8_t*>(data.data()), 32})
                  .ok());
  const std::string path = temp_path("roundtrip.gguf");
  ASSERT_TRUE(w.write(path).ok());

  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->alignment(), 64u);
  EXPECT_EQ(f->data_offset() % 64, 0u);
  EXPECT_EQ(*f->find("u8")->as_int(), 200);
  EXPECT_EQ(*f->find("i8")->as_int(), -100);
  EXPECT_EQ(*f->find("u16")->as_int(), 60000);
  EXPECT_EQ(*f->find("i16")->as_int(), -30000);
  EXPECT_EQ(*f->find("u32")->as_int(), 4000000000LL);
  EXPECT_EQ(*f->find("i32")->as_int(), -2000000000);
  EXPECT_EQ(std::get<uint64_t>(f->find("u64")->data), 18000000000000000000ull);
  EXPECT_FALSE(f->find("u64")->as_int().has_value());  // does not fit int64
  EXPECT_EQ(*f->find("i64")->as_int(), -9000000000000000000ll);
  EXPECT_EQ(*f->find("f32")->as_double(), 1.5);
  EXPECT_EQ(*f->find("f64")->as_double(), -2.25);
  EXPECT_EQ(*f->find("bool")->as_bool(), true);
  EXPECT_EQ(*f->find("str")->as_string(), "h\xC3\xA9llo");
  EXPECT_TRUE(f->find("empty_array")->as_array()->items.empty());
  const Array* nested = f->find("nested")->as_array();
  ASSERT_EQ(nested->items.size(), 2u);
  EXPECT_EQ(*nested->items[0].as_array()->items[1].as_int(), 2);
  EXPECT_EQ(*nested->items[1].as_array()->items[0].as_int(), 3);
  const TensorInfo* a = f->find_tensor("a");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(reinterpret_cast<const float*>(a->data)[95], 95.0f);
  const TensorInfo* b = f->find_tensor("b");
  EXPECT_EQ(b->offset % 64, 0u);
  EXPECT_EQ(reinterpret_cast<const float*>(b->data)[7], 7.0f);
  // Typed getters name the key on a type mismatch.
  auto wrong = f->require_string("u8");
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.error().message.find("\"u8\""), std::string::npos);
  auto missing = f->require_int("nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("missing required metadata key \"nope\""),
            std::string::npos);
}

TEST(Gguf, CopyOfRealFileReadsBackIdentically) {
  const std::string path = temp_path("copy.gguf");
  ASSERT_TRUE(copy_of_stories().write(path).ok());
  auto copy = GgufFile::open(path);
  auto orig = GgufFile::open(kStories);
  ASSERT_TRUE(copy.ok() && orig.ok());
  ASSERT_EQ(copy->tensors().size(), orig->tensors().size());
  for (size_t i = 0; i < copy->tensors().size(); ++i) {
    const auto& a = copy->tensors()[i];
    const auto& b = orig->tensors()[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(0, std::memcmp(a.data, b.data, a.size_bytes));
  }
}

TEST(GgufErrors, WrongMagic) {
  auto bytes = copy_of_stories().serialize();
  std::memcpy(bytes.data(), "GGML", 4);
  EXPECT_NE(open_error(bytes, "magic.gguf").find("wrong magic \"GGML\""), std::string::npos);
}

TEST(GgufErrors, UnsupportedVersion) {
  auto bytes = copy_of_stories().serialize();
  uint32_t v = 4;
  std::memcpy(bytes.data() + 4, &v, 4);
  EXPECT_NE(open_error(bytes, "v4.gguf").find("unsupported GGUF version 4"), std::string::npos);
  v = 1;
  std::memcpy(bytes.data() + 4, &v, 4);
  EXPECT_NE(open_error(bytes, "v1.gguf").find("version 1 is not supported"), std::string::npos);
}

TEST(GgufErrors, VersionTwoIsAccepted) {
  auto bytes = copy_of_stories().serialize();
  uint32_t v = 2;
  std::memcpy(bytes.data() + 4, &v, 4);
  const std::string path = temp_path("v2.gguf");
  write_bytes(path, bytes);
  auto f = GgufFile::open(path);
  ASSERT_TRUE(f.ok()) << f.error().message;
  EXPECT_EQ(f->version(), 2u);
}

TEST(GgufErrors, TruncatedHeaderAtEveryRegion) {
  auto bytes = copy_of_stories().serialize();
  for (size_t cut :
       {size_t{0}, size_t{3}, size_t{10}, size_t{30}, size_t{500}, size_t{9000}, size_t{14000}}) {
    std::vector<uint8_t> t(bytes.begin(), bytes.begin() + cut);
    std::string e = open_error(t, "trunc" + std::to_string(cut) + ".gguf");
    EXPECT_NE(e.find("truncated"), std::string::npos) << cut << ": " << e;
  }
}

TEST(GgufErrors, TruncatedData) {
  auto bytes = copy_of_stories().serialize();
  bytes.resize(bytes.size() - 100);
  std::string e = open_error(bytes, "truncdata.gguf");
  EXPECT_NE(e.find("ends past end of file"), std::string::npos) << e;
  EXPECT_NE(e.find("tensor "), std::string::npos) << e;
}

TEST(GgufErrors, TensorDataOutOfBounds) {
  auto bytes = copy_of_stories().serialize();
  size_t at = tensor_info_offset(bytes, "output.weight");
  size_t offset_field = at + 8 + std::strlen("output.weight") + 4 + 2 * 8 + 4;
  uint64_t huge = 1ull << 40;
  std::memcpy(bytes.data() + offset_field, &huge, 8);
  std::string e = open_error(bytes, "oob.gguf");
  EXPECT_NE(e.find("tensor output.weight"), std::string::npos) << e;
  EXPECT_NE(e.find("past end of file"), std::string::npos) << e;
}

TEST(GgufErrors, MisalignedTensorOffset) {
  auto bytes = copy_of_stories().serialize();
  size_t at = tensor_info_offset(bytes, "output.weight");
  size_t offset_field = at + 8 + std::strlen("output.weight") + 4 + 2 * 8 + 4;
  uint64_t off;
  std::memcpy(&off, bytes.data() + offset_field, 8);
  off += 4;
  std::memcpy(bytes.data() + offset_field, &off, 8);
  std::string e = open_error(bytes, "misaligned.gguf");
  EXPECT_NE(e.find("not aligned"), std::string::npos) << e;
  EXPECT_NE(e.find("output.weight"), std::string::npos) << e;
}

TEST(GgufErrors, UnknownTensorType) {
  auto bytes = copy_of_stories().serialize();
  size_t at = tensor_info_offset(bytes, "output.weight");
  size_t type_field = at + 8 + std::strlen("output.weight") + 4 + 2 * 8;
  uint32_t t = 77;
  std::memcpy(bytes.data() + type_field, &t, 4);
  std::string e = open_error(bytes, "type.gguf");
  EXPECT_NE(e.find("unknown tensor type 77"), std::string::npos) << e;
}

TEST(GgufErrors, DuplicateTensorName) {
  auto bytes = copy_of_stories().serialize();
  // Rename blk.1.attn_k.weight to blk.0.attn_k.weight (same length) in its tensor info.
  size_t at = tensor_info_offset(bytes, "blk.1.attn_k.weight");
  std::memcpy(bytes.data() + at + 8, "blk.0.attn_k.weight", 19);
  std::string e = open_error(bytes, "dup.gguf");
  EXPECT_NE(e.find("duplicate tensor name \"blk.0.attn_k.weight\""), std::string::npos) << e;
}

TEST(GgufErrors, DuplicateMetadataKey) {
  GgufWriter w;
  w.set("a.key", Value::u32(1));
  w.set("b.key", Value::u32(2));
  auto bytes = w.serialize();
  const std::string b_key = "b.key";
  auto it = std::search(bytes.begin(), bytes.end(), b_key.begin(), b_key.end());
  ASSERT_NE(it, bytes.end());
  *it = 'a';
  std::string e = open_error(bytes, "dupkey.gguf");
  EXPECT_NE(e.find("duplicate metadata key \"a.key\""), std::string::npos) << e;
}

TEST(GgufErrors, UnknownMetadataValueType) {
  GgufWriter w;
  w.set("some.key", Value::u32(1));
  auto bytes = w.serialize();
  // header (24) + key length (8) + "some.key" (8) -> value type field.
  uint32_t t = 99;
  std::memcpy(bytes.data() + 24 + 8 + 8, &t, 4);
  std::string e = open_error(bytes, "vtype.gguf");
  EXPECT_NE(e.find("\"some.key\": unknown value type 99"), std::string::npos) << e;
}

TEST(GgufErrors, HugeArrayLengthIsRejectedWithoutAllocating) {
  GgufWriter w;
  w.set("arr", Value::i32_array({1, 2, 3}));
  auto bytes = w.serialize();
  uint64_t n = 1ull << 60;
  std::memcpy(bytes.data() + 24 + 8 + 3 + 4 + 4, &n, 8);
  std::string e = open_error(bytes, "hugearray.gguf");
  EXPECT_NE(e.find("array length"), std::string::npos) << e;
}

// Found by tests/fuzz/fuzz_gguf's size invariant: 2^62 f32 elements are 2^64 bytes, which wrapped
// to a size of 0, so the tensor "fit" in the file and later readers would have read far past it.
TEST(GgufErrors, TensorWhoseByteSizeOverflowsIsRejected) {
  GgufWriter w;
  std::vector<uint8_t> data(16, 0);
  ASSERT_TRUE(w.add_tensor("big", {4}, tensor::GgmlType::kF32, data).ok());
  auto bytes = w.serialize();
  const size_t dim_field = tensor_info_offset(bytes, "big") + 8 + 3 + 4;
  const int64_t huge = int64_t{1} << 62;
  std::memcpy(bytes.data() + dim_field, &huge, 8);
  std::string e = open_error(bytes, "sizeoverflow.gguf");
  EXPECT_NE(
      e.find(
          "tensor big: 4611686018427387904 elements of f32 are more bytes than 64 bits can count"),
      std::string::npos)
      << e;
}

// A count is checked against the bytes that could hold that many records before anything is
// reserved (a tensor info takes at least 32 bytes, an i32 4), so a corrupt count cannot make the
// reader allocate more than a genuine file of the same size would.
TEST(GgufErrors, CountsAreCheckedAgainstTheSmallestRecordBeforeAllocating) {
  auto bytes = copy_of_stories().serialize();
  const uint64_t n_tensors = bytes.size() / 2;  // passes "no more than the file's bytes"
  std::memcpy(bytes.data() + 8, &n_tensors, 8);
  std::string e = open_error(bytes, "tensorcount.gguf");
  EXPECT_NE(e.find("tensor count " + std::to_string(n_tensors) + " exceeds what the"),
            std::string::npos)
      << e;
  EXPECT_NE(e.find("bytes left for tensor infos can hold (truncated or corrupt)"),
            std::string::npos)
      << e;

  GgufWriter w;
  w.set("arr", Value::i32_array({1, 2, 3}));
  auto arr = w.serialize();
  const uint64_t left = arr.size() - (24 + 8 + 3 + 4 + 4 + 8);
  std::memcpy(arr.data() + 24 + 8 + 3 + 4 + 4, &left, 8);  // one per byte left: not 4 bytes each
  e = open_error(arr, "arraycount.gguf");
  EXPECT_NE(e.find("array length " + std::to_string(left) + " exceeds what the " +
                   std::to_string(left) + " bytes left in the file can hold"),
            std::string::npos)
      << e;
}

TEST(GgufErrors, MissingFileNamesThePath) {
  auto r = GgufFile::open("/nonexistent/model.gguf");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message.find("/nonexistent/model.gguf"), std::string::npos);
}

}  // namespace
}  // namespace vesper::gguf
