// Model: a llama-family transformer loaded from GGUF, its weights bound to a backend
// (backend/backend.h), and one forward pass over a ForwardBatch that reads and writes the
// backend's paged KV storage. The model issues backend ops on handles and never touches the
// memory behind them; which weights are repacked, where buffers live and how ops run is the
// backend's business.
//
// The forward pass is batch-invariant: the logits of a row depend only on that row's token,
// position and context, never on the other rows of the batch or how a prompt was chunked.
//
// The K/V write-before-read contract, which the scheduler and the prefix cache rely on: within
// each layer, the forward pass writes the K/V of every token of the batch to its slot before any
// attention of that layer reads the cache. So tokens of one prefill chunk see one another, a
// sequence admitted in a step may share prefix-cache blocks that another sequence fills in that
// same step, and stale K/V left in a slot (rejected speculative tokens) is overwritten before
// anything reads it.
#pragma once

#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "backend/kv_cache_spec.h"
#include "core/result.h"
#include "dist/communicator.h"
#include "gguf/gguf.h"
#include "model/adapter_source.h"
#include "model/follower_adapters.h"
#include "model/forward_batch.h"
#include "model/model_config.h"

namespace vesper::model {

// A weight matrix of n_out rows x n_in columns (GGUF shape [n_in, n_out]) as it lies in the
// mapped file (what the f64 reference reads), and the backend's handle to it. When the backend
// keeps a copy of its own (the CPU repacks q4_0 / q8_0 / k-quant matrices), the mapped pages are
// released and not touched again (except token_embd's rows, which get_rows reads).
struct Weight {
  tensor::GgmlType type = tensor::GgmlType::kF32;
  const void* data = nullptr;
  int64_t n_in = 0;
  int64_t n_out = 0;
  backend::WeightHandle handle;
  // A composite weight (an EXL2 layer repacked at load, hf/exl2_repack.h; backend.h's
  // WeightSource::parts): type and data unused; its parts (n_out rows each) and the input each
  // gathered position reads, parts after one another.
  std::vector<Weight> parts;
  const int32_t* input_order = nullptr;
};

struct LayerWeights {
  const float* attn_norm = nullptr;
  Weight wq, wk, wv, wo;
  const float* bq = nullptr;  // qwen2 biases
  const float* bk = nullptr;
  const float* bv = nullptr;
  const float* q_norm = nullptr;  // qwen3 per-head norms
  const float* k_norm = nullptr;
  const float* ffn_norm = nullptr;
  Weight w_gate, w_up, w_down;
};

// The weights as the file holds them: matrices, and f32 vectors (norms, biases, RoPE factors)
// in the mapping.
struct ModelWeights {
  Weight token_embd;
  const float* output_norm = nullptr;
  Weight output;  // token_embd when the embeddings are tied
  const float* rope_freqs = nullptr;
  std::vector<LayerWeights> layers;
};

// How large a step the activation buffers hold: rows of the batch, rows whose logits are
// wanted, sequences and block-table entries. Sized once at start from the scheduler's budgets.
struct StepCapacity {
  int64_t tokens = 0;
  int64_t logits_rows = 0;
  int64_t seqs = 0;
  int64_t table_entries = 0;
};

// Tensor parallelism (over a dist::Communicator group of T ranks): each rank holds 1/T of the
// attention heads (q, k, v split by output rows), of the feed-forward width (gate and up by rows)
// and of every other matrix's outputs (o and down: n_embd / T rows each; the output matrix: the
// vocabulary / T); the embedding table and the norms are whole on every rank. Megatron splits o
// and down by inputs and adds the partial products with an all-reduce; here o and down read
// every rank's columns of their input (an all-gather) and their outputs are gathered in turn, so
// every output element is one dot product computed whole on one rank: the results are one
// process's, bit for bit, for any weight and KV type (and every rank holds the same x). The
// bytes moved per layer match the all-reduce's for o; down moves n_ff / T more columns a row.
//
// Pipeline parallelism (pipeline_stages > 1): rank s holds a contiguous run of layers and their KV
// cache; a forward pass runs stage after stage, each sending its activations [rows x n_embd] to
// the next, and the last sends the logits rows (and the hidden rows Medusa reads) to the leader.
// Every op is one process's, so are the results.
//
// The leader's model (rank 0) is the one the engine drives; every other rank's model follows it
// (follow_leader): each forward pass, reserve and KV storage operation of the leader's model is
// first broadcast to the followers, which do the same with their parts, so a follower needs no
// scheduler, runner or sampler. The leader alone gets the logits (gathered from every rank's
// vocabulary columns).
// Layers per pipeline stage: `split` checked against the model (errors name
// --pipeline-layer-split), or as even as they go (earlier stages one more).
Result<std::vector<int64_t>> pipeline_stage_layers(int64_t n_layer, int stages,
                                                   std::span<const int64_t> split);

class Model {
 public:
  // Opens, validates and binds a GGUF model to `backend` (which must outlive the model). With a
  // group of several ranks, binds this rank's rows of each matrix (whole rows: no quant block is
  // ever cut); a shape that cannot split (heads, KV heads, widths or vocabulary not divisible by
  // the group's size) is an error naming the hyper-parameter. Errors name the file and the fault.
  // With pipeline_stages > 1 the group's ranks are pipeline stages instead: rank s holds the
  // layers of stage s (layer_split: layers per stage; empty: as even as they go) and its KV cache,
  // the first stage the embeddings, the last the output norm and matrix. Its errors name
  // --pipeline-layer-split.
  static Result<std::unique_ptr<Model>> load(const std::string& path, backend::Backend& backend,
                                             dist::Communicator* group = nullptr,
                                             int pipeline_stages = 1,
                                             std::span<const int64_t> layer_split = {});
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  // The whole model's hyper-parameters; shard_config() is the part this rank computes (equal to
  // config() in one process).
  const ModelConfig& config() const { return config_; }
  const ModelConfig& shard_config() const { return shard_; }
  // How the job splits the model: ranks per layer (tensor parallelism) and pipeline stages.
  int tensor_parallel_size() const { return tensor_ranks_; }
  int pipeline_parallel_size() const { return stages_; }
  const gguf::GgufFile& file() const { return file_; }
  const ModelWeights& weights() const { return weights_; }
  backend::Backend& backend() { return backend_; }

  // The KV storage this model needs (this rank's KV heads), with blocks of `block_size` tokens of
  // keys and values of the given types (default: f16 both, --kv-cache-dtype auto).
  backend::KvCacheSpec kv_spec(int64_t block_size, backend::KvDtypes dtypes = {}) const;

  // The model's KV storage and what moves its blocks (backend.h says what each does), through the
  // model so that on a group's leader every rank does the same to its own storage (the spec's
  // head count is each rank's).
  backend::KvHandle create_kv(const backend::KvCacheSpec& spec, int64_t num_blocks,
                              backend::MemoryKind kind);
  void release_kv(backend::KvHandle kv);
  void copy_kv_blocks(backend::KvHandle to, backend::KvHandle from, std::span<const int32_t> src,
                      std::span<const int32_t> dst);
  void copy_kv_slots(backend::KvHandle kv, std::span<const int64_t> src,
                     std::span<const int64_t> dst);
  void quantize_kv_group(backend::KvHandle kv, std::span<const int32_t> rows, int32_t dst);
  void calibrate_kv_scales(backend::KvHandle kv);

  // The leader asks every rank a question only the caller understands (the engine: how many KV
  // blocks each rank's memory holds): `request` reaches each follower's `answer`, which returns
  // its figures; with the leader's own `figures`, the result is every rank's, in rank order.
  // Each rank answers figures.size() figures. On the leader only.
  using FollowerAnswer =
      std::function<Result<std::vector<int64_t>>(Model& model, std::span<const uint8_t> request)>;
  std::vector<std::vector<int64_t>> ask_followers(std::vector<uint8_t> request,
                                                  std::span<const int64_t> figures);

  // A follower (a rank other than 0 of the group): does what the leader's model does, command by
  // command, until the leader's model is destroyed; `answer` answers ask_followers. An error when
  // a command cannot be read (a corrupt message) or answered; the caller ends the job.
  Status follow_leader(const FollowerAnswer& answer = {});

  // Bytes of the activation buffers a step of `capacity` needs (the memory plan's figure), with
  // a logits and hidden-row buffer pair for each of `passes_in_flight` (max_passes_in_flight()).
  static int64_t activation_bytes(const ModelConfig& config, const StepCapacity& capacity,
                                  int passes_in_flight = 1);
  // Allocates the activation buffers for steps up to `capacity` (once, at start). A later batch
  // beyond them grows them (tests do that; the engine never does).
  void reserve(const StepCapacity& capacity);
  const StepCapacity& capacity() const { return capacity_; }

  // Runs the batch against `kv` (storage of kv_spec()) and returns the logits of each of
  // batch.logits_rows, in order ([logits_rows.size() x n_vocab], host memory valid until the
  // next forward; on a follower, nothing: the leader gathers the logits). K/V of every batch token
  // are stored at its slot. Rows of a sequence with a tree description attend as forward_batch.h
  // says.
  std::span<const float> forward(const ForwardBatch& batch, backend::KvHandle kv);
  // forward() in two halves, so that a pipeline keeps a pass in flight in every stage, on
  // disjoint sequences (vLLM's virtual engines): on a pipeline's leader, begin_forward runs the
  // first stage and passes its activations on without waiting for the later stages, and
  // finish_forward waits for the logits of the oldest pass begun and not finished (what forward
  // would have returned, valid until the next finish_forward). At most max_passes_in_flight()
  // passes may be in flight; none may read K/V an earlier one in flight writes (disjoint sequences
  // do not), or need more than reserve() gave. Anywhere else begin_forward computes the whole pass
  // and finish_forward returns it.
  void begin_forward(const ForwardBatch& batch, backend::KvHandle kv);
  std::span<const float> finish_forward();
  // How many passes may be in flight: one a stage on a pipeline's leader (where begin_forward
  // returns before its pass's logits exist), else 1.
  int max_passes_in_flight() const { return leads() && stages_ > 1 ? stages_ : 1; }

  // The adapters the forward pass applies by each sequence's seq_adapter slot (none: the base
  // model alone, whatever the slots say). The source must outlive the model or be unset. In a
  // parallel job the leader's source is the one that counts: it sends each slot's modules to the
  // other ranks when the slot's version is new to them, and every rank applies its rows (tensor
  // parallelism) or its layers (pipeline stages) of them.
  void set_adapters(const AdapterSource* adapters) { adapters_ = adapters; }

  // Calibration (model/calibration.h): while set, forward calls `observer` with the input of
  // every linear layer, once per weight that reads it: the weight's GGUF name
  // ("blk.3.attn_q.weight", "output.weight") and the batch's rows of that input (n_rows x n_in f32,
  // host memory valid during the call; the output matrix sees the logits rows only). It costs
  // nothing while unset.
  using LinearInputObserver =
      std::function<void(const std::string& weight, const float* x, int64_t n_rows, int64_t n_in)>;
  void set_linear_input_observer(LinearInputObserver observer) {
    linear_input_observer_ = std::move(observer);
  }

  // The last forward's final hidden state (after the output norm: the input of the output
  // matrix) of each of its logits rows, [logits_rows.size() x n_embd], valid until the next
  // forward. What Medusa heads read.
  std::span<const float> hidden_rows() const { return hidden_; }
  // The same rows where the backend keeps them (a Medusa head gathers its rows from here).
  const backend::Tensor& hidden_states() const { return hidden_states_; }

 private:
  explicit Model(backend::Backend& backend) : backend_(backend) {}
  void release_activations();
  // The leader: hands `command` (tensor_parallel.cpp's encoding) to every follower.
  bool leads() const { return group_ != nullptr && group_->rank() == 0; }
  bool last_stage() const { return stage_ == stages_ - 1; }
  // The job rank holding this rank's share of the layers of `stage`.
  int rank_of(int stage) const { return stage * tensor_ranks_ + tensor_rank_; }
  void broadcast(std::vector<uint8_t> command);
  // A follower: its own storage for a leader's handle.
  backend::KvHandle local_kv(uint64_t leader_handle) const;
  // The leader: sends the followers each adapter slot the batch reads whose version they lack.
  void share_adapter_slots(const ForwardBatch& batch);
  // A follower: takes a slot's modules (kAdapterSlot) into its own buffers.
  Status receive_adapter_slot(std::span<const uint8_t> message);

  // What the backend holds of a layer: weight handles and f32 vectors.
  struct LayerTensors {
    backend::Tensor attn_norm, bq, bk, bv, q_norm, k_norm, ffn_norm;
  };

  backend::Backend& backend_;
  gguf::GgufFile file_;
  ModelConfig config_;
  ModelConfig shard_;                    // this rank's part of config_
  dist::Communicator* group_ = nullptr;  // the job's ranks when there are several, or none
  int tensor_ranks_ = 1;
  int stages_ = 1;
  int stage_ = 0;
  int tensor_rank_ = 0;  // within the stage
  int64_t first_layer_ = 0;
  // A follower's storage for each of the leader's KV handles (by id).
  std::vector<std::pair<uint64_t, backend::KvHandle>> follower_kv_;
  // Adapters in a parallel job: the slot versions the leader has sent; a follower's copies.
  std::map<int32_t, uint64_t> shared_slot_versions_;
  std::unique_ptr<FollowerAdapters> follower_adapters_;
  ModelWeights weights_;
  backend::Tensor output_norm_, rope_freqs_;
  std::vector<LayerTensors> layers_;

  // Activations and batch inputs, allocated by reserve().
  StepCapacity capacity_;
  backend::Tensor x_, xn_, q_, k_, v_, attn_, gate_, up_, tmp_, last_, logits_;
  // With several ranks: o's and down's gathered inputs, this rank's share of their outputs and
  // its vocabulary columns (logits_ is the leader's).
  backend::Tensor attn_full_, gate_full_, tmp_part_, logits_part_;
  backend::Tensor token_ids_, positions_, token_seq_, slot_mapping_, block_tables_, table_offsets_,
      logits_rows_;
  backend::Tensor tree_parents_, query_start_, quantized_groups_, gap_begin_, gap_end_,
      block_budget_;
  std::span<const float> hidden_;
  backend::Tensor hidden_states_;
  // Passes begun and not finished, oldest first. A pipeline leader's pass waits for the logits and
  // hidden rows the last stage sends into buffer pair `slot` (pass_last, pass_logits); any other
  // pass holds its result already.
  struct PassInFlight {
    bool remote = false;
    std::span<const float> logits;  // !remote
    int slot = 0;
    int64_t rows = 0;
    backend::Backend::Transfer logits_transfer = 0, last_transfer = 0;
  };
  std::span<const float> run_pass(const ForwardBatch& batch, backend::KvHandle kv,
                                  PassInFlight& pass);
  void complete_sends();
  std::vector<PassInFlight> passes_;
  std::vector<backend::Backend::Transfer> sends_;  // activations on their way to the next stage
  // A pipeline leader's buffer pairs (hidden rows, logits) for slots 1..stages - 1.
  std::vector<std::pair<backend::Tensor, backend::Tensor>> more_pass_buffers_;
  int next_slot_ = 0;
  const backend::Tensor& pass_last(int slot) const {
    return slot == 0 ? last_ : more_pass_buffers_[static_cast<size_t>(slot - 1)].first;
  }
  const backend::Tensor& pass_logits(int slot) const {
    return slot == 0 ? logits_ : more_pass_buffers_[static_cast<size_t>(slot - 1)].second;
  }

  // Adapters: the source, and per forward the batch's runs of rows sharing a slot and the
  // segments of one projection (reused).
  struct AdapterRun {
    int64_t row_begin, row_end;
    int32_t slot;
  };
  void add_adapter_deltas(int64_t layer, Projection p, const backend::Tensor& x,
                          const backend::Tensor& y);
  // y = x W^T (and its adapters) for o and down: at once in one process; under tensor
  // parallelism from every rank's columns of x (gathered into x_full), this rank's outputs into
  // y_part, then every rank's outputs into y.
  void output_projection(const Weight& w, int64_t layer, Projection p, const backend::Tensor& x,
                         const backend::Tensor& x_full, const backend::Tensor& y_part,
                         const backend::Tensor& y);
  // Calls linear_input_observer_ (if set) for each of `weights` with x's first n_rows rows.
  void observe_linear_input(int64_t layer, std::initializer_list<const char*> weights,
                            const backend::Tensor& x, int64_t n_rows);
  LinearInputObserver linear_input_observer_;
  const AdapterSource* adapters_ = nullptr;
  std::vector<AdapterRun> adapter_runs_;
  std::vector<backend::LowRankSegment> adapter_segments_;
  // Tensor parallelism: each module with its b (and lambda_b) cut to this rank's output rows.
  std::vector<backend::LowRankModule> adapter_rank_rows_;
};

}  // namespace vesper::model
