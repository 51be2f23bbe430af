// Calls chain_verify through the C++ API: checks a greedy case with a known
// answer, then prints a sampled result that tests/test_cpp_api.py compares
// with the Python wrapper on the same inputs.
#include <ATen/ATen.h>
#include <xkernels/ops.h>

#include <cstdio>

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
  std::printf("accept_len");
  for (int64_t i = 0; i < a.size(0); ++i) std::printf(" %ld", static_cast<long>(a[i].item<int64_t>()));
  std::printf("\nout_tokens");
  auto flat = o.flatten();
  for (int64_t i = 0; i < flat.size(0); ++i) std::printf(" %ld", static_cast<long>(flat[i].item<int64_t>()));
  std::printf("\n");
  return 0;
}
