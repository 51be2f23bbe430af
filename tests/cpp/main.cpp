// Calls chain_verify, shard_row_stats, shard_cut_histogram, shard_cut_pick, shard_cut_candidates, refine_step
// (also with vLLM's filter order), dllm_step and build_draft_tree_with_mask
// through the C++ API:
// checks a greedy case with a known answer, then prints sampled results and the
// messages of bad arguments that tests/test_cpp_api.py compares with the Python
// wrapper on the same inputs.
#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <xkernels/ops.h>

#include <cstdio>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

// "name v0 v1 ...": int64 tensors as integers, float32 ones with the digits that round-trip.
static void print_values(const char* name, const at::Tensor& t) {
  std::printf("%s", name);
  const auto flat = t.flatten().contiguous();
  for (int64_t i = 0; i < flat.size(0); ++i) {
    if (flat.scalar_type() == at::kLong) {
      std::printf(" %ld", static_cast<long>(flat[i].item<int64_t>()));
    } else {
      std::printf(" %.9g", flat[i].item<float>());
    }
  }
  std::printf("\n");
}

// "name message": the first line of the error call raises (the program fails if it raises none).
static bool print_error(const char* name, const std::function<void()>& call) {
  try {
    call();
  } catch (const c10::Error& e) {
    const std::string msg = e.what_without_backtrace();
    std::printf("%s %s\n", name, msg.substr(0, msg.find('\n')).c_str());
    return true;
  }
  std::fprintf(stderr, "%s: no error raised\n", name);
  return false;
}

// shard_row_stats of a shard holding ids [5, 25), sampled at T = 0.7 over selected rows with
// excluded ids, once with an int seed and offset and once with them in int64 tensors.
static bool shard_row_stats_case() {
  at::manual_seed(1);
  const auto logits = at::randn({3, 4, 20});
  const auto rows = at::tensor({0, 3, 2, 2, 1, 0}, at::kLong).reshape({3, 2});
  const auto exclude = at::tensor({5, -1, 24, 9, -1, -1, 7, 7, 6, -1, -1, -1}, at::kLong).reshape({3, 2, 2});
  const char* names[6] = {"row_max", "row_sum", "top_id", "pick_score", "pick_id", "pick_logit"};
  const auto as_list = [](const auto& outputs) {
    return std::apply([](const auto&... t) { return std::vector<at::Tensor>{t...}; }, outputs);
  };
  const auto by_int = as_list(xkernels::shard_row_stats(logits, 5, rows, exclude, std::nullopt, std::nullopt, 8, true,
                                                        false, 0.7, 11, 3));
  const auto by_tensor = as_list(xkernels::shard_row_stats(logits, 5, rows, exclude, std::nullopt, std::nullopt, 8,
                                                           true, false, 0.7, 0, 0, at::scalar_tensor(11, at::kLong),
                                                           at::tensor({int64_t{3}})));
  for (int i = 0; i < 6; ++i) {
    if (!at::equal(by_int[i], by_tensor[i])) {
      std::fprintf(stderr, "shard_row_stats: %s differs between an int and a tensor seed\n", names[i]);
      return false;
    }
    print_values((std::string("shard_") + names[i]).c_str(), by_int[i]);
  }
  return print_error("shard_error_rows", [&] { xkernels::shard_row_stats(logits, 5, rows.to(at::kInt)); }) &&
         print_error("shard_error_seed", [&] {
           xkernels::shard_row_stats(logits, 5, std::nullopt, std::nullopt, std::nullopt, std::nullopt, -1, true,
                                     false, 1.0, 0, 0, at::scalar_tensor(1, at::kInt));
         });
}

// refine_step and dllm_step with one xkernels::Sampling: per-row temperatures (a greedy row among
// sampled ones), a scalar and a per-row filter, a stream per request.
static void per_row_sampling_case() {
  at::manual_seed(2);
  const auto ctx = at::randn({3, 4, 6});
  const auto prev_tokens = at::randint(0, 20, {3, 4});
  const auto base_logits = at::randn({3, 2, 20});
  const auto w = [](at::IntArrayRef shape) { return at::randn(shape) * 0.1; };  // rows far from point masses
  const xkernels::RefinerWeights weights{w({20, 6}), w({6, 4, 4}), w({5, 6}), w({5, 6}), w({6, 5}), w({20, 6})};
  const auto dllm_logits = at::randn({3, 4, 20});
  const xkernels::Sampling sampling{.temperature_tensor = at::tensor({0.0f, 0.8f, 1.5f}),
                                    .top_k = 5,
                                    .top_p_tensor = at::tensor({1.0f, 0.9f, 0.6f}),
                                    .seed_tensor = at::tensor({int64_t{11}, int64_t{12}, int64_t{13}}),
                                    .offset_tensor = at::tensor({int64_t{0}, int64_t{4}, int64_t{9}})};
  const auto [tokens, logprobs] = xkernels::refine_step(ctx, prev_tokens, base_logits, weights, sampling);
  print_values("refine_tokens", tokens);
  print_values("refine_logprobs", logprobs);
  const auto block = at::full({3, 4}, 19, at::kLong);
  const auto dllm = xkernels::dllm_step(dllm_logits, block, 19, 2, std::nullopt, sampling);
  print_values("dllm_new_block", std::get<0>(dllm));
  print_values("dllm_confidence", std::get<3>(dllm));
}

// refine_step with Sampling::filter_order "min_p_first" where min-p and top-p are both on (flat rows:
// the orders keep different ids), and a bad filter_order.
static bool filter_order_case() {
  at::manual_seed(4);
  const auto ctx = at::randn({3, 4, 6});
  const auto prev_tokens = at::randint(0, 20, {3, 4});
  const auto base_logits = at::randn({3, 2, 20});
  const auto w = [](at::IntArrayRef shape) { return at::randn(shape) * 0.1; };
  const xkernels::RefinerWeights weights{w({20, 6}), w({6, 4, 4}), w({5, 6}), w({5, 6}), w({6, 5}), w({20, 6})};
  xkernels::Sampling sampling{.temperature = 3.0, .top_p = 0.5, .min_p = 0.3, .seed = 5,
                              .filter_order = "min_p_first"};
  const auto [tokens, logprobs] = xkernels::refine_step(ctx, prev_tokens, base_logits, weights, sampling);
  print_values("order_tokens", tokens);
  print_values("order_logprobs", logprobs);
  sampling.filter_order = "vllm";
  return print_error("order_error",
                     [&] { xkernels::refine_step(ctx, prev_tokens, base_logits, weights, sampling); });
}

// The radix select of a top-k count of 7 over a whole row (one rank: no all-reduce between the
// rounds), as xkernels.distributed.filter_cuts runs it: 8 rounds of shard_cut_histogram and
// shard_cut_pick; prints the final key of each row, and the row's 7 lowest keys by
// shard_cut_candidates (a bounded top-k's path), whose last is that cut.
static void shard_cut_case() {
  at::manual_seed(3);
  const auto logits = at::randn({2, 300}).to(at::kBFloat16);
  const auto scale = at::full({2}, 0.8f);
  auto prefix = at::zeros({2}, at::kLong);
  auto before = at::zeros({2, 2}, at::kLong);
  const auto target = at::full({2}, 7.0 * 4611686018427387904.0, at::kDouble);  // 7 ids of weight 2^62
  for (int64_t shift = 56; shift >= 0; shift -= 8) {
    const auto hist = xkernels::shard_cut_histogram(logits, scale, prefix, shift, 40);
    std::tie(prefix, before) = xkernels::shard_cut_pick(hist.narrow(1, 0, 1).contiguous(), prefix, before, target);
  }
  print_values("cut_key", prefix);
  print_values("candidate_keys", std::get<0>(xkernels::shard_cut_candidates(logits, scale, 7, 40)));
}

// build_draft_tree_with_mask against build_draft_tree and tree_attention_mask: the same tree and
// mask in both layouts; prints the packed mask for the Python wrapper's.
static bool draft_tree_case() {
  at::manual_seed(5);
  const auto [lp, tok] = at::randn({3, 4, 20}).log_softmax(-1).topk(3, -1);
  const auto tree = xkernels::build_draft_tree(lp, tok, 9);
  const auto [tokens, parents, num_nodes, depth] = tree;
  for (const bool packed : {false, true}) {
    const auto fused = xkernels::build_draft_tree_with_mask(lp, tok, 9, packed);
    const bool same = at::equal(std::get<0>(fused), tokens) && at::equal(std::get<1>(fused), parents) &&
                      at::equal(std::get<2>(fused), num_nodes) && at::equal(std::get<3>(fused), depth) &&
                      at::equal(std::get<4>(fused), xkernels::tree_attention_mask(parents, num_nodes, packed));
    if (!same) {
      std::fprintf(stderr, "build_draft_tree_with_mask (packed=%d) differs from the two calls\n", packed);
      return false;
    }
    if (packed) print_values("tree_packed_mask", std::get<4>(fused).to(at::kLong));
  }
  return true;
}

int main() {
  // Greedy: the target's argmax is planted; drafts agree on the first two rows only.
  auto logits = at::zeros({1, 4, 8});
  const int64_t argmax[4] = {3, 5, 1, 6};
  for (int i = 0; i < 4; ++i) logits[0][i][argmax[i]] = 1.0;
  auto drafts = at::tensor({3, 5, 2}, at::kLong).reshape({1, 3});
  auto [accept_len, out] = xkernels::chain_verify(drafts, logits);
  const bool greedy_ok = accept_len.item<int64_t>() == 2 && out[0][0].item<int64_t>() == 3 &&
                         out[0][1].item<int64_t>() == 5 && out[0][2].item<int64_t>() == 1 &&
                         out[0][3].item<int64_t>() == -1;
  if (!greedy_ok) {
    std::fprintf(stderr, "greedy chain_verify gave a wrong result\n");
    return 1;
  }

  at::manual_seed(0);
  auto sampled_logits = at::randn({4, 4, 50});
  auto sampled_drafts = at::randint(0, 50, {4, 3});
  auto [a, o] = xkernels::chain_verify(sampled_drafts, sampled_logits, std::nullopt, 1.0, 7, 3);
  std::printf("build_info %s\n", xkernels::build_info().c_str());
  print_values("accept_len", a);
  print_values("out_tokens", o);
  per_row_sampling_case();
  shard_cut_case();
  return shard_row_stats_case() && filter_order_case() && draft_tree_case() ? 0 : 1;
}
