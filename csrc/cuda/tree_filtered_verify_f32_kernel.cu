// tree_verify's walks that cut their rows (top-k, top-p, min-p) on float32 logits (tree_walk.cuh):
// without draft_probs and with float32 ones (16-bit ones: tree_filtered_verify_f32_q16_kernel.cu).
#include "tree_walk.cuh"

XK_TREE_TEAM_WALK_ELSEWHERE(float, float, false)
XK_TREE_TEAM_WALK_ELSEWHERE(float, float, true)
XK_TREE_VERIFY_WALK(float, float, false, true)
XK_TREE_VERIFY_WALK(float, float, true, true)
