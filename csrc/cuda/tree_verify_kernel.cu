// tree_verify's walks that do not cut their rows (tree_walk.cuh): without draft_probs, and with them
// of each q type.
#include "tree_walk.cuh"

#define XK_TREE_WALKS(T)                             \
  XK_TREE_VERIFY_WALK(T, float, false, false)        \
  XK_TREE_VERIFY_WALK(T, float, true, false)         \
  XK_TREE_VERIFY_WALK(T, __nv_bfloat16, true, false) \
  XK_TREE_VERIFY_WALK(T, __half, true, false)
XK_TREE_WALKS(float)
XK_TREE_WALKS(__nv_bfloat16)
XK_TREE_WALKS(__half)
#undef XK_TREE_WALKS
