// AsyncEngine on stories260K: requests from several threads, aborts racing the engine thread,
// callbacks that call back in, callbacks that throw, and shutdown with and without a deadline;
// the same traffic with the engine planning ahead on a runner thread in multi-step plans (and
// outputs delivered from its output thread).
// Built and run under ThreadSanitizer too (the `tsan` preset), so every path here is also a
// data-race check.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>

#include "engine/async_engine.h"
#include "engine/engine_test_util.h"

namespace vesper::engine {
namespace {

using testing_util::make_engine;
using testing_util::stories_config;

using testing_util::greedy;

// Collects one request's outputs; wait() blocks until its last output or its error.
struct Collector {
  std::mutex mutex;
  std::condition_variable cv;
  std::vector<RequestOutput> outputs;
  std::optional<AsyncEngine::RequestError> error;
  bool done = false;

  AsyncEngine::OutputCallback on_output() {
    return [this](const RequestOutput& out) {
      std::lock_guard<std::mutex> lock(mutex);
      outputs.push_back(out);
      if (out.finished) {
        done = true;
        cv.notify_all();
      }
    };
  }
  AsyncEngine::ErrorCallback on_error() {
    return [this](const AsyncEngine::RequestError& e) {
      std::lock_guard<std::mutex> lock(mutex);
      error = e;
      done = true;
      cv.notify_all();
    };
  }
  void wait() {
    std::unique_lock<std::mutex> lock(mutex);
    cv.wait(lock, [&] { return done; });
  }
  int64_t generated() {
    std::lock_guard<std::mutex> lock(mutex);
    int64_t n = 0;
    for (const auto& o : outputs)
      for (const auto& c : o.outputs) n += static_cast<int64_t>(c.delta_token_ids.size());
    return n;
  }
};

std::vector<int32_t> prompt_of(const AsyncEngine& e, const std::string& text) {
  return e.tokenizer().encode(text, true, false);
}

TEST(AsyncEngine, RequestsFromManyThreadsAllFinishWithTheirTokens) {
  AsyncEngine engine(make_engine(stories_config()));
  constexpr int kThreads = 4, kPerThread = 8;
  std::vector<std::unique_ptr<Collector>> collectors;
  for (int i = 0; i < kThreads * kPerThread; ++i)
    collectors.push_back(std::make_unique<Collector>());
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        const int k = t * kPerThread + i;
        engine.add_request(
            {"r" + std::to_string(k), prompt_of(engine, "Once upon a time"), greedy(5 + k % 7), 0},
            collectors[k]->on_output(), collectors[k]->on_error());
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int k = 0; k < kThreads * kPerThread; ++k) {
    collectors[k]->wait();
    EXPECT_FALSE(collectors[k]->error) << k;
    EXPECT_EQ(collectors[k]->generated(), 5 + k % 7) << k;
  }
  engine.shutdown(5);
  EXPECT_EQ(engine.num_unfinished(), 0);
}

// Async scheduling, multi-step plans and the output thread: three threads of the engine's own
// beside the callers'. Greedy requests from several threads get the tokens they get alone, and
// aborts racing them leave nothing behind.
TEST(AsyncEngine, PlanningAheadInMultiStepPlansServesThreadsAndAborts) {
  EngineConfig c = stories_config();
  c.async_scheduling = EngineConfig::AsyncScheduling::kOn;
  c.scheduler.num_scheduler_steps = 4;
  const auto alone = testing_util::run_texts(stories_config(), {"Once upon a time"},
                                             testing_util::greedy_params(24));
  const std::vector<int32_t>& expected = alone.outputs.at("0").outputs[0].token_ids;
  AsyncEngine engine(make_engine(c));
  constexpr int kRequests = 24;
  std::vector<std::unique_ptr<Collector>> collectors;
  for (int i = 0; i < kRequests; ++i) collectors.push_back(std::make_unique<Collector>());
  std::thread adder([&] {
    for (int i = 0; i < kRequests; ++i)
      engine.add_request({"r" + std::to_string(i), prompt_of(engine, "Once upon a time"),
                          testing_util::greedy_params(24), 0},
                         collectors[i]->on_output(), collectors[i]->on_error());
  });
  std::thread aborter([&] {
    for (int i = 0; i < kRequests; i += 3) engine.abort("r" + std::to_string(i));
  });
  adder.join();
  aborter.join();
  for (int i = 1; i < kRequests; i += 3) {
    collectors[i]->wait();
    std::vector<int32_t> tokens;
    for (const auto& o : collectors[i]->outputs)
      tokens.insert(tokens.end(), o.outputs[0].delta_token_ids.begin(),
                    o.outputs[0].delta_token_ids.end());
    EXPECT_EQ(tokens, expected) << i;
  }
  engine.shutdown(5);
  EXPECT_EQ(engine.num_unfinished(), 0);
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
}

TEST(AsyncEngine, MaxTokensZeroOnAnIdleEngineIsAnsweredWithoutOtherTraffic) {
  AsyncEngine engine(make_engine(stories_config()));
  Collector c;
  engine.add_request({"zero", prompt_of(engine, "Once"), greedy(0), 0}, c.on_output(),
                     c.on_error());
  c.wait();  // hung before: the engine thread waited for work that was already done
  ASSERT_EQ(c.outputs.size(), 1u);
  EXPECT_TRUE(c.outputs[0].finished);
  EXPECT_EQ(c.outputs[0].outputs[0].finish_reason, "length");
}

TEST(AsyncEngine, AbortsRacingTheEngineThreadLeaveNothingBehind) {
  AsyncEngine engine(make_engine(stories_config()));
  constexpr int kRequests = 40;
  std::vector<std::unique_ptr<Collector>> collectors;
  for (int i = 0; i < kRequests; ++i) collectors.push_back(std::make_unique<Collector>());
  std::thread adder([&] {
    for (int i = 0; i < kRequests; ++i)
      engine.add_request({"r" + std::to_string(i),
                          prompt_of(engine, "Lily and Ben went to the park"), greedy(40), 0},
                         collectors[i]->on_output(), collectors[i]->on_error());
  });
  std::thread aborter([&] {
    for (int i = 0; i < kRequests; i += 2) engine.abort("r" + std::to_string(i));
  });
  adder.join();
  aborter.join();
  for (int i = 1; i < kRequests; i += 2) collectors[i]->wait();
  // Aborted requests get no more callbacks once the abort is processed; the rest finish.
  engine.shutdown(5);
  EXPECT_EQ(engine.num_unfinished(), 0);
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
}

TEST(AsyncEngine, AnErrorCallbackMayAbortSiblingsDuringShutdown) {
  // The deadlock: add_request refused during shutdown called the error callback with the queue
  // lock held, and the callback's abort() took the lock again.
  AsyncEngine engine(make_engine(stories_config()));
  Collector running;
  engine.add_request({"long", prompt_of(engine, "Once upon a time"), greedy(300), 0},
                     running.on_output(), running.on_error());
  std::thread stopper([&] { engine.shutdown(30); });
  while (engine.accepting()) std::this_thread::yield();
  std::atomic<bool> refused{false};
  engine.add_request(
      {"late", prompt_of(engine, "Hi"), greedy(3), 0}, [](const RequestOutput&) {},
      [&](const AsyncEngine::RequestError& e) {
        EXPECT_EQ(e.kind, AsyncEngine::RequestError::Kind::kShuttingDown);
        engine.abort("late-sibling");
        refused = true;
      });
  EXPECT_TRUE(refused.load());
  stopper.join();
  running.wait();
  EXPECT_EQ(running.generated(), 300);  // in-flight work finished within the timeout
}

TEST(AsyncEngine, TheShutdownDeadlineEndsEveryRequestWithAnAbortOutput) {
  AsyncEngine engine(make_engine(stories_config()));
  std::vector<std::unique_ptr<Collector>> collectors;
  // 500 steps each: far longer than the 1 ms deadline on any build.
  sample::SamplingParams two = greedy(500);
  two.n = 2;
  for (int i = 0; i < 3; ++i) {
    collectors.push_back(std::make_unique<Collector>());
    engine.add_request({"r" + std::to_string(i), prompt_of(engine, "Once upon a time"),
                        i == 2 ? two : greedy(500), 0},
                       collectors.back()->on_output(), collectors.back()->on_error());
  }
  engine.shutdown(0.001);
  for (auto& c : collectors) {
    c->wait();
    ASSERT_FALSE(c->outputs.empty());
    const RequestOutput& last = c->outputs.back();
    EXPECT_TRUE(last.finished);
    for (const auto& out : last.outputs) EXPECT_EQ(out.finish_reason, "abort");
  }
  EXPECT_EQ(collectors[2]->outputs.back().outputs.size(), 2u);
  EXPECT_EQ(engine.num_unfinished(), 0);
}

TEST(AsyncEngine, ACallbackThatThrowsAbortsItsRequestAndTheEngineGoesOn) {
  AsyncEngine engine(make_engine(stories_config()));
  std::atomic<int> calls{0};
  engine.add_request(
      {"bad", prompt_of(engine, "Once upon a time"), greedy(50), 0},
      [&](const RequestOutput&) {
        ++calls;
        throw std::runtime_error("client bug");
      },
      nullptr);
  Collector good;
  engine.add_request({"good", prompt_of(engine, "The little dog"), greedy(20), 0}, good.on_output(),
                     good.on_error());
  good.wait();
  EXPECT_EQ(good.generated(), 20);
  engine.shutdown(5);
  EXPECT_EQ(calls.load(), 1);  // no output after the throw
  EXPECT_EQ(engine.num_unfinished(), 0);
  EXPECT_EQ(engine.stats().kv_blocks_used, 0);
}

TEST(AsyncEngine, WaitingCountsOnlyRequestsBeyondFreeSequenceSlots) {
  EngineConfig config = stories_config();
  config.scheduler.max_num_seqs = 4;
  AsyncEngine engine(make_engine(config));
  EXPECT_EQ(engine.num_waiting(), 0);
  std::vector<std::unique_ptr<Collector>> collectors;
  for (int i = 0; i < 10; ++i) {
    collectors.push_back(std::make_unique<Collector>());
    engine.add_request(
        {"r" + std::to_string(i), prompt_of(engine, "Once upon a time"), greedy(200), 0},
        collectors.back()->on_output(), collectors.back()->on_error());
  }
  // At most 10 submitted, 4 slots: at most 6 wait, whatever the engine thread has picked up.
  EXPECT_LE(engine.num_waiting(), 6);
  for (auto& c : collectors) c->wait();
  engine.shutdown(5);
}

}  // namespace
}  // namespace vesper::engine
