// tree_verify's walks that cut their rows (top-k, top-p, min-p) on float32 logits with bfloat16 or
// float16 draft_probs (tree_walk.cuh), apart from the others (tree_filtered_verify_f32_kernel.cu)
// so that no translation unit compiles for long.
#include "tree_walk.cuh"

XK_TREE_TEAM_WALK_ELSEWHERE(float, __nv_bfloat16, true)
XK_TREE_TEAM_WALK_ELSEWHERE(float, __half, true)
XK_TREE_VERIFY_WALK(float, __nv_bfloat16, true, true)
XK_TREE_VERIFY_WALK(float, __half, true, true)
