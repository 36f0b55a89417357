// Tree descriptions in a ForwardBatch (speculative candidates shaped as a tree, verified in one
// pass): the batch builder's positions and slots for a hand-built tree, and the reference
// attention's tree mask: each node sees the context and its own path from the root, exactly as
// the same path laid out as a plain causal chain would, and nothing of its siblings.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "model/forward_batch.h"
#include "model/model_test_util.h"
#include "reference/reference_attention.h"

namespace vesper::model {
namespace {

constexpr int64_t kBlockSize = 4, kHeads = 4, kKvHeads = 2, kHeadDim = 8, kContext = 6;
constexpr int64_t kRow = kKvHeads * kHeadDim;

struct KvStore {
  std::map<int64_t, std::vector<float>> k, v;
  std::function<const float*(int64_t)> key() const {
    return [this](int64_t slot) { return k.at(slot).data(); };
  }
  std::function<const float*(int64_t)> value() const {
    return [this](int64_t slot) { return v.at(slot).data(); };
  }
};

std::vector<float> random_row(std::mt19937& rng, int64_t n) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> r(n);
  for (float& x : r) x = d(rng);
  return r;
}

TEST(TreeAttention, EachNodeSeesTheContextAndItsPathOnly) {
  std::mt19937 rng(7);
  // Blocks 5, 2, 7 hold positions 0-3, 4-7, 8-11.
  const std::vector<int32_t> table = {5, 2, 7};
  auto slot_of = [&](int64_t pos) {
    return int64_t{table[pos / kBlockSize]} * kBlockSize + pos % kBlockSize;
  };
  // Node 0 is the root; 1 and 2 are its children; 3 is 1's child, 4 is 2's.
  const std::vector<int32_t> parents = {-1, 0, 0, 1, 2};
  const std::vector<int32_t> tokens = {11, 12, 13, 14, 15};
  ForwardBatch batch;
  batch.add_sequence(tokens, kContext, table, kBlockSize, 5, -1, parents);
  ASSERT_TRUE(batch.has_trees());
  EXPECT_EQ(batch.positions, (std::vector<int32_t>{6, 7, 7, 8, 8}));  // start + depth
  for (int64_t i = 0; i < 5; ++i)
    EXPECT_EQ(batch.slot_mapping[i], slot_of(kContext + i)) << i;  // slot by offset
  EXPECT_EQ(batch.logits_rows, (std::vector<int32_t>{0, 1, 2, 3, 4}));

  KvStore store;
  for (int64_t p = 0; p < kContext; ++p) {
    store.k[slot_of(p)] = random_row(rng, kRow);
    store.v[slot_of(p)] = random_row(rng, kRow);
  }
  std::vector<std::vector<float>> node_k, node_v;
  for (int64_t i = 0; i < 5; ++i) {
    node_k.push_back(random_row(rng, kRow));
    node_v.push_back(random_row(rng, kRow));
    store.k[batch.slot_mapping[i]] = node_k[i];
    store.v[batch.slot_mapping[i]] = node_v[i];
  }
  const std::vector<float> q = random_row(rng, 5 * kHeads * kHeadDim);
  const double scale = 0.35;
  const auto tree = reference::batch_attention(batch, kBlockSize, store.key(), store.value(),
                                               q.data(), kHeads, kKvHeads, kHeadDim, scale);
  ASSERT_EQ(tree.size(), 5u);

  // Node i against its path laid out as a causal chain after the same context.
  const std::vector<std::vector<int32_t>> paths = {{0}, {0, 1}, {0, 2}, {0, 1, 3}, {0, 2, 4}};
  for (int64_t i = 0; i < 5; ++i) {
    const std::vector<int32_t>& path = paths[i];
    KvStore chain_store;
    for (int64_t p = 0; p < kContext; ++p) {
      chain_store.k[slot_of(p)] = store.k.at(slot_of(p));
      chain_store.v[slot_of(p)] = store.v.at(slot_of(p));
    }
    std::vector<int32_t> chain_tokens;
    std::vector<float> chain_q;
    for (size_t j = 0; j < path.size(); ++j) {
      chain_store.k[slot_of(kContext + static_cast<int64_t>(j))] = node_k[path[j]];
      chain_store.v[slot_of(kContext + static_cast<int64_t>(j))] = node_v[path[j]];
      chain_tokens.push_back(tokens[path[j]]);
      chain_q.insert(chain_q.end(), q.begin() + path[j] * kHeads * kHeadDim,
                     q.begin() + (path[j] + 1) * kHeads * kHeadDim);
    }
    ForwardBatch chain;
    chain.add_sequence(chain_tokens, kContext, table, kBlockSize, 1);
    ASSERT_FALSE(chain.has_trees());
    const auto causal =
        reference::batch_attention(chain, kBlockSize, chain_store.key(), chain_store.value(),
                                   chain_q.data(), kHeads, kKvHeads, kHeadDim, scale);
    EXPECT_EQ(tree[i], causal.back()) << "node " << i;
  }

  // A node's sibling subtree is invisible to it: seeing node 2 would change node 3's output.
  std::vector<const float*> keys, values;
  for (int64_t p = 0; p < kContext; ++p) {
    keys.push_back(store.k.at(slot_of(p)).data());
    values.push_back(store.v.at(slot_of(p)).data());
  }
  for (int32_t n : {0, 1, 2, 3}) {
    keys.push_back(node_k[n].data());
    values.push_back(node_v[n].data());
  }
  const auto with_sibling = reference::attention(q.data() + 3 * kHeads * kHeadDim, kHeads, kKvHeads,
                                                 kHeadDim, keys, values, scale);
  EXPECT_NE(tree[3], with_sibling);
}

TEST(TreeAttention, SequencesWithoutATreeStayCausalInAMixedBatch) {
  const std::vector<int32_t> table = {0, 1};
  ForwardBatch batch;
  batch.add_sequence(std::vector<int32_t>{1, 2, 3}, 0, table, kBlockSize, 1);
  batch.add_sequence(std::vector<int32_t>{4, 5, 6}, 2, table, kBlockSize, 3, -1,
                     std::vector<int32_t>{-1, 0, 0});
  batch.add_sequence(std::vector<int32_t>{7}, 5, table, kBlockSize, 1, 3);
  EXPECT_EQ(batch.tree_parents,
            (std::vector<int32_t>{kNoTree, kNoTree, kNoTree, -1, 0, 0, kNoTree}));
  EXPECT_EQ(batch.positions, (std::vector<int32_t>{0, 1, 2, 2, 3, 3, 5}));
  EXPECT_EQ(batch.seq_adapter, (std::vector<int32_t>{-1, -1, 3}));
  EXPECT_EQ(batch.logits_rows, (std::vector<int32_t>{2, 3, 4, 5, 6}));
}

// The model's fast path (the CPU kernels) on a real model: every node of a tree verified in one
// pass beside another sequence's prefill gets the very bits its path gets as a plain causal chain,
// and so does the final hidden state Medusa heads read.
TEST(TreeAttention, ModelLogitsOfEachNodeEqualItsPathAsAChainBitForBit) {
  auto loaded = testing_util::load_model("../shared/models/stories260K.gguf");
  ASSERT_TRUE(loaded.ok()) << loaded.error().message;
  Model& m = *loaded->model;
  const int64_t v = m.config().n_vocab, e = m.config().n_embd, bs = 4;
  // A context long enough to span more than one 32-key tile with the tree past it.
  std::vector<int32_t> context;
  std::mt19937 rng(11);
  for (int i = 0; i < 37; ++i) context.push_back(static_cast<int32_t>(3 + rng() % 500));
  const int64_t c = static_cast<int64_t>(context.size());
  const std::vector<int32_t> parents = {-1, 0, 0, 1, 1, 2, 3, 6, 0};
  const std::vector<int32_t> nodes = {300, 301, 302, 303, 304, 305, 306, 307, 308};
  std::vector<int32_t> table;  // scattered, and apart from the other sequence's blocks 0..2
  for (int32_t i = 0; i < 14; ++i) table.push_back(39 - 2 * i);

  testing_util::ScopedKv kv(m, 40, bs);
  ForwardBatch prefill;
  prefill.add_sequence(context, 0, table, bs, 1);
  m.forward(prefill, kv.handle());
  // The tree, and in the same batch a prompt chunk of another sequence.
  const std::vector<int32_t> other_table = testing_util::block_table(3, 40, 0);  // blocks 0..2
  ForwardBatch tree;
  tree.add_sequence(std::vector<int32_t>{5, 6, 7, 8, 9}, 0, other_table, bs, 1);
  tree.add_sequence(nodes, static_cast<int32_t>(c), table, bs, static_cast<int64_t>(nodes.size()),
                    -1, parents);
  const std::span<const float> tree_logits_view = m.forward(tree, kv.handle());
  const std::vector<float> tree_logits(tree_logits_view.begin(), tree_logits_view.end());
  const std::vector<float> tree_hidden(m.hidden_rows().begin(), m.hidden_rows().end());

  for (size_t i = 0; i < nodes.size(); ++i) {
    std::vector<int32_t> path;
    for (int32_t n = static_cast<int32_t>(i); n >= 0; n = parents[n])
      path.insert(path.begin(), nodes[n]);
    std::vector<int32_t> chain = context;
    chain.insert(chain.end(), path.begin(), path.end());
    testing_util::ScopedKv chain_kv(m, 40, bs);
    ForwardBatch b;
    b.add_sequence(chain, 0, table, bs, 1);
    const std::span<const float> logits = m.forward(b, chain_kv.handle());
    const size_t row = 1 + i;  // row 0 is the other sequence's
    EXPECT_TRUE(std::equal(logits.begin(), logits.end(), tree_logits.begin() + row * v))
        << "node " << i;
    EXPECT_TRUE(
        std::equal(m.hidden_rows().begin(), m.hidden_rows().end(), tree_hidden.begin() + row * e))
        << "hidden state of node " << i;
  }
}

}  // namespace
}  // namespace vesper::model
