// Base URL parsing and the benchmark's prompts (random words, JSONL datasets).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <set>

#include "client/prompts.h"
#include "client/url.h"

namespace vesper::client {
namespace {

TEST(Url, ParsesHostPortAndPrefix) {
  auto u = Url::parse("http://127.0.0.1:8000");
  ASSERT_TRUE(u.ok()) << u.error().message;
  EXPECT_EQ(u->host, "127.0.0.1");
  EXPECT_EQ(u->port, "8000");
  EXPECT_EQ(u->prefix, "");
  EXPECT_EQ(u->host_header(), "127.0.0.1:8000");
  EXPECT_EQ(u->str("/v1/completions"), "http://127.0.0.1:8000/v1/completions");

  auto p = Url::parse("http://localhost/api/");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->port, "80");
  EXPECT_EQ(p->prefix, "/api");
  EXPECT_EQ(p->host_header(), "localhost");

  auto v6 = Url::parse("http://[::1]:9000");
  ASSERT_TRUE(v6.ok()) << v6.error().message;
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->host_header(), "[::1]:9000");
}

TEST(Url, RejectsWhatItCannotUseAndSaysWhy) {
  for (const char* bad : {"127.0.0.1:8000", "https://127.0.0.1", "http://", "http://:80",
                          "http://h:0", "http://h:99999", "http://h:8x", "http://h:", "http://[::1",
                          "http://h/x?y=1", "http://u:p@h"}) {
    auto u = Url::parse(bad);
    ASSERT_FALSE(u.ok()) << bad;
    EXPECT_NE(u.error().message.find(std::string("\"") + bad + "\""), std::string::npos)
        << u.error().message;
  }
  EXPECT_NE(Url::parse("https://x").error().message.find("https is not supported"),
            std::string::npos);
}

TEST(RandomRequests, WordsPerPromptDifferPerRequestSeeded) {
  const auto a = random_requests(20, 128, 64, 5);
  ASSERT_EQ(a.size(), 20u);
  std::set<std::string> distinct;
  for (const auto& r : a) {
    EXPECT_EQ(count_words(r.prompt), 128);
    EXPECT_EQ(r.prompt_len, 128);
    EXPECT_EQ(r.output_len, 64);
    distinct.insert(r.prompt);
  }
  EXPECT_EQ(distinct.size(), 20u);
  const auto b = random_requests(20, 128, 64, 5);
  const auto c = random_requests(20, 128, 64, 6);
  EXPECT_EQ(a[7].prompt, b[7].prompt);
  EXPECT_NE(a[7].prompt, c[7].prompt);
}

class DatasetFile : public ::testing::Test {
 protected:
  std::string write(const std::string& text) {
    path_ = ::testing::TempDir() + "vesper_client_dataset_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".jsonl";
    std::ofstream(path_) << text;
    return path_;
  }
  void TearDown() override { std::remove(path_.c_str()); }
  std::string path_;
};

TEST_F(DatasetFile, ReadsPromptsAndOutputLens) {
  const std::string path = write(
      "{\"prompt\": \"a b c\", \"output_len\": 7}\n\n{\"prompt\": \"hello\"}\n{\"prompt\": "
      "\"x\"}\n");
  auto reqs = load_dataset(path, 2, 33);
  ASSERT_TRUE(reqs.ok()) << reqs.error().message;
  ASSERT_EQ(reqs->size(), 2u);
  EXPECT_EQ((*reqs)[0].prompt, "a b c");
  EXPECT_EQ((*reqs)[0].prompt_len, 3);
  EXPECT_EQ((*reqs)[0].output_len, 7);
  EXPECT_EQ((*reqs)[1].output_len, 33);
}

TEST_F(DatasetFile, ErrorsNameFileAndLine) {
  const std::string path = write("{\"prompt\": \"ok\"}\n{\"text\": \"no prompt\"}\n");
  auto reqs = load_dataset(path, 10, 8);
  ASSERT_FALSE(reqs.ok());
  EXPECT_NE(reqs.error().message.find(path + ":2:"), std::string::npos) << reqs.error().message;
  const std::string bad_len = write("{\"prompt\": \"ok\", \"output_len\": 0}\n");
  EXPECT_NE(load_dataset(bad_len, 10, 8).error().message.find("output_len"), std::string::npos);
  EXPECT_NE(
      load_dataset("/nonexistent/d.jsonl", 10, 8).error().message.find("/nonexistent/d.jsonl"),
      std::string::npos);
}

}  // namespace
}  // namespace vesper::client
