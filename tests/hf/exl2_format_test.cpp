// EXL2's on-disk format (hf/exl2_format.h, hf/exl2_pack.h): layers of every bit width, mixed
// widths, group sizes 32/64/128 and odd shapes packed, written to safetensors, read back and
// decoded, against the chosen codes and scales and against an f64 dequantizer written from the
// format's description (reference/reference_exl2.h); hand-worked words for the codes that
// straddle int32 rows and for exllamav2's padding; the fp16 rounding of scales and weights; and
// each broken layer's error, which names the file and the tensor.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "core/fp16.h"
#include "gguf/safetensors.h"
#include "hf/checkpoint.h"
#include "hf/exl2_format.h"
#include "hf/exl2_pack.h"
#include "reference/reference_exl2.h"

namespace vesper::hf {
namespace {

namespace fs = std::filesystem;
const char* kPrefix = "model.layers.0.mlp.down_proj";

// Random tests use this seed (override with VESPER_TEST_SEED) and print it on failure.
uint32_t test_seed() {
  static const uint32_t seed = [] {
    const char* env = std::getenv("VESPER_TEST_SEED");
    const uint32_t s = env ? static_cast<uint32_t>(std::strtoul(env, nullptr, 10)) : 37u;
    std::printf("exl2 tests: seed %u (set VESPER_TEST_SEED to change)\n", s);
    return s;
  }();
  return seed;
}

// A scratch directory per test.
class ScratchDir {
 public:
  ScratchDir() {
    path_ = fs::temp_directory_path() /
            ("vesper-exl2-" + std::to_string(::getpid()) + "-" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(path_);
    fs::create_directories(path_);
  }
  ~ScratchDir() { fs::remove_all(path_); }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  fs::path path_;
};

// Groups of `size` rows (the last one shorter) covering k rows, all of `bits` bits.
std::vector<Exl2PackGroup> uniform_groups(int bits, int64_t size, int64_t k) {
  std::vector<Exl2PackGroup> groups;
  for (int64_t row = 0; row < k; row += size) groups.push_back({bits, std::min(size, k - row)});
  return groups;
}

// Random codes, scale codes, fp16 scale maxima in [2^-6, 4) (so that max / 256 is a normal
// fp16) and act order, for the given groups.
Exl2PackInput random_layer(int64_t k, int64_t n, std::vector<Exl2PackGroup> groups,
                           std::mt19937& rng) {
  Exl2PackInput in;
  in.k = k;
  in.n = n;
  in.groups = std::move(groups);
  for (const Exl2PackGroup& g : in.groups) {
    std::uniform_int_distribution<int> code(0, (1 << g.bits) - 1);
    for (int64_t i = 0; i < g.rows * n; ++i) in.codes.push_back(static_cast<uint8_t>(code(rng)));
  }
  std::uniform_int_distribution<int> scale_code(0, 15);
  std::uniform_real_distribution<float> log_max(-6.0f, 2.0f);
  for (size_t g = 0; g < in.groups.size(); ++g) {
    for (int64_t c = 0; c < n; ++c) in.scale_codes.push_back(static_cast<uint8_t>(scale_code(rng)));
    in.scale_max.push_back(std::exp2(log_max(rng)));
  }
  in.perm.resize(static_cast<size_t>(k));
  for (int64_t i = 0; i < k; ++i) in.perm[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  std::shuffle(in.perm.begin(), in.perm.end(), rng);
  return in;
}

// The raw bytes of a tensor of an open file, for the reference.
std::span<const uint8_t> bytes_of(const gguf::SafetensorsFile& f, const std::string& name) {
  const gguf::SafetensorsTensor* t = f.find(name);
  EXPECT_NE(t, nullptr) << name;
  if (t == nullptr) return {};
  return {t->data, t->size_bytes};
}

// Packs `in`, writes it (with an f16 bias when asked), reads it back and checks every code,
// scale and weight against the chosen ones and the reference.
void check_round_trip(const Exl2PackInput& in, bool with_bias, const ScratchDir& dir) {
  const Exl2PackedLayer packed = pack_exl2(in);
  std::vector<gguf::SafetensorsTensorData> tensors = packed.tensors(kPrefix);
  std::vector<uint16_t> bias;
  for (int64_t c = 0; c < in.n; ++c) bias.push_back(f32_to_fp16(0.25f * static_cast<float>(c)));
  if (with_bias)
    tensors.push_back(
        {std::string(kPrefix) + ".bias", tensor::GgmlType::kF16, {in.n}, bias.data()});
  const std::string path = dir.file("layer.safetensors");
  ASSERT_TRUE(gguf::write_safetensors(path, tensors).ok());
  auto file = gguf::SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << file.error().message;
  auto read = read_exl2_layer(lookup_in(std::span(&*file, 1), path), kPrefix, in.k, in.n);
  ASSERT_TRUE(read.ok()) << read.error().message;
  const Exl2Layer& layer = *read;

  const int64_t np = (in.n + 31) / 32 * 32;
  EXPECT_EQ(layer.padded_n, np);
  EXPECT_EQ(layer.packed_rows, packed.packed_rows);
  ASSERT_EQ(layer.groups.size(), in.groups.size());
  int64_t row = 0, word_row = 0;
  std::vector<int64_t> group_of_row;
  for (size_t g = 0; g < in.groups.size(); ++g) {
    EXPECT_EQ(layer.groups[g].bits, in.groups[g].bits) << "group " << g;
    EXPECT_EQ(layer.groups[g].rows, in.groups[g].rows) << "group " << g;
    EXPECT_EQ(layer.groups[g].first_row, row) << "group " << g;
    EXPECT_EQ(layer.groups[g].first_packed_row, word_row) << "group " << g;
    row += in.groups[g].rows;
    word_row += in.groups[g].rows * in.groups[g].bits / 32;
    group_of_row.insert(group_of_row.end(), static_cast<size_t>(in.groups[g].rows),
                        static_cast<int64_t>(g));
  }
  EXPECT_EQ(word_row, packed.packed_rows);
  if (with_bias) {
    ASSERT_NE(layer.bias, nullptr);
    EXPECT_EQ(std::memcmp(layer.bias, bias.data(), bias.size() * 2), 0);
  } else {
    EXPECT_EQ(layer.bias, nullptr);
  }

  // Whole groups, all columns and a narrow range, padding included.
  for (size_t g = 0; g < in.groups.size(); ++g) {
    const Exl2Group& grp = layer.groups[g];
    std::vector<uint8_t> codes(static_cast<size_t>(grp.rows * np));
    exl2_decode_group(layer, static_cast<int64_t>(g), 0, np, codes);
    for (int64_t r = 0; r < grp.rows; ++r)
      for (int64_t c = 0; c < np; ++c) {
        const int want = c < in.n ? in.codes[static_cast<size_t>((grp.first_row + r) * in.n + c)]
                                  : 1 << (grp.bits - 1);
        ASSERT_EQ(codes[static_cast<size_t>(r * np + c)], want)
            << "group " << g << " row " << r << " column " << c;
      }
    const int64_t begin = std::min<int64_t>(3, in.n - 1), end = std::min<int64_t>(begin + 9, np);
    std::vector<uint8_t> part(static_cast<size_t>(grp.rows * (end - begin)));
    exl2_decode_group(layer, static_cast<int64_t>(g), begin, end, part);
    for (int64_t r = 0; r < grp.rows; ++r)
      for (int64_t c = begin; c < end; ++c)
        ASSERT_EQ(part[static_cast<size_t>(r * (end - begin) + c - begin)],
                  codes[static_cast<size_t>(r * np + c)]);
  }

  reference::Exl2RawLayer raw;
  raw.k = in.k;
  raw.n = in.n;
  raw.q_weight = bytes_of(*file, std::string(kPrefix) + ".q_weight");
  raw.q_invperm = bytes_of(*file, std::string(kPrefix) + ".q_invperm");
  raw.q_scale = bytes_of(*file, std::string(kPrefix) + ".q_scale");
  raw.q_scale_max = bytes_of(*file, std::string(kPrefix) + ".q_scale_max");
  raw.q_groups = bytes_of(*file, std::string(kPrefix) + ".q_groups");
  const reference::Exl2Dequantized ref = reference::dequantize_exl2(raw);

  for (int64_t j = 0; j < in.k; ++j) {
    const int64_t k = in.perm[static_cast<size_t>(j)];  // packed row j is input row k
    const int64_t g = group_of_row[static_cast<size_t>(j)];
    const int bits = in.groups[static_cast<size_t>(g)].bits;
    ASSERT_EQ(exl2_packed_row(layer, k), j);
    ASSERT_EQ(exl2_group_of(layer, j), g);
    const double max = fp16_to_f32(f32_to_fp16(in.scale_max[static_cast<size_t>(g)]));
    for (int64_t c = 0; c < in.n; ++c) {
      const size_t at = static_cast<size_t>(k * in.n + c);
      const int q = in.codes[static_cast<size_t>(j * in.n + c)];
      const int sc = in.scale_codes[static_cast<size_t>(g * in.n + c)];
      const double scale = (sc + 1) * (sc + 1) * max / 256;
      const double weight = (q - (1 << (bits - 1))) * scale;
      SCOPED_TRACE("input row " + std::to_string(k) + ", column " + std::to_string(c));
      // The reference gives the chosen values, exactly.
      ASSERT_EQ(ref.code[at], q);
      ASSERT_EQ(ref.bits[at], bits);
      ASSERT_EQ(ref.scale_code[at], sc);
      ASSERT_EQ(ref.scale[at], scale);
      ASSERT_EQ(ref.weight[at], weight);
      // The decoder gives the same codes, and the values within fp16's rounding: one rounding
      // of the scale, one of the weight (max / 256 is a normal fp16, so exact).
      ASSERT_EQ(exl2_code(layer, j, c), q);
      ASSERT_EQ(exl2_scale_code(layer, g, c), sc);
      const double s = exl2_scale(layer, g, c);
      ASSERT_LE(std::abs(s - scale), scale * 0x1p-11);
      ASSERT_LE(std::abs(exl2_weight(layer, k, c) - weight), std::abs(weight) * 0x1.01p-10);
    }
  }
}

TEST(Exl2Format, EveryBitWidthGroupSizeAndShapeDecodesToTheChosenCodes) {
  std::mt19937 rng(test_seed());
  SCOPED_TRACE("seed " + std::to_string(test_seed()));
  const ScratchDir dir;
  for (int bits : {8, 6, 5, 4, 3, 2})
    for (int64_t group_size : {32, 64, 128})
      for (int64_t k : {96, 160})
        for (int64_t n : {40, 7, 33}) {
          SCOPED_TRACE(std::to_string(bits) + " bits, groups of " + std::to_string(group_size) +
                       ", k " + std::to_string(k) + ", n " + std::to_string(n));
          check_round_trip(random_layer(k, n, uniform_groups(bits, group_size, k), rng),
                           /*with_bias=*/n == 33, dir);
          if (HasFatalFailure()) return;
        }
}

TEST(Exl2Format, MixedWidthLayersDecodeToTheChosenCodes) {
  std::mt19937 rng(test_seed() + 1);
  SCOPED_TRACE("seed " + std::to_string(test_seed() + 1));
  const ScratchDir dir;
  const std::vector<std::vector<Exl2PackGroup>> layouts = {
      {{8, 32}, {6, 64}, {4, 64}},                             // k 160
      {{6, 32}, {5, 32}, {3, 32}},                             // k 96
      {{8, 32}, {5, 32}, {4, 32}, {3, 32}, {2, 16}, {2, 16}},  // k 160, 2-bit groups of 16
      {{5, 128}, {3, 32}},                                     // k 160
      {{8, 32}, {6, 32}, {5, 32}, {4, 32}, {3, 32}, {2, 32}},  // k 192, every width
      {{4, 64}, {4, 64}, {2, 32}},                             // k 160
  };
  for (const auto& groups : layouts) {
    int64_t k = 0;
    for (const Exl2PackGroup& g : groups) k += g.rows;
    for (int64_t n : {40, 7, 33, 64}) {
      SCOPED_TRACE("k " + std::to_string(k) + ", n " + std::to_string(n) + ", " +
                   std::to_string(groups.size()) + " groups from " +
                   std::to_string(groups[0].bits) + " bits");
      check_round_trip(random_layer(k, n, groups, rng), /*with_bias=*/n == 7, dir);
      if (HasFatalFailure()) return;
    }
  }
}

// One group of 32 rows, one column: `codes` for the rows named, 0 elsewhere.
std::vector<uint32_t> column_words(int bits, const std::vector<std::pair<int, int>>& codes) {
  Exl2PackInput in;
  in.k = 32;
  in.n = 1;
  in.groups = {{bits, 32}};
  in.codes.assign(32, 0);
  for (auto [row, code] : codes) in.codes[static_cast<size_t>(row)] = static_cast<uint8_t>(code);
  in.scale_codes = {0};
  in.scale_max = {1.0f};
  const Exl2PackedLayer p = pack_exl2(in);
  std::vector<uint32_t> words;
  for (int64_t r = 0; r < p.packed_rows; ++r)
    words.push_back(p.q_weight[static_cast<size_t>(r * p.padded_n)]);
  return words;
}

TEST(Exl2Pack, CodesFormOneLittleEndianBitStreamPerColumn) {
  using W = std::vector<uint32_t>;
  // 8 and 4 bits: 4 and 8 codes a word, the first in the lowest bits.
  EXPECT_EQ(column_words(8, {{0, 0x11}, {1, 0x22}, {2, 0x33}, {3, 0x44}, {31, 0xff}}),
            (W{0x44332211u, 0, 0, 0, 0, 0, 0, 0xff000000u}));
  EXPECT_EQ(column_words(4, {{0, 1}, {1, 2}, {2, 3}, {3, 4}, {4, 5}, {5, 6}, {6, 7}, {7, 8}}),
            (W{0x87654321u, 0, 0, 0}));
  // 2 bits: 16 codes a word.
  std::vector<std::pair<int, int>> twos;
  for (int r = 0; r < 16; ++r) twos.push_back({r, r % 4});
  EXPECT_EQ(column_words(2, twos), (W{0xe4e4e4e4u, 0}));
  // 3 bits: code 10 is bits 30..32 (two in word 0, one in word 1), code 21 bits 63..65.
  EXPECT_EQ(column_words(3, {{10, 7}, {21, 5}}), (W{0xc0000000u, 0x80000001u, 0x00000002u}));
  // 5 bits: code 6 is bits 30..34, code 25 bits 125..129.
  EXPECT_EQ(column_words(5, {{6, 31}, {25, 17}}),
            (W{0xc0000000u, 0x00000007u, 0, 0x20000000u, 0x00000002u}));
  // 6 bits: code 5 is bits 30..35, code 10 bits 60..65; 16 codes in 3 words.
  EXPECT_EQ(column_words(6, {{5, 63}, {10, 33}, {16, 1}}),
            (W{0xc0000000u, 0x1000000fu, 0x00000002u, 0x00000001u, 0, 0}));
}

TEST(Exl2Pack, PaddedColumnsHoldTheZeroCodeAndScaleCode15AsExllamav2WritesThem) {
  std::mt19937 rng(test_seed() + 2);
  const Exl2PackedLayer p = pack_exl2(random_layer(64, 33, {{4, 32}, {3, 32}}, rng));
  ASSERT_EQ(p.padded_n, 64);
  ASSERT_EQ(p.packed_rows, 4 + 3);
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t c = 33; c < 64; ++c)
      EXPECT_EQ(p.q_weight[static_cast<size_t>(r * 64 + c)], 0x88888888u) << r << " " << c;
  // 3 bits: the code 4 (100b) 32 times, a 96-bit stream with every third bit set from bit 2.
  for (int64_t c = 33; c < 64; ++c) {
    EXPECT_EQ(p.q_weight[static_cast<size_t>(4 * 64 + c)], 0x24924924u);
    EXPECT_EQ(p.q_weight[static_cast<size_t>(5 * 64 + c)], 0x49249249u);
    EXPECT_EQ(p.q_weight[static_cast<size_t>(6 * 64 + c)], 0x92492492u);
  }
  for (int64_t g = 0; g < 2; ++g) {
    EXPECT_EQ(p.q_scale[static_cast<size_t>(g * 8 + 4)] & 0xfffffff0u, 0xfffffff0u);
    for (int64_t w = 5; w < 8; ++w)
      EXPECT_EQ(p.q_scale[static_cast<size_t>(g * 8 + w)], 0xffffffffu);
  }
  EXPECT_EQ(p.q_groups, (std::vector<int16_t>{4, 0, 3, 4}));
}

TEST(Exl2Format, ScalesAndWeightsRoundInFp16AsExllamav2Does) {
  const ScratchDir dir;
  Exl2PackInput in;
  in.k = 32;
  in.n = 3;
  in.groups = {{4, 32}};
  in.codes.assign(32 * 3, 8);
  in.codes[0] = 15;  // q - 8 = 7
  in.codes[1] = 0;   // -8
  in.scale_codes = {14, 0, 15};
  in.scale_max = {1.0f + 0x1p-10f};  // fp16 0x3c01
  const Exl2PackedLayer packed = pack_exl2(in);
  ASSERT_EQ(packed.q_scale_max[0], 0x3c01);
  const std::string path = dir.file("layer.safetensors");
  ASSERT_TRUE(gguf::write_safetensors(path, packed.tensors(kPrefix)).ok());
  auto file = gguf::SafetensorsFile::open(path);
  ASSERT_TRUE(file.ok()) << file.error().message;
  auto layer = read_exl2_layer(lookup_in(std::span(&*file, 1), path), kPrefix, 32, 3);
  ASSERT_TRUE(layer.ok()) << layer.error().message;
  // 225 * 1025 / 2^18 = 230625 / 2^18 needs 18 bits: fp16 keeps 11, 1801.76 * 128 -> 1802 * 128.
  EXPECT_EQ(exl2_scale(*layer, 0, 0), 1802.0f / 2048);
  // 7 * 1802 / 2048 = 12614 / 2048: 1576.75 * 8 -> 1577 * 8.
  EXPECT_EQ(exl2_weight(*layer, 0, 0), 12616.0f / 2048);
  // 1 * max / 256: exact.
  EXPECT_EQ(exl2_scale(*layer, 0, 1), (1.0f + 0x1p-10f) / 256);
  EXPECT_EQ(exl2_weight(*layer, 0, 1), -8 * (1.0f + 0x1p-10f) / 256);
  // 256 * (max / 256) = max.
  EXPECT_EQ(exl2_scale(*layer, 0, 2), 1.0f + 0x1p-10f);

  // A small maximum: max / 256 is a subnormal fp16, which keeps 2^-18 of 2^-18 + 2^-28.
  in.scale_max = {0x1p-10f + 0x1p-20f};  // fp16 0x1401
  const Exl2PackedLayer small = pack_exl2(in);
  ASSERT_EQ(small.q_scale_max[0], 0x1401);
  const std::string path2 = dir.file("small.safetensors");
  ASSERT_TRUE(gguf::write_safetensors(path2, small.tensors(kPrefix)).ok());
  file = gguf::SafetensorsFile::open(path2);
  ASSERT_TRUE(file.ok()) << file.error().message;
  layer = read_exl2_layer(lookup_in(std::span(&*file, 1), path2), kPrefix, 32, 3);
  ASSERT_TRUE(layer.ok()) << layer.error().message;
  EXPECT_EQ(exl2_scale(*layer, 0, 1), 0x1p-18f);
  EXPECT_EQ(exl2_scale(*layer, 0, 2), 0x1p-10f);  // 256 * 2^-18
}

TEST(Exl2Format, TensorsMayLieInDifferentShards) {
  std::mt19937 rng(test_seed() + 3);
  const ScratchDir dir;
  const Exl2PackedLayer p = pack_exl2(random_layer(96, 40, {{6, 32}, {4, 64}}, rng));
  std::vector<gguf::SafetensorsTensorData> tensors = p.tensors(kPrefix);
  const std::vector<gguf::SafetensorsTensorData> first(tensors.begin(), tensors.begin() + 2),
      second(tensors.begin() + 2, tensors.end());
  ASSERT_TRUE(gguf::write_safetensors(dir.file("a.safetensors"), first).ok());
  ASSERT_TRUE(gguf::write_safetensors(dir.file("b.safetensors"), second).ok());
  std::vector<gguf::SafetensorsFile> files;
  for (const char* name : {"a.safetensors", "b.safetensors"}) {
    auto f = gguf::SafetensorsFile::open(dir.file(name));
    ASSERT_TRUE(f.ok()) << f.error().message;
    files.push_back(std::move(*f));
  }
  const TensorLookup lookup = lookup_in(files, "the checkpoint");
  auto layer = read_exl2_layer(lookup, kPrefix, 96, 40);
  ASSERT_TRUE(layer.ok()) << layer.error().message;
  EXPECT_EQ(layer->groups.size(), 2u);
  // A missing tensor is reported against the checkpoint; a bad one against its shard.
  auto missing = read_exl2_layer(lookup, "model.layers.1.mlp.down_proj", 96, 40);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find(
                "the checkpoint: missing tensor model.layers.1.mlp.down_proj.q_weight"),
            std::string::npos)
      << missing.error().message;
  auto wrong = read_exl2_layer(lookup, kPrefix, 96, 72);
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.error().message.find(dir.file("b.safetensors") + ": tensor " + kPrefix +
                                       ".q_scale has shape [2, 8], expected [2, 12]"),
            std::string::npos)
      << wrong.error().message;
}

// A valid layer (k 160, n 40: 8, 6 and 4 bits), broken one way at a time.
class BrokenExl2Layer : public ::testing::Test {
 protected:
  BrokenExl2Layer() {
    std::mt19937 rng(test_seed() + 4);
    packed_ = pack_exl2(random_layer(160, 40, {{8, 32}, {6, 64}, {4, 64}}, rng));
    tensors_ = packed_.tensors(kPrefix);
  }

  gguf::SafetensorsTensorData& tensor(const std::string& part) {
    for (auto& t : tensors_)
      if (t.name == std::string(kPrefix) + "." + part) return t;
    ADD_FAILURE() << "no tensor " << part;
    return tensors_[0];
  }

  // The error read_exl2_layer gives for the tensors as edited ("" when it reads).
  std::string error(int64_t k = 160, int64_t n = 40) {
    path_ = dir_.file("layer.safetensors");
    EXPECT_TRUE(gguf::write_safetensors(path_, tensors_).ok());
    auto file = gguf::SafetensorsFile::open(path_);
    EXPECT_TRUE(file.ok()) << file.error().message;
    if (!file.ok()) return "";
    auto layer = read_exl2_layer(lookup_in(std::span(&*file, 1), path_), kPrefix, k, n);
    return layer.ok() ? "" : layer.error().message;
  }

  // Expects an error that names the file and `<prefix>.<part>`, and says `what`.
  void expect_error(const std::string& message, const std::string& part, const std::string& what) {
    EXPECT_NE(message.find(path_ + ": "), std::string::npos) << message;
    EXPECT_NE(message.find(std::string(kPrefix) + "." + part), std::string::npos) << message;
    EXPECT_NE(message.find(what), std::string::npos) << message;
  }

  const ScratchDir dir_;
  Exl2PackedLayer packed_;
  std::vector<gguf::SafetensorsTensorData> tensors_;
  std::string path_;
};

TEST_F(BrokenExl2Layer, TheUnbrokenLayerReads) {
  EXPECT_EQ(error(), "");
}

TEST_F(BrokenExl2Layer, AMissingTensorIsNamed) {
  for (const char* part : {"q_weight", "q_invperm", "q_scale", "q_scale_max", "q_groups"}) {
    tensors_ = packed_.tensors(kPrefix);
    std::erase_if(tensors_,
                  [&](const auto& t) { return t.name == std::string(kPrefix) + "." + part; });
    expect_error(error(), part, "missing tensor");
  }
}

TEST_F(BrokenExl2Layer, AWrongDtypeIsNamed) {
  tensor("q_invperm").type = tensor::GgmlType::kF32;
  expect_error(error(), "q_invperm", "has dtype F32, expected I32");
  tensors_ = packed_.tensors(kPrefix);
  tensor("q_scale_max").type = tensor::GgmlType::kBF16;
  expect_error(error(), "q_scale_max", "has dtype BF16, expected F16");
  tensors_ = packed_.tensors(kPrefix);
  tensor("q_groups").type = tensor::GgmlType::kF16;
  expect_error(error(), "q_groups", "has dtype F16, expected I16");
  tensors_ = packed_.tensors(kPrefix);
  const std::vector<float> bias(40, 0.5f);
  tensors_.push_back({std::string(kPrefix) + ".bias", tensor::GgmlType::kF32, {40}, bias.data()});
  expect_error(error(), "bias", "has dtype F32, expected F16");
}

TEST_F(BrokenExl2Layer, AShapeThatDisagreesWithTheLayerIsNamed) {
  expect_error(error(160, 72), "q_scale", "has shape [3, 8], expected [3, 12]");
  expect_error(error(128, 40), "q_invperm", "has shape [160], expected [128]");
  tensor("q_scale_max").shape = {1, 3};
  expect_error(error(), "q_scale_max", "has shape [1, 3], expected [3]");
  tensors_ = packed_.tensors(kPrefix);
  tensor("q_groups").shape = {3, 2};
  expect_error(error(), "q_groups", "has shape [3, 2]");
  tensors_ = packed_.tensors(kPrefix);
  const std::vector<uint16_t> bias(41, 0);
  tensors_.push_back({std::string(kPrefix) + ".bias", tensor::GgmlType::kF16, {41}, bias.data()});
  expect_error(error(), "bias", "has shape [41], expected [40] or, padded, [64]");
  // A padded bias is what exllamav2 loads when out_features is not a multiple of 32.
  const std::vector<uint16_t> padded(64, 0);
  tensors_.back().shape = {64};
  tensors_.back().data = padded.data();
  EXPECT_EQ(error(), "");
}

TEST_F(BrokenExl2Layer, GroupsThatDoNotCoverTheInputRowsAreNamed) {
  // 4 more int32 rows at the end: the last (4-bit) group grows to 96 rows, 192 in all.
  std::vector<uint32_t> longer = packed_.q_weight;
  longer.resize(longer.size() + 4 * 64, 0x88888888u);
  tensor("q_weight").shape = {packed_.packed_rows + 4, 64};
  tensor("q_weight").data = longer.data();
  expect_error(error(), "q_groups", "the groups cover 192 input rows");
  expect_error(error(), "q_groups", "but the layer has 160");
  // Group 1 starting later: group 0 then spans 9 int32 rows, 36 8-bit rows.
  tensors_ = packed_.tensors(kPrefix);
  std::vector<int16_t> groups = packed_.q_groups;
  tensor("q_groups").data = groups.data();
  const auto reset = [&] {
    std::copy(packed_.q_groups.begin(), packed_.q_groups.end(), groups.begin());
  };
  groups[3] = 9;
  expect_error(error(), "q_groups", "group 0 has 36 rows of 8 bits, not a multiple of 32");
  // Group 2 starting past q_weight's end (28 rows), group 1 then 24 int32 rows of 6 bits.
  reset();
  groups[5] = 32;
  expect_error(error(), "q_groups", "group 2 starts at packed row 32, not before the end of");
  // Group 1 starting where group 0 does.
  reset();
  groups[3] = 0;
  expect_error(error(), "q_groups", "group 0 starts at packed row 0, not before where group 1");
  // A 6-bit group of a row count that is not a whole number of int32 rows.
  reset();
  groups[5] = 19;
  expect_error(error(), "q_groups", "group 1 spans 11 packed rows");
  reset();
  groups[1] = 1;
  expect_error(error(), "q_groups", "group 0 starts at packed row 1, expected 0");
}

TEST_F(BrokenExl2Layer, BadBitWidthsAreNamed) {
  std::vector<int16_t> groups = packed_.q_groups;
  tensor("q_groups").data = groups.data();
  const auto reset = [&] {
    std::copy(packed_.q_groups.begin(), packed_.q_groups.end(), groups.begin());
  };
  groups[2] = 7;
  expect_error(error(), "q_groups", "group 1 has bits 7, expected 2, 3, 4, 5, 6 or 8");
  reset();
  groups[0] = 0;
  expect_error(error(), "q_groups", "group 0 has bits 0");
  reset();
  groups[0] = 4;  // 8 int32 rows of 4 bits: 64 rows, then a wider group
  expect_error(error(), "q_groups", "group 1 has bits 6 after a group of 4");
}

TEST_F(BrokenExl2Layer, AnInvpermThatIsNotAPermutationIsNamed) {
  std::vector<int32_t> invperm = packed_.q_invperm;
  tensor("q_invperm").data = invperm.data();
  invperm[7] = invperm[3];
  expect_error(
      error(), "q_invperm",
      std::to_string(invperm[3]) + " appears twice (it must be a permutation of [0, 160))");
  std::copy(packed_.q_invperm.begin(), packed_.q_invperm.end(), invperm.begin());
  invperm[5] = 160;
  expect_error(error(), "q_invperm", "entry 5 is 160, outside [0, 160)");
  invperm[5] = -1;
  expect_error(error(), "q_invperm", "entry 5 is -1, outside [0, 160)");
}

TEST_F(BrokenExl2Layer, ANonFiniteScaleMaximumIsNamed) {
  std::vector<uint16_t> max = packed_.q_scale_max;
  max[2] = 0x7c00;  // +inf
  tensor("q_scale_max").data = max.data();
  expect_error(error(), "q_scale_max", "the value of group 2 is not finite");
}

// Safetensors files now hold integer tensors; a plain checkpoint's loader must not take one for
// a weight.
TEST(HfIntegerTensors, AnIntegerTensorWhereAFloatIsExpectedIsNamed) {
  const ScratchDir dir;
  const std::string fixture = "../shared/models/hf/tiny-random-llama3/";
  const std::string ckpt = dir.file("ckpt");
  fs::create_directories(ckpt);
  fs::copy_file(fixture + "config.json", ckpt + "/config.json");
  auto src = gguf::SafetensorsFile::open(fixture + "model.safetensors");
  ASSERT_TRUE(src.ok()) << src.error().message;
  std::vector<gguf::SafetensorsTensorData> tensors;
  for (const auto& t : src->tensors()) {
    tensors.push_back({t.name, t.type, t.shape, t.data});
    if (t.name == "model.layers.0.mlp.up_proj.weight") {
      ASSERT_EQ(t.type, tensor::GgmlType::kBF16);
      tensors.back().type = tensor::GgmlType::kI16;  // the same bytes, read as integers
    }
  }
  ASSERT_TRUE(gguf::write_safetensors(ckpt + "/model.safetensors", tensors).ok());
  auto loaded = load_checkpoint(ckpt);
  ASSERT_FALSE(loaded.ok());
  EXPECT_NE(loaded.error().message.find(ckpt + "/model.safetensors: tensor "
                                               "model.layers.0.mlp.up_proj.weight has dtype I16, "
                                               "expected F32, F16 or BF16"),
            std::string::npos)
      << loaded.error().message;
}

}  // namespace
}  // namespace vesper::hf
