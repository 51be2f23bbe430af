// tree_verify's walks that cut their rows on float32 logits with bfloat16 or float16 draft_probs,
// as a cluster of kVerifyTeam blocks a sequence (tree_walk.cuh): apart from the lone walks
// (tree_filtered_verify_f32_q16_kernel.cu) so that no translation unit compiles for long.
#include "tree_walk.cuh"

XK_TREE_TEAM_WALK(float, __nv_bfloat16, true)
XK_TREE_TEAM_WALK(float, __half, true)
