#include "engine/output_processor.h"

#include <algorithm>

#include "core/logging.h"
#include "sample/sampler.h"

namespace vesper::engine {

OutputProcessor::OutputProcessor(const tokenizer::Tokenizer& tokenizer, int64_t max_model_len)
    : tokenizer_(tokenizer), max_model_len_(max_model_len) {}

OutputProcessor::SampleState OutputProcessor::new_sample(const RequestState& request, int32_t index,
                                                         kv::SeqId seq_id) const {
  SampleState s;
  s.seq_id = seq_id;
  s.index = index;
  s.output = std::make_unique<SequenceOutput>(tokenizer_, request.request.params, index);
  return s;
}

OutputProcessor::RequestState& OutputProcessor::add(EngineRequest request, kv::SeqId seq_id,
                                                    double now) {
  auto state = std::make_unique<RequestState>();
  state->request = std::move(request);
  state->metrics.arrival_time = now;
  state->samples.push_back(new_sample(*state, 0, seq_id));
  seq_owner_[seq_id] = {state.get(), 0};
  RequestState& ref = *state;
  requests_.emplace(ref.request.request_id, std::move(state));
  return ref;
}

void OutputProcessor::add_finished(const EngineRequest& request, double now) {
  RequestOutput out;
  out.request_id = request.request_id;
  out.prompt_token_ids = request.prompt_token_ids;
  out.finished = true;
  out.metrics.arrival_time = now;
  out.metrics.finished_time = now;
  for (int32_t i = 0; i < request.params.n; ++i) {
    CompletionOutput c;
    c.index = i;
    c.finish_reason = "length";
    out.outputs.push_back(std::move(c));
  }
  finished_early_.push_back(std::move(out));
}

kv::SeqId OutputProcessor::first_sequence(const std::string& request_id) const {
  auto it = requests_.find(request_id);
  return it == requests_.end() || it->second->samples.empty() ? 0 : it->second->samples[0].seq_id;
}

OutputProcessor::RequestState* OutputProcessor::owner(kv::SeqId seq_id, int32_t* index) const {
  auto it = seq_owner_.find(seq_id);
  if (it == seq_owner_.end()) return nullptr;
  if (index != nullptr) *index = it->second.second;
  return it->second.first;
}

void OutputProcessor::fork(kv::SeqId parent, kv::SeqId child) {
  RequestState* request = owner(parent, nullptr);
  if (request == nullptr) return;
  const auto index = static_cast<int32_t>(request->samples.size());
  request->samples.push_back(new_sample(*request, index, child));
  seq_owner_[child] = {request, index};
}

void OutputProcessor::touch(RequestState& request) {
  if (request.touched) return;
  request.touched = true;
  touched_.push_back(&request);
}

void OutputProcessor::on_first_scheduled(kv::SeqId seq_id, int64_t num_cached_tokens, double now) {
  RequestState* request = owner(seq_id, nullptr);
  if (request == nullptr || request->metrics.first_scheduled_time != 0) return;
  request->metrics.first_scheduled_time = now;
  request->num_cached_tokens = num_cached_tokens;
}

void OutputProcessor::on_preempted(kv::SeqId seq_id) {
  if (RequestState* request = owner(seq_id, nullptr)) ++request->metrics.num_preemptions;
}

int64_t OutputProcessor::process(const sched::ModelRunnerOutput& step, double sampled_at,
                                 std::vector<TextFinish>& text_finishes) {
  int64_t taken = 0;
  for (const sched::SampledSequence& r : step.sequences) {
    int32_t index = 0;
    RequestState* request = owner(r.id, &index);
    if (request == nullptr) continue;
    SequenceOutput& out = *request->samples[static_cast<size_t>(index)].output;
    const auto prompt = static_cast<int64_t>(request->request.prompt_token_ids.size());
    touch(*request);
    if (request->metrics.first_token_time == 0) request->metrics.first_token_time = sampled_at;
    request->metrics.last_token_time = sampled_at;
    if (!r.constraint_error.empty()) {
      out.set_constraint_error(r.constraint_error);
      log_warning("request %s: %s; its output ends here", request->request.request_id.c_str(),
                  r.constraint_error.c_str());
    }
    for (size_t j = 0; j < r.token_ids.size(); ++j) {
      const int64_t length = prompt + out.num_generated() + 1;
      out.add_token(r.token_ids[j], j < r.logprobs.size() ? &r.logprobs[j] : nullptr,
                    length >= max_model_len_);
      ++taken;
      if (!out.finished()) continue;
      seq_owner_.erase(r.id);
      // The runner stops at the same stop tokens, EOS and lengths, so a sequence that ends at its
      // step's last token where the runner ended it is gone already; any other end is text.
      if (!(r.finished && j + 1 == r.token_ids.size())) text_finishes.push_back({r.id, length});
      break;
    }
  }
  return taken;
}

RequestOutput OutputProcessor::make_output(RequestState& request, double now) {
  RequestOutput out;
  out.request_id = request.request.request_id;
  out.num_cached_tokens = request.num_cached_tokens;
  out.finished = static_cast<int32_t>(request.samples.size()) == request.request.params.n;
  for (auto& s : request.samples) {
    out.outputs.push_back(s.output->take_output());
    out.finished = out.finished && s.output->finished();
  }
  if (out.finished) {
    request.metrics.finished_time = now;
    out.prompt_token_ids = request.request.prompt_token_ids;
  }
  out.metrics = request.metrics;
  return out;
}

std::vector<RequestOutput> OutputProcessor::take_outputs(double now) {
  std::vector<RequestOutput> outputs = std::move(finished_early_);
  finished_early_.clear();
  for (RequestState* request : touched_) {
    request->touched = false;
    RequestOutput out = make_output(*request, now);
    const bool done = out.finished;
    const std::string id = request->request.request_id;
    outputs.push_back(std::move(out));
    if (done) requests_.erase(id);
  }
  touched_.clear();
  return outputs;
}

std::optional<std::vector<kv::SeqId>> OutputProcessor::abort(const std::string& request_id,
                                                             RequestOutput* final_output,
                                                             double now) {
  auto it = requests_.find(request_id);
  if (it == requests_.end()) return std::nullopt;
  RequestState& request = *it->second;
  std::vector<kv::SeqId> seqs;
  for (auto& s : request.samples) {
    if (s.seq_id != 0) {
      seqs.push_back(s.seq_id);
      seq_owner_.erase(s.seq_id);
    }
    if (!s.output->finished()) s.output->abort();
  }
  if (final_output != nullptr) {
    // Samples not forked yet (n > 1 before the prompt's first token) end with nothing generated.
    for (auto k = static_cast<int32_t>(request.samples.size()); k < request.request.params.n; ++k) {
      request.samples.push_back(new_sample(request, k, 0));
      request.samples.back().output->abort();
    }
    *final_output = make_output(request, now);
  }
  std::erase(touched_, &request);
  requests_.erase(it);
  return seqs;
}

}  // namespace vesper::engine
