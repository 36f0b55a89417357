// OutputProcessor: the engine's per-request output state. For each request: its samples (one
// SequenceOutput each: incremental detokenization, stop strings and tokens, EOS, length limits),
// its metrics, and which of them changed since the outputs were last taken. It takes a step's
// ModelRunnerOutput (the tokens each sequence committed), says which sequences its stop strings
// ended (the runner ends sequences at stop tokens, EOS and length itself), and builds the
// RequestOutputs (deltas, and everything once finished).
//
// One thread at a time: the engine's, or the engine's output thread while the next step computes
// (asynchronous output processing); the engine hands it over and back (engine/job_thread.h).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/engine_request.h"
#include "engine/request_output.h"
#include "engine/sequence_output.h"
#include "kv/kv_cache_manager.h"
#include "sched/runner_output.h"
#include "tokenizer/tokenizer.h"

namespace vesper::engine {

class OutputProcessor {
 public:
  // One of a request's samples.
  struct SampleState {
    kv::SeqId seq_id = 0;  // 0 for a sample never scheduled (aborted before its fork)
    int32_t index = 0;
    std::unique_ptr<SequenceOutput> output;
  };
  struct RequestState {
    EngineRequest request;
    std::vector<SampleState> samples;  // samples[0] from the start; the others once forked
    RequestMetrics metrics;
    int64_t num_cached_tokens = 0;
    bool touched = false;  // has something to report
  };
  // A sequence whose output ended without the runner knowing (a stop string): the engine removes
  // it, keeping its first num_tokens tokens (prompt and output kept) and nothing after.
  struct TextFinish {
    kv::SeqId seq_id = 0;
    int64_t num_tokens = 0;
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
  // The request and sample a sequence belongs to (nullptr: unknown).
  RequestState* owner(kv::SeqId seq_id, int32_t* index) const;
  // Sequence `child` is the next sample of the request that sequence `parent` belongs to.
  void fork(kv::SeqId parent, kv::SeqId child);
  // Records where a request's first step starts (its prefix-cache hit) and when.
  void on_first_scheduled(kv::SeqId seq_id, int64_t num_cached_tokens, double now);
  void on_preempted(kv::SeqId seq_id);

  // A step's tokens, sampled at `sampled_at`: each sequence's tokens go to its sample in order
  // until one ends it (a stop string, EOS, a stop token, a length limit); tokens of unknown
  // sequences (aborted, or ended by an earlier step's stop string) and those after an end are
  // dropped. Appends to `text_finishes` the sequences a stop string ended, and returns the tokens
  // taken.
  int64_t process(const sched::ModelRunnerOutput& step, double sampled_at,
                  std::vector<TextFinish>& text_finishes);

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
  void touch(RequestState& request);

  const tokenizer::Tokenizer& tokenizer_;
  int64_t max_model_len_;
  std::map<std::string, std::unique_ptr<RequestState>> requests_;
  std::map<kv::SeqId, std::pair<RequestState*, int32_t>>
      seq_owner_;                       // sequence -> (request, sample)
  std::vector<RequestState*> touched_;  // in the order they changed
  std::vector<RequestOutput> finished_early_;
};

}  // namespace vesper::engine
