// Adapter::upload: a read adapter (HostAdapter, lora/adapter.cpp) into one backend buffer. Apart
// from the reader so that the reader builds without a backend (the fuzz target of
// tests/fuzz/fuzz_adapter.cpp).
#include <algorithm>

#include "core/fp16.h"
#include "lora/adapter.h"

namespace vesper::lora {

std::unique_ptr<Adapter> Adapter::upload(const HostAdapter& host, backend::Backend& backend) {
  std::unique_ptr<Adapter> a(new Adapter(backend));
  a->path_ = host.path;
  a->kind_ = host.kind;
  a->max_rank_ = host.max_rank;
  const auto n = static_cast<int64_t>(host.data.size());
  const backend::DType dtype = host.f16_exact ? backend::DType::kF16 : backend::DType::kF32;
  a->bytes_ = n * backend::dtype_bytes(dtype);
  a->buffer_ = backend.allocate(dtype, 1, std::max<int64_t>(n, 1), backend::MemoryKind::kDevice);
  if (n > 0 && host.f16_exact) {
    std::vector<uint16_t> half(static_cast<size_t>(n));
    for (size_t i = 0; i < half.size(); ++i) half[i] = f32_to_fp16(host.data[i]);  // exact
    backend.copy_to_device(a->buffer_, half.data());
  } else if (n > 0) {
    backend.copy_to_device(a->buffer_, host.data.data());
  }
  auto view = [&](int64_t offset, int64_t count) {
    return backend::Tensor{a->buffer_.buffer, dtype, offset, 1, count};
  };
  for (const HostAdapter::Module& m : host.modules) {
    backend::LowRankModule d;
    if (m.rank > 0) {
      d.rank = m.rank;
      d.n_in = m.n_in;
      d.n_out = m.n_out;
      d.scale = m.scale;
      d.a_stride = m.a_stride;
      d.b_stride = m.b_stride;
      d.a = view(m.a, (m.rank - 1) * m.a_stride + m.n_in);
      d.b = view(m.b, (m.n_out - 1) * m.b_stride + m.rank);
      if (m.lambda_d >= 0) d.lambda_d = view(m.lambda_d, m.rank);
      if (m.lambda_b >= 0) d.lambda_b = view(m.lambda_b, m.n_out);
      d.permute_head_dim = m.permute_head_dim;
    }
    a->modules_.push_back(d);
  }
  return a;
}

Adapter::~Adapter() {
  if (buffer_.buffer.valid()) backend_.release(buffer_.buffer);
}

}  // namespace vesper::lora
