// CpuBackend: the Backend on this machine's CPU. It owns the compute thread pool, picks the
// instruction set once at start (cpu::selected_isa), and decides how weights are kept: q4_0,
// q8_0 and k-quant matrices are repacked into interleaved chunks (backend/packed_weights.h),
// everything else is used in place from the caller's (memory-mapped) data. "Device" memory is
// host memory, so host-visible buffers cost nothing extra and copies are memcpy; ops run when
// issued, synchronize() has nothing to wait for.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "backend/kv_cache.h"
#include "backend/low_rank.h"
#include "backend/packed_weights.h"
#include "backend/paged_attention.h"
#include "core/large_buffer.h"
#include "core/thread_pool.h"
#include "dist/communicator.h"

namespace vesper::backend {

class CpuBackend final : public Backend {
 public:
  // `threads` compute threads (0: all hardware threads); send / receive between the ranks of
  // `group`, collectives over `tensor_group` (none: one process); both must outlive the backend.
  explicit CpuBackend(int threads, dist::Communicator* group = nullptr,
                      dist::Communicator* tensor_group = nullptr);
  ~CpuBackend() override;

  ThreadPool& pool() { return *pool_; }
  ThreadPool* host_pool() override { return pool_.get(); }
  // The KV storage behind a handle, for tests that look inside it.
  KvCache& kv_cache(KvHandle kv);

  std::string describe() const override;

  Tensor allocate(DType dtype, int64_t rows, int64_t cols, MemoryKind kind) override;
  void release(Buffer buffer) override;
  void copy_to_device(const Tensor& dst, const void* src) override;
  void copy_to_host(void* dst, const Tensor& src) override;
  const void* host_view(const Tensor& t) const override;
  Tensor constant(const float* data, int64_t n) override;

  Result<LoadedWeight> load_weight(const WeightSource& source) override;

  KvHandle create_kv(const KvCacheSpec& spec, int64_t num_blocks, MemoryKind kind) override;
  void wait_kv_resident() override;
  void release_kv(KvHandle kv) override;
  int64_t kv_bytes(KvHandle kv) const override;
  void copy_kv_blocks(KvHandle to, KvHandle from, std::span<const int32_t> src,
                      std::span<const int32_t> dst) override;
  void copy_kv_slots(KvHandle kv, std::span<const int64_t> src,
                     std::span<const int64_t> dst) override;
  void quantize_kv_group(KvHandle kv, std::span<const int32_t> rows, int32_t dst) override;
  void calibrate_kv_scales(KvHandle kv) override;

  void get_rows(WeightHandle table, const Tensor& ids, const Tensor& out) override;
  void matmul(WeightHandle w, const Tensor& x, const Tensor& y) override;
  void matmul_group(std::span<const MatmulGroupTarget> targets, const Tensor& x) override;
  void add_low_rank(std::span<const LowRankSegment> segments, const Tensor& x,
                    const Tensor& y) override;
  void rms_norm(const Tensor& x, const Tensor& weight, float eps, const Tensor& y) override;
  void rms_norm_heads(const Tensor& x, const Tensor& weight, int64_t head_dim, float eps) override;
  void add_bias(const Tensor& x, const Tensor& bias) override;
  void add(const Tensor& y, const Tensor& x) override;
  void silu_mul(const Tensor& gate, const Tensor& up) override;
  void rope_qk(const Tensor& q, const Tensor& k, int64_t head_dim, const Tensor& positions,
               const RopeConfig& rope) override;
  void write_kv(KvHandle kv, int64_t layer, const AttentionInputs& in, const Tensor& k,
                const Tensor& v) override;
  void paged_attention(KvHandle kv, int64_t layer, const AttentionInputs& in, const Tensor& q,
                       int64_t n_heads, float scale, const Tensor& out) override;
  void gather_rows(const Tensor& src, const Tensor& rows, const Tensor& dst) override;
  void all_gather_columns(const Tensor& part, const Tensor& full) override;
  void gather_columns(const Tensor& part, const Tensor& full) override;
  void send(const Tensor& x, int to) override;
  void receive(const Tensor& x, int from) override;
  Transfer begin_send(const Tensor& x, int to) override;
  Transfer begin_receive(const Tensor& x, int from) override;
  void complete_transfer(Transfer transfer) override;
  void synchronize() override {}

 private:
  struct Allocation {
    std::unique_ptr<std::byte[], LargeBufferFree> owned;  // null for constants kept in place
    const std::byte* data = nullptr;
    int64_t bytes = 0;
  };
  struct CpuWeight {
    tensor::GgmlType type = tensor::GgmlType::kF32;
    const void* data =
        nullptr;  // the source, in place (get_rows reads it; matmul too unless packed)
    int64_t n_in = 0;
    int64_t n_out = 0;
    PackedWeights packed;  // empty: matmul reads `data`
    // A composite weight (WeightSource::parts): its parts, and the gather order of their inputs.
    std::vector<WeightHandle> parts;
    std::vector<int32_t> input_order;
  };

  template <class T = float>
  T* ptr(const Tensor& t) const;
  const CpuWeight& weight(WeightHandle w) const;
  // y[rows x n_out] = x[rows x n_in] times a plain weight, or a composite one part by part.
  void matmul_plain(const CpuWeight& w, const float* x, int64_t rows, float* y);
  void matmul_composite(const CpuWeight& w, const float* x, int64_t rows, float* y);
  KvCache& cache(KvHandle kv) const;
  AttentionBatch attention_batch(const AttentionInputs& in) const;
  // f(begin, end) over rows [0, rows) of `cols` elements each: split across the pool in
  // contiguous ranges when there are enough elements (a prompt's rows), else on the calling
  // thread, where waking the pool would cost more than the op. The row-wise and element-wise ops
  // compute each row alone, so the split changes no value.
  void over_rows(int64_t rows, int64_t cols, const std::function<void(int64_t, int64_t)>& f);
  // over_rows for an element-wise op over dense `t` (and its operands of as many elements):
  // f(first element, count), whole rows of t at a time.
  void over_elements(const Tensor& t, const std::function<void(int64_t, int64_t)>& f);

  std::unique_ptr<ThreadPool> pool_;
  dist::Communicator* group_ = nullptr;
  dist::Communicator* tensor_group_ = nullptr;
  // Collectives: the parts of every rank, rank after rank (reused).
  std::vector<float> gathered_columns_;
  void collect_columns(const Tensor& part, const Tensor& full, bool everyone);
  // add_low_rank's segments with their buffers resolved (reused every call).
  std::vector<LowRankDelta> low_rank_deltas_;
  std::vector<LowRankRun> low_rank_runs_;
  // Composite matmuls' gathered activations and partial products (reused every call).
  std::vector<float> gathered_;
  std::vector<float> partial_;
  std::vector<Allocation> buffers_;               // index id - 1; released entries are empty
  std::vector<CpuWeight> weights_;                // index id - 1
  std::vector<std::unique_ptr<KvCache>> caches_;  // index id - 1
};

}  // namespace vesper::backend
