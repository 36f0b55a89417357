// Backend: the device a model runs on, shaped for one from the first line (ARCHITECTURE.md).
//  - Memory is the backend's, behind handles: activation buffers (Tensor views of them), weights
//    (WeightHandle: a matrix as the backend keeps it, repacked or not) and paged KV storage
//    (KvHandle). The caller never dereferences device memory.
//  - Copies between host and device are explicit (copy_to_device, copy_to_host). Buffers
//    allocated host-visible (the logits a sampler reads) can also be read in place, after
//    synchronize(), through host_view.
//  - Ops are issued in order on one stream: an op may run when issued (the CPU backend) or later
//    (a device queue); each sees the effects of the ops issued before it, and synchronize() waits
//    for all of them.
// Every op keeps the promises of the CPU kernels it stands for: batch invariance (a row's result
// never depends on the other rows, on the thread count or on the instruction set) and the
// accuracy bounds of backend/matmul.h.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "backend/kv_cache_spec.h"
#include "backend/ops.h"
#include "core/result.h"
#include "tensor/ggml_type.h"

namespace vesper {
class ThreadPool;
}  // namespace vesper

namespace vesper::backend {

enum class DType : uint8_t { kF32, kI32, kI64, kF16 };
int64_t dtype_bytes(DType dtype);

// Where a buffer lives: on the device, or in host memory the device can also use (pinned memory
// on a GPU; the same memory on the CPU), readable in place after synchronize().
enum class MemoryKind { kDevice, kHostVisible };

// A buffer of the backend's; id 0 is no buffer.
struct Buffer {
  uint32_t id = 0;
  bool valid() const { return id != 0; }
};

// A 2-D view of a buffer: rows x cols elements of dtype, row-major, rows `cols` apart, starting
// `offset` elements in.
struct Tensor {
  Buffer buffer;
  DType dtype = DType::kF32;
  int64_t offset = 0;
  int64_t rows = 0;
  int64_t cols = 0;

  int64_t numel() const { return rows * cols; }
  // Rows [first, first + count) of this view.
  Tensor rows_view(int64_t first, int64_t count) const {
    return {buffer, dtype, offset + first * cols, count, cols};
  }
  // The same elements seen as rows of `new_cols` (numel must divide).
  Tensor reshaped(int64_t new_cols) const {
    return {buffer, dtype, offset, numel() / new_cols, new_cols};
  }
};

// A weight matrix (n_out rows of n_in) as the backend keeps it.
struct WeightHandle {
  uint32_t id = 0;
  int64_t n_in = 0;
  int64_t n_out = 0;
  bool valid() const { return id != 0; }
};

// Paged KV storage (KvCacheSpec's layout) of some number of blocks.
struct KvHandle {
  uint32_t id = 0;
  bool valid() const { return id != 0; }
};

// A weight matrix as it lies in the model file: n_out rows of n_in elements of `type`, host
// memory the backend may read during load_weight (and, on the CPU, keep using in place).
// One part of a composite weight (WeightSource::parts): n_in inputs of each of the weight's
// n_out rows, in `type` (rows of row_size(type, n_in) bytes).
struct WeightPart {
  tensor::GgmlType type = tensor::GgmlType::kF32;
  const void* data = nullptr;
  int64_t n_in = 0;
};

struct WeightSource {
  tensor::GgmlType type = tensor::GgmlType::kF32;
  const void* data = nullptr;
  int64_t n_in = 0;
  int64_t n_out = 0;
  // False for a matrix only read by rows (an embedding table): get_rows, never matmul.
  bool matmul = true;
  // A composite weight (an EXL2 layer, repacked into parts of one type each): type and data are
  // unused, and the product with x is the sum, part after part in order, of part i times the
  // activations gathered by input_order[o_i, o_i + parts[i].n_in) (o_i: the parts before it;
  // an index of -1 reads zero). Every row's result depends on that row alone, as for any weight.
  std::span<const WeightPart> parts;
  const int32_t* input_order = nullptr;
};

// What load_weight did with the source: whether the backend now holds its own copy, so that the
// caller may let the source's pages go (a GPU always copies; the CPU copies when it repacks).
struct LoadedWeight {
  WeightHandle handle;
  bool copied = false;
};

// One sequence-batch's attention inputs, as device tensors (int32 unless noted), rows of one:
// positions [num_tokens], token_seq [num_tokens], slot_mapping [num_tokens] (int64),
// block_tables [total table entries], table_offsets [num_seqs + 1].
struct AttentionInputs {
  int64_t num_tokens = 0;
  Tensor positions;
  Tensor token_seq;
  Tensor slot_mapping;
  Tensor block_tables;
  Tensor table_offsets;
  // Batches with trees only (paged_attention.h): tree_parents [num_tokens], query_start
  // [num_seqs + 1]; no buffer otherwise.
  Tensor tree_parents;
  Tensor query_start;
  // KIVI caches only: [num_seqs] groups stored quantized at the front of each table; no buffer
  // otherwise (none stored quantized).
  Tensor quantized_groups;
  // Sinks + window only: [num_tokens] each row's gap (paged_attention.h); no buffer otherwise.
  Tensor gap_begin;
  Tensor gap_end;
  // Quest only: [num_tokens] each row's block budget (paged_attention.h); no buffer otherwise.
  Tensor block_budget;
};

// Rotary embedding, with llama3's per-pair frequency divisors as an optional device vector.
struct RopeConfig {
  RopeStyle style = RopeStyle::kNormal;
  int64_t rope_dims = 0;
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;
  Tensor freq_factors;  // [rope_dims / 2] or no buffer
  // YaRN (ops.h RopeParams): ext_factor 0 = off.
  float ext_factor = 0.0f;
  float attn_factor = 1.0f;
  float corr_low = 0.0f;
  float corr_high = 0.0f;
};

// One product of a group that reads the same activations (matmul_group).
struct MatmulGroupTarget {
  WeightHandle weight;
  Tensor y;
};

// One module's low-rank delta (an adapter's LoRA or VeRA product; backend/low_rank.h gives
// the formula and its numeric contract) held in backend buffers: a [rank x n_in] (rows a_stride
// apart), b [n_out x rank] (rows b_stride apart), both f32 or both f16 (an adapter stored in f16
// is read as such: half the bytes per step), optional f32 lambda_d [rank] and lambda_b [n_out].
struct LowRankModule {
  Tensor a, b, lambda_d, lambda_b;
  int64_t a_stride = 0;
  int64_t b_stride = 0;
  int64_t rank = 0;
  int64_t n_in = 0;
  int64_t n_out = 0;
  float scale = 1.0f;
  int64_t permute_head_dim = 0;
};

// Rows [row_begin, row_end) of a batch and the modules they add, in order.
struct LowRankSegment {
  int64_t row_begin = 0;
  int64_t row_end = 0;
  std::span<const LowRankModule> modules;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // "cpu (avx2, 2 threads)": what the startup log says.
  virtual std::string describe() const = 0;
  // Host threads the runner may spread host-side work of a step over (sampling the batch's rows)
  // between passes; null: the calling thread alone.
  virtual ThreadPool* host_pool() { return nullptr; }

  // --- memory
  // A buffer of rows x cols elements, uninitialised; the Tensor views all of it. Dies with
  // the backend unless released.
  virtual Tensor allocate(DType dtype, int64_t rows, int64_t cols, MemoryKind kind) = 0;
  virtual void release(Buffer buffer) = 0;
  // dst.numel() elements from host memory into dst / from src to host memory, in stream order.
  virtual void copy_to_device(const Tensor& dst, const void* src) = 0;
  virtual void copy_to_host(void* dst, const Tensor& src) = 0;
  // The elements of a host-visible buffer's view, to read in place after synchronize().
  virtual const void* host_view(const Tensor& t) const = 0;
  // A constant f32 vector from host memory (norm weights, biases, RoPE factors) that lives as
  // long as `data` does; the CPU uses it in place, a device copies it.
  virtual Tensor constant(const float* data, int64_t n) = 0;

  // --- weights
  // Errors name the type when the backend cannot multiply by it.
  virtual Result<LoadedWeight> load_weight(const WeightSource& source) = 0;

  // --- paged KV storage
  // Device storage may be made resident in the background as it starts (the CPU's is: a
  // block's first write then pays no page fault inside a forward pass); its contents are
  // unspecified until written either way.
  virtual KvHandle create_kv(const KvCacheSpec& spec, int64_t num_blocks, MemoryKind kind) = 0;
  // Blocks until all KV storage is resident (a benchmark that must not time first touches).
  virtual void wait_kv_resident() = 0;
  virtual void release_kv(KvHandle kv) = 0;
  virtual int64_t kv_bytes(KvHandle kv) const = 0;
  // Copies whole blocks (every layer's K and V, metadata included): block src[i] of `from` into
  // block dst[i] of `to` (the same storage for copy-on-write, device and host storage for swaps).
  virtual void copy_kv_blocks(KvHandle to, KvHandle from, std::span<const int32_t> src,
                              std::span<const int32_t> dst) = 0;
  // Copies single slots (every layer's K and V): slot src[i] into slot dst[i] of the same
  // storage, in order.
  virtual void copy_kv_slots(KvHandle kv, std::span<const int64_t> src,
                             std::span<const int64_t> dst) = 0;
  // KIVI: quantizes one group's residual rows (in blocks `rows`, in order) into block `dst` of
  // the same storage, every layer and head (KvCache::quantize_group).
  virtual void quantize_kv_group(KvHandle kv, std::span<const int32_t> rows, int32_t dst) = 0;
  // fp8 caches: the first write to each layer from now on fixes its per-head scales, and later
  // rows are coded against them (KvCache::calibrate_fp8_scales; vLLM's --calculate-kv-scales).
  virtual void calibrate_kv_scales(KvHandle kv) = 0;

  // --- ops (in issue order)
  // out[i] = row ids[i] of the embedding matrix `table` (n_out rows of n_in), dequantized.
  virtual void get_rows(WeightHandle table, const Tensor& ids, const Tensor& out) = 0;
  // y = x W^T for each row of x (x: rows x n_in, y: rows x n_out).
  virtual void matmul(WeightHandle w, const Tensor& x, const Tensor& y) = 0;
  // Several products of the same x (q/k/v, gate/up): the bits of one matmul each.
  virtual void matmul_group(std::span<const MatmulGroupTarget> targets, const Tensor& x) = 0;
  // y = rmsnorm(x) * weight, row by row (x and y may be the same view).
  virtual void rms_norm(const Tensor& x, const Tensor& weight, float eps, const Tensor& y) = 0;
  // Per-head RMSNorm in place: each head_dim run of x's rows, scaled by weight [head_dim].
  virtual void rms_norm_heads(const Tensor& x, const Tensor& weight, int64_t head_dim,
                              float eps) = 0;
  // x[r] += bias for each row.
  virtual void add_bias(const Tensor& x, const Tensor& bias) = 0;
  // y += x elementwise.
  virtual void add(const Tensor& y, const Tensor& x) = 0;
  // gate = silu(gate) * up elementwise.
  virtual void silu_mul(const Tensor& gate, const Tensor& up) = 0;
  // RoPE of q (rows x n_head*head_dim) and k (rows x n_head_kv*head_dim) in place, row r at
  // positions[r].
  virtual void rope_qk(const Tensor& q, const Tensor& k, int64_t head_dim, const Tensor& positions,
                       const RopeConfig& rope) = 0;
  // Stores each token's k and v rows into its slot of layer `layer`.
  virtual void write_kv(KvHandle kv, int64_t layer, const AttentionInputs& in, const Tensor& k,
                        const Tensor& v) = 0;
  // out = softmax(scale * q K^T) V over each token's context (causal, paged).
  virtual void paged_attention(KvHandle kv, int64_t layer, const AttentionInputs& in,
                               const Tensor& q, int64_t n_heads, float scale,
                               const Tensor& out) = 0;
  // y[r] += each module's low-rank delta of x[r], for the rows of each segment (adapters).
  virtual void add_low_rank(std::span<const LowRankSegment> segments, const Tensor& x,
                            const Tensor& y) = 0;
  // dst[i] = src[rows[i]] (rows: int32).
  virtual void gather_rows(const Tensor& src, const Tensor& rows, const Tensor& dst) = 0;

  // --- collectives: tensor parallelism's, over the group the backend was made with
  // (BackendOptions::group); on a backend of one process they are plain copies. Each rank's
  // part [rows x part.cols] goes side by side with the others', in rank order, into
  // full [rows x ranks * part.cols]: on every rank (all_gather_columns), or on the group's leader,
  // rank 0, alone (gather_columns: other ranks' `full` is not written). Values are moved, never
  // added, so a split computation gives one process's bits.
  virtual void all_gather_columns(const Tensor& part, const Tensor& full) = 0;
  virtual void gather_columns(const Tensor& part, const Tensor& full) = 0;
  // Pipeline stages: x's elements to rank `to` of the group / into x from rank `from`.
  virtual void send(const Tensor& x, int to) = 0;
  virtual void receive(const Tensor& x, int from) = 0;
  // The same, begun without waiting (pipeline passes in flight): the transfer goes on while
  // later ops run, x must not be written (a send) or read (a receive) until complete_transfer.
  // Transfers between two ranks match in the order they were begun, blocking ones included.
  using Transfer = int64_t;
  virtual Transfer begin_send(const Tensor& x, int to) = 0;
  virtual Transfer begin_receive(const Tensor& x, int from) = 0;
  virtual void complete_transfer(Transfer transfer) = 0;

  // Waits until every op issued so far is done.
  virtual void synchronize() = 0;
};

}  // namespace vesper::backend
