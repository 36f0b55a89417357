// OutputProcessor: the engine's per-request output state. For each request: its samples (one
// SequenceOutput each: incremental detokenization, stop strings and tokens, EOS, length limits),
// their random state for sampling, its metrics, and which of them changed in the current step.
// The engine tells it which sequence got which token; it says when a sequence is done and builds
// the RequestOutputs a step reports (deltas, and everything once finished).
#pragma once

#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/engine_request.h"
#include "engine/request_output.h"
#include "engine/sequence_output.h"
#include "kv/kv_cache_manager.h"
#include "tokenizer/tokenizer.h"

namespace vesper::engine {

class OutputProcessor {
 public:
  // One of a request's samples.
  struct SampleState {
    kv::SeqId seq_id = 0;  // 0 for a sample never scheduled (aborted before its fork)
    int32_t index = 0;
    std::mt19937_64 rng;
    grammar::GrammarCursor grammar_cursor;  // its place in params.grammar (structured output)
    std::unique_ptr<SequenceOutput> output;
  };
  struct RequestState {
    EngineRequest request;
    std::vector<SampleState> samples;  // samples[0] from the start; the others once forked
    RequestMetrics metrics;
    int64_t num_cached_tokens = 0;
    bool touched = false;  // has something to report this step
  };

  OutputProcessor(const tokenizer::Tokenizer& tokenizer, int64_t max_model_len);

  bool contains(const std::string& request_id) const { return requests_.count(request_id) != 0; }
  // Requests registered and not yet reported finished.
  bool has_unfinished() const { return !requests_.empty() || !finished_early_.empty(); }
  int64_t num_requests() const { return static_cast<int64_t>(requests_.size()); }

  // Registers a request whose first sample is sequence `seq_id`.
  RequestState& add(EngineRequest request, kv::SeqId seq_id, double now);
  // A request with nothing to generate (max_tokens 0): finished at once, reported by the next
  // take_outputs().
  void add_finished(const EngineRequest& request, double now);

  // The sequence of a request's first sample (0: unknown request).
  kv::SeqId first_sequence(const std::string& request_id) const;
  // The request and sample a scheduled sequence belongs to (nullptr: unknown).
  RequestState* owner(kv::SeqId seq_id, int32_t* index) const;
  // Adds the other n - 1 samples of a request, forked from sample 0: sequences child_ids[k - 1].
  void fork(RequestState& request, const std::vector<kv::SeqId>& child_ids);
  // A sample gained a token (with its logprobs when asked); true when it is now finished.
  bool add_token(RequestState& request, int32_t index, int32_t token, const LogprobEntry* logprob,
                 bool at_length_limit, double now);
  // Records where a request's first step starts (its prefix-cache hit) and when.
  void on_first_scheduled(RequestState& request, int64_t num_cached_tokens, double now);

  // The outputs of every request with something new, in the order they changed; finished
  // requests are forgotten.
  std::vector<RequestOutput> take_outputs(double now);

  // Forgets a request; with `final_output`, reports what it had: every unfinished sample ends
  // with finish_reason "abort". Returns the sequences it held (to remove from the scheduler), or
  // nothing for an unknown id.
  std::optional<std::vector<kv::SeqId>> abort(const std::string& request_id,
                                              RequestOutput* final_output, double now);

 private:
  RequestOutput make_output(RequestState& request, double now);
  SampleState new_sample(const RequestState& request, int32_t index, kv::SeqId seq_id) const;

  const tokenizer::Tokenizer& tokenizer_;
  int64_t max_model_len_;
  std::map<std::string, std::unique_ptr<RequestState>> requests_;
  std::map<kv::SeqId, std::pair<RequestState*, int32_t>>
      seq_owner_;                       // sequence -> (request, sample)
  std::vector<RequestState*> touched_;  // in the order they changed
  std::vector<RequestOutput> finished_early_;
};

}  // namespace vesper::engine
