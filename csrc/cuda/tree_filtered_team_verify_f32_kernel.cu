// tree_verify's walks that cut their rows on float32 logits without draft_probs and with float32
// ones, as a cluster of kVerifyTeam blocks a sequence (tree_walk.cuh): apart from the lone walks
// (tree_filtered_verify_f32_kernel.cu) so that no translation unit compiles for long.
#include "tree_walk.cuh"

XK_TREE_TEAM_WALK(float, float, false)
XK_TREE_TEAM_WALK(float, float, true)
