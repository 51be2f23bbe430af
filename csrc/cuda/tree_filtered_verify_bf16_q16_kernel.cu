// tree_verify's walks that cut their rows (top-k, top-p, min-p) on bfloat16 logits with bfloat16 or
// float16 draft_probs (tree_walk.cuh), apart from the others (tree_filtered_verify_bf16_kernel.cu)
// so that no translation unit compiles for long.
#include "tree_walk.cuh"

XK_TREE_TEAM_WALK_ELSEWHERE(__nv_bfloat16, __nv_bfloat16, true)
XK_TREE_TEAM_WALK_ELSEWHERE(__nv_bfloat16, __half, true)
XK_TREE_VERIFY_WALK(__nv_bfloat16, __nv_bfloat16, true, true)
XK_TREE_VERIFY_WALK(__nv_bfloat16, __half, true, true)
