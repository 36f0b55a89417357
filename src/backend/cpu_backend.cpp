#include "backend/cpu_backend.h"

#include <algorithm>
#include <cstring>

#include "backend/cpu/matmul_cpu.h"
#include "backend/matmul.h"
#include "backend/paged_attention.h"

namespace vesper::backend {

int64_t dtype_bytes(DType dtype) {
  switch (dtype) {
    case DType::kF32:
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kF16:
      return 2;
  }
  return 0;
}

CpuBackend::CpuBackend(int threads, dist::Communicator* group, dist::Communicator* tensor_group)
    : pool_(std::make_unique<ThreadPool>(threads > 0 ? threads : ThreadPool::hardware_threads())),
      group_(group),
      tensor_group_(tensor_group) {}

CpuBackend::~CpuBackend() = default;

std::string CpuBackend::describe() const {
  std::string group;
  if (group_ != nullptr && group_->size() > 1)
    group = ", rank " + std::to_string(group_->rank()) + " of " + std::to_string(group_->size());
  const std::string capped =
      cpu::isa_capped() ? std::string(" by ") + cpu::kMaxIsaVariable : std::string();
  return "cpu (" + std::string(cpu::isa_name(cpu::selected_isa())) + capped + ", " +
         std::to_string(pool_->num_threads()) + " threads" + group + ")";
}

template <class T>
T* CpuBackend::ptr(const Tensor& t) const {
  VESPER_CHECK(t.buffer.valid() && t.buffer.id <= buffers_.size(), "tensor of an unknown buffer %u",
               t.buffer.id);
  const Allocation& a = buffers_[t.buffer.id - 1];
  VESPER_CHECK(a.data != nullptr, "tensor of a released buffer %u", t.buffer.id);
  const int64_t end = (t.offset + t.numel()) * dtype_bytes(t.dtype);
  VESPER_CHECK(t.offset >= 0 && end <= a.bytes,
               "tensor [%lld, %lld) bytes outside buffer %u of %lld bytes",
               static_cast<long long>(t.offset * dtype_bytes(t.dtype)), static_cast<long long>(end),
               t.buffer.id, static_cast<long long>(a.bytes));
  return reinterpret_cast<T*>(const_cast<std::byte*>(a.data) + t.offset * dtype_bytes(t.dtype));
}

Tensor CpuBackend::allocate(DType dtype, int64_t rows, int64_t cols,
                            MemoryKind /*kind: all host memory*/) {
  const int64_t bytes = std::max<int64_t>(rows * cols * dtype_bytes(dtype), 1);
  Allocation a;
  a.owned = allocate_large_buffer(static_cast<size_t>(bytes));
  VESPER_CHECK(a.owned != nullptr, "cannot allocate %lld bytes", static_cast<long long>(bytes));
  a.data = a.owned.get();
  a.bytes = bytes;
  buffers_.push_back(std::move(a));
  return Tensor{Buffer{static_cast<uint32_t>(buffers_.size())}, dtype, 0, rows, cols};
}

void CpuBackend::release(Buffer buffer) {
  if (!buffer.valid() || buffer.id > buffers_.size()) return;
  buffers_[buffer.id - 1] = Allocation{};
}

void CpuBackend::copy_to_device(const Tensor& dst, const void* src) {
  if (dst.numel() > 0)
    std::memcpy(ptr<std::byte>(dst), src,
                static_cast<size_t>(dst.numel() * dtype_bytes(dst.dtype)));
}

void CpuBackend::copy_to_host(void* dst, const Tensor& src) {
  if (src.numel() > 0)
    std::memcpy(dst, ptr<std::byte>(src),
                static_cast<size_t>(src.numel() * dtype_bytes(src.dtype)));
}

const void* CpuBackend::host_view(const Tensor& t) const {
  return ptr<std::byte>(t);
}

Tensor CpuBackend::constant(const float* data, int64_t n) {
  Allocation a;
  a.data = reinterpret_cast<const std::byte*>(data);
  a.bytes = n * static_cast<int64_t>(sizeof(float));
  buffers_.push_back(std::move(a));
  return Tensor{Buffer{static_cast<uint32_t>(buffers_.size())}, DType::kF32, 0, 1, n};
}

Result<LoadedWeight> CpuBackend::load_weight(const WeightSource& source) {
  if (!source.parts.empty()) {
    CpuWeight w;
    w.n_in = source.n_in;
    w.n_out = source.n_out;
    int64_t inputs = 0;
    for (const WeightPart& p : source.parts) {
      WeightSource part_source;
      part_source.type = p.type;
      part_source.data = p.data;
      part_source.n_in = p.n_in;
      part_source.n_out = source.n_out;
      VESPER_ASSIGN_OR_RETURN(LoadedWeight part, load_weight(part_source));
      w.parts.push_back(part.handle);
      inputs += p.n_in;
    }
    w.input_order.assign(source.input_order, source.input_order + inputs);
    for (int32_t i : w.input_order)
      if (i < -1 || i >= source.n_in)
        return make_error("composite weight: input index " + std::to_string(i) + " outside [0, " +
                          std::to_string(source.n_in) + ")");
    weights_.push_back(std::move(w));
    return LoadedWeight{
        WeightHandle{static_cast<uint32_t>(weights_.size()), source.n_in, source.n_out}, false};
  }
  if (source.matmul ? !matmul_supported(source.type) : !tensor::traits(source.type).supported)
    return make_error("tensor type " + std::string(tensor::type_name(source.type)) +
                      " is not supported by the CPU " + (source.matmul ? "matmul" : "row reader"));
  CpuWeight w;
  w.type = source.type;
  w.data = source.data;
  w.n_in = source.n_in;
  w.n_out = source.n_out;
  LoadedWeight loaded;
  if (source.matmul && packable(source.type, source.n_in, source.n_out)) {
    w.packed = prepare_weights(source.type, source.data, source.n_in, source.n_out);
    loaded.copied = true;
  }
  weights_.push_back(std::move(w));
  loaded.handle = WeightHandle{static_cast<uint32_t>(weights_.size()), source.n_in, source.n_out};
  return loaded;
}

const CpuBackend::CpuWeight& CpuBackend::weight(WeightHandle w) const {
  VESPER_CHECK(w.valid() && w.id <= weights_.size(), "unknown weight %u", w.id);
  return weights_[w.id - 1];
}

KvHandle CpuBackend::create_kv(const KvCacheSpec& spec, int64_t num_blocks, MemoryKind kind) {
  caches_.push_back(std::make_unique<KvCache>(spec, num_blocks));
  // The engine's cache, not the swap space (host-visible storage, written only by swaps).
  if (kind == MemoryKind::kDevice) caches_.back()->warm_in_background();
  return KvHandle{static_cast<uint32_t>(caches_.size())};
}

void CpuBackend::wait_kv_resident() {
  for (const auto& c : caches_)
    if (c != nullptr) c->wait_resident();
}

void CpuBackend::release_kv(KvHandle kv) {
  if (kv.valid() && kv.id <= caches_.size()) caches_[kv.id - 1].reset();
}

KvCache& CpuBackend::cache(KvHandle kv) const {
  VESPER_CHECK(kv.valid() && kv.id <= caches_.size() && caches_[kv.id - 1] != nullptr,
               "unknown KV storage %u", kv.id);
  return *caches_[kv.id - 1];
}

KvCache& CpuBackend::kv_cache(KvHandle kv) {
  return cache(kv);
}

int64_t CpuBackend::kv_bytes(KvHandle kv) const {
  return cache(kv).bytes();
}

void CpuBackend::copy_kv_blocks(KvHandle to, KvHandle from, std::span<const int32_t> src,
                                std::span<const int32_t> dst) {
  VESPER_CHECK(src.size() == dst.size(), "%zu sources for %zu destinations", src.size(),
               dst.size());
  KvCache& t = cache(to);
  const KvCache& f = cache(from);
  for (size_t i = 0; i < src.size(); ++i) t.copy_block_from(f, src[i], dst[i]);
}

void CpuBackend::copy_kv_slots(KvHandle kv, std::span<const int64_t> src,
                               std::span<const int64_t> dst) {
  VESPER_CHECK(src.size() == dst.size(), "%zu sources for %zu destinations", src.size(),
               dst.size());
  KvCache& c = cache(kv);
  for (size_t i = 0; i < src.size(); ++i) c.copy_slot(src[i], dst[i]);
}

void CpuBackend::quantize_kv_group(KvHandle kv, std::span<const int32_t> rows, int32_t dst) {
  cache(kv).quantize_group(rows, dst, pool_.get());
}

void CpuBackend::calibrate_kv_scales(KvHandle kv) {
  cache(kv).calibrate_fp8_scales();
}

void CpuBackend::get_rows(WeightHandle table, const Tensor& ids, const Tensor& out) {
  const CpuWeight& w = weight(table);
  VESPER_CHECK(out.cols == w.n_in && out.rows == ids.numel(), "get_rows: shapes do not match");
  backend::get_rows(w.type, w.data, w.n_in, ptr<int32_t>(ids), ids.numel(), ptr(out));
}

void CpuBackend::matmul_plain(const CpuWeight& w, const float* x, int64_t rows, float* y) {
  if (!w.packed.empty()) {
    backend::matmul(w.packed, x, rows, y, *pool_);
  } else {
    backend::matmul(w.type, w.data, w.n_in, w.n_out, x, rows, y, *pool_);
  }
}

void CpuBackend::matmul_composite(const CpuWeight& w, const float* x, int64_t rows, float* y) {
  const size_t out = static_cast<size_t>(rows * w.n_out);
  int64_t offset = 0;
  for (size_t i = 0; i < w.parts.size(); ++i) {
    const CpuWeight& part = weight(w.parts[i]);
    const int32_t* order = w.input_order.data() + offset;
    gathered_.resize(static_cast<size_t>(rows * part.n_in));
    for (int64_t r = 0; r < rows; ++r) {
      const float* src = x + r * w.n_in;
      float* dst = gathered_.data() + r * part.n_in;
      for (int64_t j = 0; j < part.n_in; ++j) dst[j] = order[j] < 0 ? 0.0f : src[order[j]];
    }
    if (i == 0) {
      matmul_plain(part, gathered_.data(), rows, y);
    } else {
      partial_.resize(out);
      matmul_plain(part, gathered_.data(), rows, partial_.data());
      for (size_t e = 0; e < out; ++e) y[e] += partial_[e];
    }
    offset += part.n_in;
  }
}

void CpuBackend::matmul(WeightHandle handle, const Tensor& x, const Tensor& y) {
  const CpuWeight& w = weight(handle);
  VESPER_CHECK(x.cols == w.n_in && y.cols == w.n_out && x.rows == y.rows,
               "matmul: shapes do not match");
  if (!w.parts.empty()) {
    matmul_composite(w, ptr(x), x.rows, ptr(y));
  } else {
    matmul_plain(w, ptr(x), x.rows, ptr(y));
  }
}

void CpuBackend::matmul_group(std::span<const MatmulGroupTarget> targets, const Tensor& x) {
  VESPER_CHECK(!targets.empty() && targets.size() <= kMaxMatmulGroup, "matmul_group of %zu targets",
               targets.size());
  // Composite weights run one by one (each gathers its own activations).
  for (const MatmulGroupTarget& t : targets)
    if (!weight(t.weight).parts.empty()) {
      for (const MatmulGroupTarget& each : targets) matmul(each.weight, x, each.y);
      return;
    }
  MatmulTarget t[kMaxMatmulGroup];
  for (size_t i = 0; i < targets.size(); ++i) {
    const CpuWeight& w = weight(targets[i].weight);
    VESPER_CHECK(w.n_in == x.cols && targets[i].y.cols == w.n_out && targets[i].y.rows == x.rows,
                 "matmul_group: shapes do not match");
    t[i] = MatmulTarget{w.packed.empty() ? nullptr : &w.packed, w.type, w.data, w.n_out,
                        ptr(targets[i].y)};
  }
  backend::matmul_group(t, static_cast<int>(targets.size()), x.cols, ptr(x), x.rows, *pool_);
}

void CpuBackend::add_low_rank(std::span<const LowRankSegment> segments, const Tensor& x,
                              const Tensor& y) {
  low_rank_deltas_.clear();
  low_rank_runs_.clear();
  for (const LowRankSegment& s : segments) {
    VESPER_CHECK(
        s.row_begin >= 0 && s.row_begin <= s.row_end && s.row_end <= x.rows && x.rows == y.rows,
        "add_low_rank: rows out of range");
    for (const LowRankModule& m : s.modules) {
      VESPER_CHECK(m.a.dtype == m.b.dtype && (m.a.dtype == DType::kF32 || m.a.dtype == DType::kF16),
                   "add_low_rank: A and B must both be f32 or both f16");
      LowRankDelta d;
      d.f16 = m.a.dtype == DType::kF16;
      d.a = ptr<std::byte>(m.a);
      d.a_stride = m.a_stride;
      d.b = ptr<std::byte>(m.b);
      d.b_stride = m.b_stride;
      d.rank = m.rank;
      d.n_in = m.n_in;
      d.n_out = m.n_out;
      d.scale = m.scale;
      d.lambda_d = m.lambda_d.buffer.valid() ? ptr(m.lambda_d) : nullptr;
      d.lambda_b = m.lambda_b.buffer.valid() ? ptr(m.lambda_b) : nullptr;
      d.permute_head_dim = m.permute_head_dim;
      low_rank_deltas_.push_back(d);
    }
  }
  // Spans into low_rank_deltas_ once it no longer grows.
  size_t next = 0;
  for (const LowRankSegment& s : segments) {
    low_rank_runs_.push_back(LowRankRun{
        s.row_begin, s.row_end,
        std::span<const LowRankDelta>(low_rank_deltas_).subspan(next, s.modules.size())});
    next += s.modules.size();
  }
  backend::add_low_rank(low_rank_runs_, ptr(x), x.cols, ptr(y), y.cols, *pool_);
}

void CpuBackend::over_rows(int64_t rows, int64_t cols,
                           const std::function<void(int64_t, int64_t)>& f) {
  // As matmul's activation quantizer: below this many elements one thread is quicker.
  constexpr int64_t kMinParallelElements = int64_t{1} << 16;
  if (rows < 2 || rows * cols < kMinParallelElements || pool_->num_threads() == 1)
    return f(0, rows);
  pool_->parallel_for(static_cast<size_t>(rows), [&f](size_t begin, size_t end) {
    f(static_cast<int64_t>(begin), static_cast<int64_t>(end));
  });
}

void CpuBackend::over_elements(const Tensor& t, const std::function<void(int64_t, int64_t)>& f) {
  over_rows(t.rows, t.cols,
            [&](int64_t begin, int64_t end) { f(begin * t.cols, (end - begin) * t.cols); });
}

void CpuBackend::rms_norm(const Tensor& x, const Tensor& weight, float eps, const Tensor& y) {
  VESPER_CHECK(weight.numel() == x.cols && y.cols == x.cols && y.rows == x.rows,
               "rms_norm: shapes do not match");
  const float *in = ptr(x), *w = ptr(weight);
  float* out = ptr(y);
  const int64_t n = x.cols;
  over_rows(x.rows, n, [&](int64_t begin, int64_t end) {
    backend::rms_norm(in + begin * n, w, n, end - begin, eps, out + begin * n);
  });
}

void CpuBackend::rms_norm_heads(const Tensor& x, const Tensor& weight, int64_t head_dim,
                                float eps) {
  VESPER_CHECK(weight.numel() == head_dim && x.cols % head_dim == 0,
               "rms_norm_heads: shapes do not match");
  float* data = ptr(x);
  const float* w = ptr(weight);
  const int64_t n = x.cols;
  over_rows(x.rows, n, [&](int64_t begin, int64_t end) {
    backend::rms_norm_heads(data + begin * n, w, head_dim, end - begin, n / head_dim, eps);
  });
}

void CpuBackend::add_bias(const Tensor& x, const Tensor& bias) {
  VESPER_CHECK(bias.numel() == x.cols, "add_bias: shapes do not match");
  backend::add_bias(ptr(x), ptr(bias), x.cols, x.rows);
}

void CpuBackend::add(const Tensor& y, const Tensor& x) {
  VESPER_CHECK(x.numel() == y.numel(), "add: shapes do not match");
  float* out = ptr(y);
  const float* in = ptr(x);
  over_elements(y, [&](int64_t at, int64_t n) { backend::add_inplace(out + at, in + at, n); });
}

void CpuBackend::silu_mul(const Tensor& gate, const Tensor& up) {
  VESPER_CHECK(gate.numel() == up.numel(), "silu_mul: shapes do not match");
  float* g = ptr(gate);
  const float* u = ptr(up);
  // Element by element, the vector body's lanes and the scalar tail compute the same values
  // (exp_lane is exp_avx2's lane), so where a range starts changes nothing.
  over_elements(gate, [&](int64_t at, int64_t n) { backend::silu_mul(g + at, u + at, n); });
}

void CpuBackend::rope_qk(const Tensor& q, const Tensor& k, int64_t head_dim,
                         const Tensor& positions, const RopeConfig& rope) {
  VESPER_CHECK(q.rows == k.rows && positions.numel() >= q.rows, "rope_qk: shapes do not match");
  RopeParams p;
  p.style = rope.style;
  p.rope_dims = rope.rope_dims;
  p.freq_base = rope.freq_base;
  p.freq_scale = rope.freq_scale;
  p.freq_factors = rope.freq_factors.buffer.valid() ? ptr(rope.freq_factors) : nullptr;
  p.ext_factor = rope.ext_factor;
  p.attn_factor = rope.attn_factor;
  p.corr_low = rope.corr_low;
  p.corr_high = rope.corr_high;
  float *qd = ptr(q), *kd = ptr(k);
  const int32_t* pos = ptr<int32_t>(positions);
  // Row by row, each row's angles from its own position: any split of the rows gives the same.
  over_rows(q.rows, q.cols + k.cols, [&](int64_t begin, int64_t end) {
    backend::rope_qk(qd + begin * q.cols, q.cols / head_dim, kd + begin * k.cols, k.cols / head_dim,
                     end - begin, head_dim, pos + begin, p);
  });
}

AttentionBatch CpuBackend::attention_batch(const AttentionInputs& in) const {
  AttentionBatch b;
  b.num_tokens = in.num_tokens;
  b.positions = ptr<int32_t>(in.positions);
  b.token_seq = ptr<int32_t>(in.token_seq);
  b.slot_mapping = ptr<int64_t>(in.slot_mapping);
  b.block_tables = ptr<int32_t>(in.block_tables);
  b.table_offsets = ptr<int32_t>(in.table_offsets);
  if (in.tree_parents.buffer.valid()) {
    b.tree_parents = ptr<int32_t>(in.tree_parents);
    b.query_start = ptr<int32_t>(in.query_start);
  }
  if (in.quantized_groups.buffer.valid()) b.quantized_groups = ptr<int32_t>(in.quantized_groups);
  if (in.gap_begin.buffer.valid()) {
    b.gap_begin = ptr<int32_t>(in.gap_begin);
    b.gap_end = ptr<int32_t>(in.gap_end);
  }
  if (in.block_budget.buffer.valid()) b.block_budget = ptr<int32_t>(in.block_budget);
  return b;
}

void CpuBackend::write_kv(KvHandle kv, int64_t layer, const AttentionInputs& in, const Tensor& k,
                          const Tensor& v) {
  backend::write_kv(cache(kv), layer, attention_batch(in), ptr(k), ptr(v), *pool_);
}

void CpuBackend::paged_attention(KvHandle kv, int64_t layer, const AttentionInputs& in,
                                 const Tensor& q, int64_t n_heads, float scale, const Tensor& out) {
  backend::paged_attention(cache(kv), layer, attention_batch(in), ptr(q), n_heads, scale, ptr(out),
                           *pool_);
}

void CpuBackend::gather_rows(const Tensor& src, const Tensor& rows, const Tensor& dst) {
  VESPER_CHECK(src.cols == dst.cols && dst.rows == rows.numel() && src.dtype == dst.dtype,
               "gather_rows: shapes do not match");
  const auto row_bytes = static_cast<size_t>(src.cols * dtype_bytes(src.dtype));
  const int32_t* ids = ptr<int32_t>(rows);
  const auto* from = ptr<std::byte>(src);
  auto* to = ptr<std::byte>(dst);
  for (int64_t i = 0; i < dst.rows; ++i) {
    VESPER_CHECK(ids[i] >= 0 && ids[i] < src.rows, "gather_rows: row %d of %lld", ids[i],
                 static_cast<long long>(src.rows));
    std::memcpy(to + i * row_bytes, from + ids[i] * row_bytes, row_bytes);
  }
}

void CpuBackend::all_gather_columns(const Tensor& part, const Tensor& full) {
  collect_columns(part, full, true);
}

void CpuBackend::gather_columns(const Tensor& part, const Tensor& full) {
  collect_columns(part, full, false);
}

void CpuBackend::send(const Tensor& x, int to) {
  VESPER_CHECK(group_ != nullptr && x.dtype == DType::kF32, "send: f32 within a group only");
  group_->send(ptr(x), x.numel(), to);
}

void CpuBackend::receive(const Tensor& x, int from) {
  VESPER_CHECK(group_ != nullptr && x.dtype == DType::kF32, "receive: f32 within a group only");
  group_->receive(ptr(x), x.numel(), from);
}

Backend::Transfer CpuBackend::begin_send(const Tensor& x, int to) {
  VESPER_CHECK(group_ != nullptr && x.dtype == DType::kF32, "send: f32 within a group only");
  return group_->begin_send(ptr(x), x.numel(), to);
}

Backend::Transfer CpuBackend::begin_receive(const Tensor& x, int from) {
  VESPER_CHECK(group_ != nullptr && x.dtype == DType::kF32, "receive: f32 within a group only");
  return group_->begin_receive(ptr(x), x.numel(), from);
}

void CpuBackend::complete_transfer(Transfer transfer) {
  VESPER_CHECK(group_ != nullptr, "complete_transfer: no group");
  group_->complete(transfer);
}

void CpuBackend::collect_columns(const Tensor& part, const Tensor& full, bool everyone) {
  const int ranks = tensor_group_ != nullptr ? tensor_group_->size() : 1;
  VESPER_CHECK(part.dtype == DType::kF32 && full.dtype == DType::kF32 && part.rows == full.rows &&
                   part.cols * ranks == full.cols,
               "gather_columns: shapes do not match");
  const int64_t rows = part.rows, cols = part.cols;
  const float* src = ptr(part);
  if (ranks == 1) {
    std::memcpy(ptr(full), src, static_cast<size_t>(part.numel()) * sizeof(float));
    return;
  }
  const bool receives = everyone || tensor_group_->rank() == 0;
  if (receives) gathered_columns_.resize(static_cast<size_t>(ranks * part.numel()));
  if (everyone)
    tensor_group_->all_gather(src, part.numel(), gathered_columns_.data());
  else
    tensor_group_->gather(src, part.numel(), receives ? gathered_columns_.data() : nullptr, 0);
  if (!receives) return;
  float* dst = ptr(full);
  for (int r = 0; r < ranks; ++r)
    for (int64_t i = 0; i < rows; ++i)
      std::memcpy(dst + i * full.cols + r * cols,
                  gathered_columns_.data() + (static_cast<int64_t>(r) * rows + i) * cols,
                  static_cast<size_t>(cols) * sizeof(float));
}

}  // namespace vesper::backend
