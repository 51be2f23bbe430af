// tree_verify's walks that cut their rows on bfloat16 logits without draft_probs and with float32
// ones, as a cluster of kVerifyTeam blocks a sequence (tree_walk.cuh): apart from the lone walks
// (tree_filtered_verify_bf16_kernel.cu) so that no translation unit compiles for long.
#include "tree_walk.cuh"

XK_TREE_TEAM_WALK(__nv_bfloat16, float, false)
XK_TREE_TEAM_WALK(__nv_bfloat16, float, true)
