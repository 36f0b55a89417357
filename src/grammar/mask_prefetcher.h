// MaskPrefetcher: computes grammar masks on a thread of its own, ahead of the step that needs
// them, so that the step loop does not walk the vocabulary trie (~10 ms a mask on a 32,000-token
// vocabulary) while every running sequence waits.
//
// The runner knows a constrained sequence's next state as soon as it has sampled a token; the
// mask of that state is needed only when the next step samples, after a forward pass. The runner
// hands the state here (request()), this thread computes its mask into the grammar's cache, and
// the next step finds it there (CompiledGrammar::allowed; a mask still being computed is waited
// for, never computed twice). Nothing depends on whether the prefetch won the race: a mask is a
// function of the state, so outputs are the same with or without this thread.
//
// Requests beyond a bound are dropped (the step computes those masks itself), so a flood of
// constrained sequences cannot grow the queue without limit. Thread-safe.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "grammar/compiled_grammar.h"

namespace vesper::grammar {

class MaskPrefetcher {
 public:
  static constexpr size_t kMaxQueued = 4096;

  MaskPrefetcher();
  // Ends the thread after the mask it is computing (queued requests are dropped).
  ~MaskPrefetcher();
  MaskPrefetcher(const MaskPrefetcher&) = delete;
  MaskPrefetcher& operator=(const MaskPrefetcher&) = delete;

  // Computes `state`'s mask of `grammar` unless it is cached or being computed already.
  void request(std::shared_ptr<const CompiledGrammar> grammar, StateId state);
  // Blocks until every request so far is done (for tests and benchmarks).
  void wait_idle();
  // Masks this thread computed.
  int64_t num_computed() const;

 private:
  struct Request {
    std::shared_ptr<const CompiledGrammar> grammar;
    StateId state;
  };
  void run();

  mutable std::mutex mu_;
  std::condition_variable wake_;  // a request came, or the prefetcher stops
  std::condition_variable idle_;  // the queue emptied and nothing is being computed
  std::deque<Request> queue_;
  bool busy_ = false;
  bool stop_ = false;
  int64_t num_computed_ = 0;
  std::thread thread_;  // last: starts once the members above exist
};

}  // namespace vesper::grammar
