// tree_verify's walks that cut their rows (top-k, top-p, min-p) on bfloat16 logits (tree_walk.cuh):
// without draft_probs and with float32 ones (16-bit ones: tree_filtered_verify_bf16_q16_kernel.cu).
#include "tree_walk.cuh"

XK_TREE_TEAM_WALK_ELSEWHERE(__nv_bfloat16, float, false)
XK_TREE_TEAM_WALK_ELSEWHERE(__nv_bfloat16, float, true)
XK_TREE_VERIFY_WALK(__nv_bfloat16, float, false, true)
XK_TREE_VERIFY_WALK(__nv_bfloat16, float, true, true)
