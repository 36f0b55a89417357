#include "model/model.h"

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/error_text.h"
#include "gguf/composite_weight.h"
#include "hf/model_file.h"
#include "model/shard_commands.h"
#include "tensor/quant.h"

namespace vesper::model {
namespace {

// Whether a matrix is split across the ranks of a tensor-parallel group: by output rows, which
// keeps every output's whole dot product on one rank (so its bits are one process's).
enum class Split { kNone, kOutputs };

class Binder {
 public:
  Binder(const gguf::GgufFile& file, backend::Backend& backend, int rank, int ranks)
      : file_(file), backend_(backend), rank_(rank), ranks_(ranks) {}

  const gguf::TensorInfo* find(const std::string& name) const { return file_.find_tensor(name); }

  // Whether the file holds matrix `name`, as one tensor or as a composite weight's parts.
  bool has_matrix(const std::string& name) const {
    return find(name) != nullptr || find(gguf::composite_order_name(name)) != nullptr;
  }

  // Matrix `name` of the whole model's shape [n_in, n_out], or this rank's part of it.
  Result<Weight> matrix(const std::string& name, int64_t n_in, int64_t n_out,
                        Split split = Split::kNone) const {
    if (find(name) == nullptr && find(gguf::composite_order_name(name)) != nullptr)
      return composite(name, n_in, n_out, split);
    VESPER_ASSIGN_OR_RETURN(const gguf::TensorInfo* t, file_.require_tensor(name));
    return matrix_from(t, n_in, n_out, split);
  }

  // A composite weight (gguf/composite_weight.h): its parts, each [inputs, n_out], gathering by
  // the order tensor.
  // With a split, every part's rows of this rank (its parts all cover every output).
  Result<Weight> composite(const std::string& name, int64_t n_in, int64_t n_out,
                           Split split) const {
    const gguf::TensorInfo* order = find(gguf::composite_order_name(name));
    const int64_t file_rows = n_out;
    int64_t first_row = 0;
    if (ranks_ > 1 && split == Split::kOutputs) {
      n_out /= ranks_;
      first_row = rank_ * n_out;
    }
    if (order->type != tensor::GgmlType::kI32 || order->shape.size() != 1)
      return make_error(file_.path() + ": tensor " + order->name + " is not an I32 vector");
    Weight w;
    w.n_in = n_in;
    w.n_out = n_out;
    w.input_order = reinterpret_cast<const int32_t*>(order->data);
    std::vector<backend::WeightPart> parts;
    int64_t inputs = 0;
    for (size_t i = 0;; ++i) {
      const gguf::TensorInfo* t = find(gguf::composite_part_name(name, i));
      if (t == nullptr) break;
      if (t->shape.size() != 2 || t->shape[1] != file_rows)
        return make_error(file_.path() + ": tensor " + t->name + " has shape " +
                          shape_string(t->shape) + ", expected [..., " + std::to_string(file_rows) +
                          "]");
      Weight part;
      part.type = t->type;
      part.data = t->data + tensor::row_size(t->type, t->shape[0]) * static_cast<size_t>(first_row);
      part.n_in = t->shape[0];
      part.n_out = n_out;
      parts.push_back(backend::WeightPart{t->type, part.data, t->shape[0]});
      w.parts.push_back(std::move(part));
      inputs += t->shape[0];
    }
    if (parts.empty() || inputs != order->shape[0])
      return make_error(file_.path() + ": " + name + "'s parts take " + std::to_string(inputs) +
                        " inputs, its order tensor " + std::to_string(order->shape[0]));
    backend::WeightSource source;
    source.n_in = n_in;
    source.n_out = n_out;
    source.parts = parts;
    source.input_order = w.input_order;
    auto loaded = backend_.load_weight(source);
    if (!loaded) return make_error(file_.path() + ": " + name + ": " + loaded.error().message);
    w.handle = loaded->handle;
    return w;
  }

  Result<Weight> matrix_from(const gguf::TensorInfo* t, int64_t n_in, int64_t n_out,
                             Split split = Split::kNone) const {
    if (t->shape.size() != 2 || t->shape[0] != n_in || t->shape[1] != n_out)
      return make_error(file_.path() + ": tensor " + t->name + " has shape " +
                        shape_string(t->shape) + ", expected [" + std::to_string(n_in) + ", " +
                        std::to_string(n_out) + "]");
    const void* data = t->data;
    if (ranks_ > 1 && split == Split::kOutputs) {
      // Output rows are whole rows of the file: this rank's lie contiguous, in place.
      n_out /= ranks_;
      data = t->data + tensor::row_size(t->type, n_in) * static_cast<size_t>(rank_ * n_out);
    }
    backend::WeightSource source;
    source.type = t->type;
    source.data = data;
    source.n_in = n_in;
    source.n_out = n_out;
    auto loaded = backend_.load_weight(source);
    if (!loaded)
      return make_error(file_.path() + ": tensor " + t->name + " has type " +
                        std::string(tensor::type_name(t->type)) +
                        ", which Vesper cannot compute with yet");
    // A backend copy replaces the mapped bytes, so their pages need not stay resident (peak
    // memory stays about the file size). token_embd's stay: get_rows reads its rows.
    if (loaded->copied && t->name != "token_embd.weight" && split == Split::kNone)
      file_.release_pages(t->data, tensor::row_size(t->type, n_in) * n_out);
    Weight w;
    w.type = t->type;
    w.data = data;
    w.n_in = n_in;
    w.n_out = n_out;
    w.handle = loaded->handle;
    return w;
  }

  // A 1-D f32 vector (norm weights, biases).
  Result<const float*> vector(const std::string& name, int64_t n, bool required = true) const {
    const gguf::TensorInfo* t = file_.find_tensor(name);
    if (t == nullptr) {
      if (!required) return static_cast<const float*>(nullptr);
      return make_error(file_.path() + ": missing required tensor \"" + name + "\"");
    }
    if (t->num_elements() != n || t->shape[0] != n)
      return make_error(file_.path() + ": tensor " + name + " has shape " + shape_string(t->shape) +
                        ", expected [" + std::to_string(n) + "]");
    if (t->type != tensor::GgmlType::kF32)
      return make_error(file_.path() + ": tensor " + name + " has type " +
                        std::string(tensor::type_name(t->type)) + ", expected f32");
    return reinterpret_cast<const float*>(t->data);
  }

  // This rank's part of a vector split like its matrix's outputs (a bias); null stays null.
  const float* part(const float* v, int64_t n) const {
    return v == nullptr ? nullptr : v + rank_ * (n / ranks_);
  }

  // The backend's copy (or in-place view) of a vector; no buffer for an absent one.
  backend::Tensor constant(const float* v, int64_t n) const {
    return v == nullptr ? backend::Tensor{} : backend_.constant(v, n);
  }

 private:
  const gguf::GgufFile& file_;
  backend::Backend& backend_;
  int rank_ = 0;
  int ranks_ = 1;
};

// The shape this rank computes: heads, feed-forward width and vocabulary divided by the group's
// size. Errors name the hyper-parameter that does not divide.
Result<ModelConfig> shard_shape(const ModelConfig& c, int ranks, const std::string& path) {
  ModelConfig s = c;
  if (ranks == 1) return s;
  for (const auto& [what, value] : {std::pair<const char*, int64_t>{"attention heads", c.n_head},
                                    {"embedding width", c.n_embd},
                                    {"KV heads", c.n_head_kv},
                                    {"feed-forward width", c.n_ff},
                                    {"vocabulary", c.n_vocab}})
    if (value % ranks != 0)
      return make_error(path + ": --tensor-parallel-size " + std::to_string(ranks) +
                        ": the model's " + what + " (" + std::to_string(value) +
                        ") do not split into " + std::to_string(ranks) + " equal parts");
  s.n_head /= ranks;
  s.n_head_kv /= ranks;
  s.n_ff /= ranks;
  s.n_vocab /= ranks;
  return s;
}
}  // namespace

Result<std::vector<int64_t>> pipeline_stage_layers(int64_t n_layer, int stages,
                                                   std::span<const int64_t> split) {
  std::vector<int64_t> layers;
  if (split.empty()) {
    // Even, the earlier stages taking one more where it does not divide.
    for (int s = 0; s < stages; ++s) layers.push_back(n_layer / stages + (s < n_layer % stages));
  } else {
    layers.assign(split.begin(), split.end());
    int64_t sum = 0;
    for (const int64_t l : layers) sum += l;
    if (static_cast<int>(layers.size()) != stages || sum != n_layer)
      return make_error("--pipeline-layer-split gives " + std::to_string(layers.size()) +
                        " stages of " + std::to_string(sum) + " layers in all; the model has " +
                        std::to_string(n_layer) + " layers and --pipeline-parallel-size is " +
                        std::to_string(stages));
  }
  for (const int64_t l : layers)
    if (l < 1)
      return make_error("--pipeline-parallel-size " + std::to_string(stages) +
                        ": every stage needs "
                        "a layer, and the model has " +
                        std::to_string(n_layer));
  return layers;
}

Result<std::unique_ptr<Model>> Model::load(const std::string& path, backend::Backend& backend,
                                           dist::Communicator* group, int pipeline_stages,
                                           std::span<const int64_t> layer_split) {
  VESPER_ASSIGN_OR_RETURN(gguf::GgufFile file, hf::open_model_file(path));
  VESPER_ASSIGN_OR_RETURN(ModelConfig config, read_model_config(file));
  std::unique_ptr<Model> m(new Model(backend));
  m->file_ = std::move(file);
  m->config_ = config;
  const int rank = group != nullptr ? group->rank() : 0;
  const int ranks = group != nullptr ? group->size() : 1;
  if (ranks > 1) m->group_ = group;
  if (pipeline_stages < 1 || ranks % pipeline_stages != 0)
    return make_error("--pipeline-parallel-size " + std::to_string(pipeline_stages) +
                      " does not divide the job's " + std::to_string(ranks) + " ranks");
  // Ranks stage-major: rank = stage * tensor_ranks + t. Pipeline parallelism splits the layers
  // into stages, tensor parallelism each stage's layers over its ranks.
  const int tensor_ranks = ranks / pipeline_stages;
  m->tensor_ranks_ = tensor_ranks;
  m->stages_ = pipeline_stages;
  m->stage_ = rank / tensor_ranks;
  m->tensor_rank_ = rank % tensor_ranks;
  VESPER_ASSIGN_OR_RETURN(m->shard_, shard_shape(config, tensor_ranks, path));
  VESPER_ASSIGN_OR_RETURN(const std::vector<int64_t> stage_layers,
                          pipeline_stage_layers(config.n_layer, pipeline_stages, layer_split));
  for (int s = 0; s < m->stage_; ++s) m->first_layer_ += stage_layers[static_cast<size_t>(s)];
  m->shard_.n_layer = stage_layers[static_cast<size_t>(m->stage_)];
  const ModelConfig& c = m->config_;
  const ModelConfig& sc = m->shard_;
  Binder bind(m->file_, backend, m->tensor_rank_, tensor_ranks);
  ModelWeights& w = m->weights_;

  const gguf::TensorInfo* embd = m->file_.find_tensor("token_embd.weight");
  backend::WeightSource embd_source;
  embd_source.type = embd->type;
  embd_source.data = embd->data;
  embd_source.n_in = c.n_embd;
  embd_source.n_out = c.n_vocab;
  embd_source.matmul = false;  // get_rows only
  auto embd_loaded = backend.load_weight(embd_source);
  if (!embd_loaded)
    return make_error(path + ": tensor token_embd.weight has unsupported type " +
                      std::string(tensor::type_name(embd->type)));
  w.token_embd.type = embd->type;
  w.token_embd.data = embd->data;
  w.token_embd.n_in = c.n_embd;
  w.token_embd.n_out = c.n_vocab;
  w.token_embd.handle = embd_loaded->handle;
  VESPER_ASSIGN_OR_RETURN(w.output_norm, bind.vector("output_norm.weight", c.n_embd));
  if (!m->last_stage()) {
    // An earlier pipeline stage hands its activations on and never computes logits; the type is
    // kept (Medusa heads are stored in it).
    const gguf::TensorInfo* output = m->file_.find_tensor("output.weight");
    w.output.type = (output != nullptr ? output : embd)->type;
  } else if (bind.has_matrix("output.weight")) {
    VESPER_ASSIGN_OR_RETURN(w.output,
                            bind.matrix("output.weight", c.n_embd, c.n_vocab, Split::kOutputs));
  } else {  // tied
    VESPER_ASSIGN_OR_RETURN(w.output, bind.matrix_from(embd, c.n_embd, c.n_vocab, Split::kOutputs));
  }
  VESPER_ASSIGN_OR_RETURN(w.rope_freqs, bind.vector("rope_freqs.weight", c.rope_dims / 2, false));

  // This stage's layers (all of them in one process).
  w.layers.resize(sc.n_layer);
  for (int64_t li = 0; li < sc.n_layer; ++li) {
    const std::string p = "blk." + std::to_string(m->first_layer_ + li) + ".";
    LayerWeights& l = w.layers[li];
    VESPER_ASSIGN_OR_RETURN(l.attn_norm, bind.vector(p + "attn_norm.weight", c.n_embd));
    using enum Split;
    VESPER_ASSIGN_OR_RETURN(l.wq, bind.matrix(p + "attn_q.weight", c.n_embd, c.q_dim(), kOutputs));
    VESPER_ASSIGN_OR_RETURN(l.wk, bind.matrix(p + "attn_k.weight", c.n_embd, c.kv_dim(), kOutputs));
    VESPER_ASSIGN_OR_RETURN(l.wv, bind.matrix(p + "attn_v.weight", c.n_embd, c.kv_dim(), kOutputs));
    VESPER_ASSIGN_OR_RETURN(l.wo,
                            bind.matrix(p + "attn_output.weight", c.q_dim(), c.n_embd, kOutputs));
    const bool bias = c.arch.qkv_bias;
    VESPER_ASSIGN_OR_RETURN(l.bq, bind.vector(p + "attn_q.bias", c.q_dim(), bias));
    VESPER_ASSIGN_OR_RETURN(l.bk, bind.vector(p + "attn_k.bias", c.kv_dim(), bias));
    VESPER_ASSIGN_OR_RETURN(l.bv, bind.vector(p + "attn_v.bias", c.kv_dim(), bias));
    VESPER_ASSIGN_OR_RETURN(l.q_norm,
                            bind.vector(p + "attn_q_norm.weight", c.head_dim, c.arch.qk_norm));
    VESPER_ASSIGN_OR_RETURN(l.k_norm,
                            bind.vector(p + "attn_k_norm.weight", c.head_dim, c.arch.qk_norm));
    VESPER_ASSIGN_OR_RETURN(l.ffn_norm, bind.vector(p + "ffn_norm.weight", c.n_embd));
    VESPER_ASSIGN_OR_RETURN(l.w_gate,
                            bind.matrix(p + "ffn_gate.weight", c.n_embd, c.n_ff, kOutputs));
    VESPER_ASSIGN_OR_RETURN(l.w_up, bind.matrix(p + "ffn_up.weight", c.n_embd, c.n_ff, kOutputs));
    VESPER_ASSIGN_OR_RETURN(l.w_down,
                            bind.matrix(p + "ffn_down.weight", c.n_ff, c.n_embd, kOutputs));
    // Biases follow their matrix's outputs.
    l.bq = bind.part(l.bq, c.q_dim());
    l.bk = bind.part(l.bk, c.kv_dim());
    l.bv = bind.part(l.bv, c.kv_dim());
  }
  m->output_norm_ = bind.constant(w.output_norm, c.n_embd);
  m->rope_freqs_ = bind.constant(w.rope_freqs, c.rope_dims / 2);
  for (const LayerWeights& l : w.layers) {
    m->layers_.push_back(
        LayerTensors{bind.constant(l.attn_norm, c.n_embd), bind.constant(l.bq, sc.q_dim()),
                     bind.constant(l.bk, sc.kv_dim()), bind.constant(l.bv, sc.kv_dim()),
                     bind.constant(l.q_norm, c.head_dim), bind.constant(l.k_norm, c.head_dim),
                     bind.constant(l.ffn_norm, c.n_embd)});
  }
  return m;
}

backend::KvCacheSpec Model::kv_spec(int64_t block_size, backend::KvDtypes dtypes) const {
  backend::KvCacheSpec spec;
  spec.dtypes = dtypes;
  spec.n_layers = shard_.n_layer;  // this stage's layers
  spec.block_size = block_size;
  spec.n_kv_heads = shard_.n_head_kv;  // this rank's heads
  spec.head_dim = config_.head_dim;
  return spec;
}

namespace {
// Floats per batch row of the activations: x, xn, tmp (n_embd), q, attn (q_dim), k, v (kv_dim),
// gate, up (n_ff).
int64_t row_floats(const ModelConfig& c) {
  return 3 * c.n_embd + 2 * c.q_dim() + 2 * c.kv_dim() + 2 * c.n_ff;
}
}  // namespace

int64_t Model::activation_bytes(const ModelConfig& c, const StepCapacity& cap,
                                int passes_in_flight) {
  const int64_t floats =
      cap.tokens * row_floats(c) + passes_in_flight * cap.logits_rows * (c.n_embd + c.n_vocab);
  // token ids, positions, token_seq, tree parents (int32), slot mapping (int64); logits rows,
  // tables; table offsets and query starts.
  const int64_t index_bytes = cap.tokens * (4 * 4 + 8) + cap.logits_rows * 4 +
                              cap.table_entries * 4 + 2 * (cap.seqs + 1) * 4;
  return floats * 4 + index_bytes;
}

Model::~Model() {
  // Passes still in flight land before their buffers go.
  while (!passes_.empty()) finish_forward();
  complete_sends();
  if (leads()) broadcast(stop_command());
  release_activations();
}

void Model::release_activations() {
  for (backend::Tensor* t : {&x_,
                             &xn_,
                             &q_,
                             &k_,
                             &v_,
                             &attn_,
                             &gate_,
                             &up_,
                             &tmp_,
                             &last_,
                             &logits_,
                             &logits_part_,
                             &attn_full_,
                             &gate_full_,
                             &tmp_part_,
                             &token_ids_,
                             &positions_,
                             &token_seq_,
                             &slot_mapping_,
                             &block_tables_,
                             &table_offsets_,
                             &logits_rows_,
                             &tree_parents_,
                             &query_start_,
                             &quantized_groups_,
                             &gap_begin_,
                             &gap_end_,
                             &block_budget_})
    if (t->buffer.valid()) backend_.release(t->buffer);
  for (auto& pair : more_pass_buffers_)
    for (backend::Tensor* t : {&pair.first, &pair.second})
      if (t->buffer.valid()) backend_.release(t->buffer);
  more_pass_buffers_.clear();
}

void Model::reserve(const StepCapacity& want) {
  StepCapacity cap = capacity_;
  cap.tokens = std::max(cap.tokens, want.tokens);
  cap.logits_rows = std::max(cap.logits_rows, want.logits_rows);
  cap.seqs = std::max(cap.seqs, want.seqs);
  cap.table_entries = std::max(cap.table_entries, want.table_entries);
  if (cap.tokens == capacity_.tokens && cap.logits_rows == capacity_.logits_rows &&
      cap.seqs == capacity_.seqs && cap.table_entries == capacity_.table_entries)
    return;
  VESPER_CHECK(std::none_of(passes_.begin(), passes_.end(), [](const auto& p) { return p.remote; }),
               "reserve: the activations would move while a pipelined pass is in flight");
  if (leads()) broadcast(reserve_command(cap));
  release_activations();
  capacity_ = cap;
  const ModelConfig& c = shard_;
  using backend::DType;
  using backend::MemoryKind;
  auto f32 = [&](int64_t rows, int64_t cols) {
    return backend_.allocate(DType::kF32, rows, cols, MemoryKind::kDevice);
  };
  auto i32 = [&](int64_t n) { return backend_.allocate(DType::kI32, n, 1, MemoryKind::kDevice); };
  const int64_t n = std::max<int64_t>(cap.tokens, 1), m = std::max<int64_t>(cap.logits_rows, 1);
  x_ = f32(n, c.n_embd);
  xn_ = f32(n, c.n_embd);
  tmp_ = f32(n, c.n_embd);
  q_ = f32(n, c.q_dim());
  attn_ = f32(n, c.q_dim());
  k_ = f32(n, c.kv_dim());
  v_ = f32(n, c.kv_dim());
  gate_ = f32(n, c.n_ff);
  up_ = f32(n, c.n_ff);
  last_ = backend_.allocate(DType::kF32, m, c.n_embd, MemoryKind::kHostVisible);
  logits_ = backend_.allocate(DType::kF32, m, config_.n_vocab, MemoryKind::kHostVisible);
  // A pipeline leader's passes in flight each get a buffer pair of their own (the first is
  // last_ / logits_).
  for (int slot = 1; slot < max_passes_in_flight(); ++slot)
    more_pass_buffers_.emplace_back(
        backend_.allocate(DType::kF32, m, c.n_embd, MemoryKind::kHostVisible),
        backend_.allocate(DType::kF32, m, config_.n_vocab, MemoryKind::kHostVisible));
  if (tensor_ranks_ > 1) {
    // o and down read every rank's columns of their input and write this rank's share of
    // n_embd (model.h).
    attn_full_ = f32(n, config_.q_dim());
    gate_full_ = f32(n, config_.n_ff);
    tmp_part_ = f32(n, c.n_embd / tensor_ranks_);
    logits_part_ = f32(m, c.n_vocab);
  }
  token_ids_ = i32(n);
  positions_ = i32(n);
  token_seq_ = i32(n);
  slot_mapping_ = backend_.allocate(DType::kI64, n, 1, MemoryKind::kDevice);
  block_tables_ = i32(std::max<int64_t>(cap.table_entries, 1));
  table_offsets_ = i32(cap.seqs + 1);
  logits_rows_ = i32(m);
  tree_parents_ = i32(n);
  query_start_ = i32(cap.seqs + 1);
  quantized_groups_ = i32(cap.seqs + 1);
  gap_begin_ = i32(n);
  gap_end_ = i32(n);
  block_budget_ = i32(n);
}

std::span<const float> Model::forward(const ForwardBatch& batch, backend::KvHandle kv) {
  begin_forward(batch, kv);
  return finish_forward();
}

void Model::begin_forward(const ForwardBatch& batch, backend::KvHandle kv) {
  VESPER_CHECK(static_cast<int>(passes_.size()) < max_passes_in_flight(),
               "begin_forward: %d passes are in flight already", max_passes_in_flight());
  // The activations the pass before sent must be out of x_ before this pass writes it.
  complete_sends();
  PassInFlight pass;
  pass.logits = run_pass(batch, kv, pass);
  passes_.push_back(pass);
}

void Model::complete_sends() {
  for (const backend::Backend::Transfer t : sends_) backend_.complete_transfer(t);
  sends_.clear();
}

std::span<const float> Model::finish_forward() {
  VESPER_CHECK(!passes_.empty(), "finish_forward: no pass in flight");
  const PassInFlight pass = passes_.front();
  passes_.erase(passes_.begin());
  if (!pass.remote) return pass.logits;
  backend::Backend& b = backend_;
  b.complete_transfer(pass.logits_transfer);
  b.complete_transfer(pass.last_transfer);
  // Frees x_ for the next pass. With 2 stages the next stage has taken the newest pass's
  // activations by now (it sent these logits first); with more, in a balanced pipeline it takes
  // them about when these logits arrive, so the wait is short.
  complete_sends();
  b.synchronize();
  const backend::Tensor last = pass_last(pass.slot).rows_view(0, pass.rows);
  const backend::Tensor logits = pass_logits(pass.slot).rows_view(0, pass.rows);
  hidden_ = {static_cast<const float*>(b.host_view(last)),
             static_cast<size_t>(pass.rows * shard_.n_embd)};
  hidden_states_ = last;
  return {static_cast<const float*>(b.host_view(logits)),
          static_cast<size_t>(pass.rows * config_.n_vocab)};
}

std::span<const float> Model::run_pass(const ForwardBatch& batch, backend::KvHandle kv,
                                       PassInFlight& pass) {
  const ModelConfig& c = shard_;
  const int64_t n = batch.num_tokens();
  const int64_t m = static_cast<int64_t>(batch.logits_rows.size());
  if (n == 0) return {};
  if (leads() && adapters_ != nullptr && adapters_->any()) share_adapter_slots(batch);
  if (leads()) broadcast(forward_command(batch, kv));
  const bool tensor_split = tensor_ranks_ > 1;
  reserve(StepCapacity{n, m, batch.num_seqs(), static_cast<int64_t>(batch.block_tables.size())});
  backend::Backend& b = backend_;

  // The batch's inputs go to the device once; every layer reads them there.
  const backend::Tensor ids = token_ids_.rows_view(0, n);
  const backend::Tensor rows = logits_rows_.rows_view(0, m);
  backend::AttentionInputs in;
  in.num_tokens = n;
  in.positions = positions_.rows_view(0, n);
  in.token_seq = token_seq_.rows_view(0, n);
  in.slot_mapping = slot_mapping_.rows_view(0, n);
  in.block_tables = block_tables_.rows_view(0, static_cast<int64_t>(batch.block_tables.size()));
  in.table_offsets = table_offsets_.rows_view(0, batch.num_seqs() + 1);
  b.copy_to_device(ids, batch.token_ids.data());
  b.copy_to_device(in.positions, batch.positions.data());
  b.copy_to_device(in.token_seq, batch.token_seq.data());
  b.copy_to_device(in.slot_mapping, batch.slot_mapping.data());
  b.copy_to_device(in.block_tables, batch.block_tables.data());
  b.copy_to_device(in.table_offsets, batch.table_offsets.data());
  b.copy_to_device(rows, batch.logits_rows.data());
  if (batch.has_trees()) {
    in.tree_parents = tree_parents_.rows_view(0, n);
    in.query_start = query_start_.rows_view(0, batch.num_seqs() + 1);
    b.copy_to_device(in.tree_parents, batch.tree_parents.data());
    b.copy_to_device(in.query_start, batch.query_start.data());
  }
  if (!batch.quantized_groups.empty()) {
    in.quantized_groups = quantized_groups_.rows_view(0, batch.num_seqs());
    b.copy_to_device(in.quantized_groups, batch.quantized_groups.data());
  }
  if (!batch.gap_begin.empty()) {
    in.gap_begin = gap_begin_.rows_view(0, n);
    in.gap_end = gap_end_.rows_view(0, n);
    b.copy_to_device(in.gap_begin, batch.gap_begin.data());
    b.copy_to_device(in.gap_end, batch.gap_end.data());
  }
  if (!batch.block_budget.empty()) {
    in.block_budget = block_budget_.rows_view(0, n);
    b.copy_to_device(in.block_budget, batch.block_budget.data());
  }

  const backend::Tensor x = x_.rows_view(0, n), xn = xn_.rows_view(0, n),
                        tmp = tmp_.rows_view(0, n);
  const backend::Tensor q = q_.rows_view(0, n), k = k_.rows_view(0, n), v = v_.rows_view(0, n);
  const backend::Tensor attn = attn_.rows_view(0, n), gate = gate_.rows_view(0, n),
                        up = up_.rows_view(0, n);
  // Tensor parallelism's gathered inputs of o and down, and a rank's share of their outputs.
  backend::Tensor attn_full, gate_full, tmp_part;
  if (tensor_split) {
    attn_full = attn_full_.rows_view(0, n);
    gate_full = gate_full_.rows_view(0, n);
    tmp_part = tmp_part_.rows_view(0, n);
  }

  // A later pipeline stage starts from the stage before's activations.
  if (stage_ > 0)
    b.receive(x, rank_of(stage_ - 1));
  else
    b.get_rows(weights_.token_embd.handle, ids, x);

  // Runs of consecutive sequences with the same adapter slot: each gets its modules at once.
  adapter_runs_.clear();
  if (adapters_ != nullptr && adapters_->any()) {
    for (int64_t s = 0; s < batch.num_seqs(); ++s) {
      const int32_t slot = s < static_cast<int64_t>(batch.seq_adapter.size())
                               ? batch.seq_adapter[static_cast<size_t>(s)]
                               : -1;
      const int64_t begin = batch.query_start[static_cast<size_t>(s)];
      const int64_t end = batch.query_start[static_cast<size_t>(s) + 1];
      if (begin == end) continue;
      if (!adapter_runs_.empty() && adapter_runs_.back().slot == slot &&
          adapter_runs_.back().row_end == begin)
        adapter_runs_.back().row_end = end;
      else
        adapter_runs_.push_back(AdapterRun{begin, end, slot});
    }
  }

  backend::RopeConfig rope;
  rope.style = c.arch.rope_style;
  rope.rope_dims = c.rope_dims;
  rope.freq_base = c.rope_freq_base;
  rope.freq_scale = c.rope_freq_scale;
  rope.freq_factors = rope_freqs_;
  if (c.rope_scaling == RopeScaling::kYarn) {
    rope.ext_factor = c.yarn_ext_factor;
    rope.attn_factor = c.yarn_attn_factor;
    rope.corr_low = c.yarn_corr_dims()[0];
    rope.corr_high = c.yarn_corr_dims()[1];
  }
  const float kq_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));

  for (int64_t il = 0; il < c.n_layer; ++il) {
    const LayerWeights& l = weights_.layers[il];
    const LayerTensors& t = layers_[il];
    b.rms_norm(x, t.attn_norm, c.rms_eps, xn);
    const backend::MatmulGroupTarget qkv[] = {{l.wq.handle, q}, {l.wk.handle, k}, {l.wv.handle, v}};
    observe_linear_input(first_layer_ + il, {"attn_q", "attn_k", "attn_v"}, xn, n);
    b.matmul_group(qkv, xn);
    add_adapter_deltas(first_layer_ + il, Projection::kQ, xn, q);
    add_adapter_deltas(first_layer_ + il, Projection::kK, xn, k);
    add_adapter_deltas(first_layer_ + il, Projection::kV, xn, v);
    if (t.bq.buffer.valid()) b.add_bias(q, t.bq);
    if (t.bk.buffer.valid()) b.add_bias(k, t.bk);
    if (t.bv.buffer.valid()) b.add_bias(v, t.bv);
    if (t.q_norm.buffer.valid()) b.rms_norm_heads(q, t.q_norm, c.head_dim, c.rms_eps);
    if (t.k_norm.buffer.valid()) b.rms_norm_heads(k, t.k_norm, c.head_dim, c.rms_eps);
    // One pass for Q and K: each row's rotation angles are computed once for both.
    b.rope_qk(q, k, c.head_dim, in.positions, rope);
    b.write_kv(kv, il, in, k, v);
    b.paged_attention(kv, il, in, q, c.n_head, kq_scale, attn);
    observe_linear_input(first_layer_ + il, {"attn_output"}, attn, n);
    output_projection(l.wo, first_layer_ + il, Projection::kO, attn, attn_full, tmp_part, tmp);
    b.add(x, tmp);

    b.rms_norm(x, t.ffn_norm, c.rms_eps, xn);
    const backend::MatmulGroupTarget gate_up[] = {{l.w_gate.handle, gate}, {l.w_up.handle, up}};
    observe_linear_input(first_layer_ + il, {"ffn_gate", "ffn_up"}, xn, n);
    b.matmul_group(gate_up, xn);
    add_adapter_deltas(first_layer_ + il, Projection::kGate, xn, gate);
    add_adapter_deltas(first_layer_ + il, Projection::kUp, xn, up);
    b.silu_mul(gate, up);
    observe_linear_input(first_layer_ + il, {"ffn_down"}, gate, n);
    output_projection(l.w_down, first_layer_ + il, Projection::kDown, gate, gate_full, tmp_part,
                      tmp);
    b.add(x, tmp);
  }

  const backend::Tensor last = last_.rows_view(0, m), logits = logits_.rows_view(0, m);
  if (!last_stage()) {
    // The next stage goes on; the leader gets the logits and hidden rows from the last one, into
    // a buffer pair no other pass in flight uses (finish_forward waits for them).
    if (!leads()) {
      b.send(x, rank_of(stage_ + 1));
      return {};
    }
    sends_.push_back(b.begin_send(x, rank_of(stage_ + 1)));
    pass.remote = true;
    pass.slot = next_slot_;
    pass.rows = m;
    next_slot_ = (next_slot_ + 1) % max_passes_in_flight();
    const backend::Tensor& logits_to = pass_logits(pass.slot);
    const backend::Tensor& last_to = pass_last(pass.slot);
    pass.logits_transfer = b.begin_receive(logits_to.rows_view(0, m), rank_of(stages_ - 1));
    pass.last_transfer = b.begin_receive(last_to.rows_view(0, m), rank_of(stages_ - 1));
    return {};
  }
  // Only the rows whose logits are wanted go through the final norm and the output matmul.
  b.gather_rows(x, rows, last);
  b.rms_norm(last, output_norm_, c.rms_eps, last);
  observe_linear_input(-1, {"output"}, last, m);
  if (stages_ > 1 && !tensor_split) {
    // The last pipeline stage: logits and hidden rows to the leader.
    b.matmul(weights_.output.handle, last, logits);
    b.send(logits, 0);
    b.send(last, 0);
    return {};
  }
  if (tensor_split) {
    // This rank's vocabulary columns, then every rank's side by side on the leader.
    const backend::Tensor part = logits_part_.rows_view(0, m);
    b.matmul(weights_.output.handle, last, part);
    b.gather_columns(part, logits);
  } else {
    b.matmul(weights_.output.handle, last, logits);
  }
  if (stages_ > 1) {
    // The last stage's first rank has every rank's vocabulary columns: on to the leader.
    if (tensor_rank_ == 0) {
      b.send(logits, 0);
      b.send(last, 0);
    }
    return {};
  }
  b.synchronize();
  hidden_ = {static_cast<const float*>(b.host_view(last)), static_cast<size_t>(m * c.n_embd)};
  hidden_states_ = last;
  if (tensor_split && !leads()) return {};
  return {static_cast<const float*>(b.host_view(logits)), static_cast<size_t>(m * config_.n_vocab)};
}

void Model::output_projection(const Weight& w, int64_t layer, Projection p,
                              const backend::Tensor& x, const backend::Tensor& x_full,
                              const backend::Tensor& y_part, const backend::Tensor& y) {
  if (tensor_ranks_ == 1) {
    backend_.matmul(w.handle, x, y);
    add_adapter_deltas(layer, p, x, y);
    return;
  }
  // Every rank's columns of x side by side, this rank's outputs, then every rank's outputs.
  backend_.all_gather_columns(x, x_full);
  backend_.matmul(w.handle, x_full, y_part);
  add_adapter_deltas(layer, p, x_full, y_part);
  backend_.all_gather_columns(y_part, y);
}

void Model::observe_linear_input(int64_t layer, std::initializer_list<const char*> weights,
                                 const backend::Tensor& x, int64_t n_rows) {
  if (!linear_input_observer_) return;
  backend_.synchronize();
  const auto* data = static_cast<const float*>(backend_.host_view(x));
  const std::string prefix = layer < 0 ? "" : "blk." + std::to_string(layer) + ".";
  for (const char* w : weights)
    linear_input_observer_(prefix + w + ".weight", data, n_rows, x.cols);
}

void Model::add_adapter_deltas(int64_t layer, Projection p, const backend::Tensor& x,
                               const backend::Tensor& y) {
  if (adapter_runs_.empty()) return;
  adapter_segments_.clear();
  if (tensor_ranks_ > 1) {
    // This rank's output rows of each module: b's rows (and lambda_b's) from its first output,
    // whole heads for q and k, so a permuted head stays whole. Built before the segments point
    // into it.
    adapter_rank_rows_.clear();
    for (const AdapterRun& run : adapter_runs_)
      for (backend::LowRankModule m : adapters_->modules(run.slot, layer, p)) {
        const int64_t rows = m.n_out / tensor_ranks_, first = tensor_rank_ * rows;
        m.b = {m.b.buffer, m.b.dtype, m.b.offset + first * m.b_stride, rows, m.b_stride};
        if (m.lambda_b.buffer.valid())
          m.lambda_b = {m.lambda_b.buffer, m.lambda_b.dtype, m.lambda_b.offset + first, 1, rows};
        m.n_out = rows;
        adapter_rank_rows_.push_back(m);
      }
  }
  size_t next = 0;
  for (const AdapterRun& run : adapter_runs_) {
    std::span<const backend::LowRankModule> modules = adapters_->modules(run.slot, layer, p);
    if (tensor_ranks_ > 1) {
      modules =
          std::span<const backend::LowRankModule>(adapter_rank_rows_).subspan(next, modules.size());
      next += modules.size();
    }
    if (!modules.empty())
      adapter_segments_.push_back(backend::LowRankSegment{run.row_begin, run.row_end, modules});
  }
  if (!adapter_segments_.empty()) backend_.add_low_rank(adapter_segments_, x, y);
}

}  // namespace vesper::model
