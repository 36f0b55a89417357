#include "hf/tensor_map.h"

#include <cstring>

namespace vesper::hf {

std::vector<ExpectedTensor> expected_tensors(const HfConfig& c) {
  const int64_t h = c.hidden_size;
  const int64_t q_rows = c.num_attention_heads * c.head_dim;
  const int64_t kv_rows = c.num_key_value_heads * c.head_dim;
  const Conversion qk = c.permutes_qk() ? Conversion::kPermuteQK : Conversion::kAsStored;
  std::vector<ExpectedTensor> t = {
      {"model.embed_tokens.weight", "token_embd.weight", {c.vocab_size, h}},
      {"model.norm.weight", "output_norm.weight", {h}, Conversion::kToF32},
  };
  if (!c.tie_word_embeddings)
    t.push_back(
        {"lm_head.weight", "output.weight", {c.vocab_size, h}, Conversion::kAsStored, 0, false});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string hf = "model.layers." + std::to_string(i) + ".";
    const std::string gg = "blk." + std::to_string(i) + ".";
    t.push_back({hf + "input_layernorm.weight", gg + "attn_norm.weight", {h}, Conversion::kToF32});
    t.push_back({hf + "self_attn.q_proj.weight",
                 gg + "attn_q.weight",
                 {q_rows, h},
                 qk,
                 c.num_attention_heads});
    t.push_back({hf + "self_attn.k_proj.weight",
                 gg + "attn_k.weight",
                 {kv_rows, h},
                 qk,
                 c.num_key_value_heads});
    t.push_back({hf + "self_attn.v_proj.weight", gg + "attn_v.weight", {kv_rows, h}});
    if (c.arch == "qwen2") {
      t.push_back({hf + "self_attn.q_proj.bias", gg + "attn_q.bias", {q_rows}, Conversion::kToF32});
      t.push_back(
          {hf + "self_attn.k_proj.bias", gg + "attn_k.bias", {kv_rows}, Conversion::kToF32});
      t.push_back(
          {hf + "self_attn.v_proj.bias", gg + "attn_v.bias", {kv_rows}, Conversion::kToF32});
    }
    if (c.arch == "qwen3") {
      t.push_back({hf + "self_attn.q_norm.weight",
                   gg + "attn_q_norm.weight",
                   {c.head_dim},
                   Conversion::kToF32});
      t.push_back({hf + "self_attn.k_norm.weight",
                   gg + "attn_k_norm.weight",
                   {c.head_dim},
                   Conversion::kToF32});
    }
    t.push_back({hf + "self_attn.o_proj.weight", gg + "attn_output.weight", {h, q_rows}});
    t.push_back(
        {hf + "post_attention_layernorm.weight", gg + "ffn_norm.weight", {h}, Conversion::kToF32});
    t.push_back({hf + "mlp.gate_proj.weight", gg + "ffn_gate.weight", {c.intermediate_size, h}});
    t.push_back({hf + "mlp.up_proj.weight", gg + "ffn_up.weight", {c.intermediate_size, h}});
    t.push_back({hf + "mlp.down_proj.weight", gg + "ffn_down.weight", {h, c.intermediate_size}});
  }
  return t;
}

bool is_ignored_tensor(const std::string& hf_name) {
  return hf_name.ends_with(".rotary_emb.inv_freq");
}

std::vector<int32_t> qk_row_order(int64_t heads, int64_t head_dim) {
  std::vector<int32_t> order(static_cast<size_t>(heads * head_dim));
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t j = 0; j < half; ++j)
      for (int64_t i = 0; i < 2; ++i)
        order[static_cast<size_t>(h * head_dim + 2 * j + i)] =
            static_cast<int32_t>(h * head_dim + i * half + j);
  return order;
}

void permute_qk_rows(const uint8_t* src, uint8_t* dst, int64_t heads, int64_t head_dim,
                     size_t row_bytes) {
  const std::vector<int32_t> order = qk_row_order(heads, head_dim);
  for (size_t to = 0; to < order.size(); ++to)
    std::memcpy(dst + to * row_bytes, src + static_cast<size_t>(order[to]) * row_bytes, row_bytes);
}

}  // namespace vesper::hf
