// Stand-in for the CUDA header of the same name: asynchronous copies into shared memory, emulated
// by cuda_emu.cpp's async_copy (the destination is written at the wait that covers its group).
#pragma once
#include "../cuda_emu.h"

inline void __pipeline_memcpy_async(void* dst_shared, const void* src_global, size_t size_and_align,
                                    size_t zfill = 0) {
  xk_emu::async_copy(dst_shared, src_global, size_and_align, zfill);
}
inline void __pipeline_commit() { xk_emu::async_commit(); }
inline void __pipeline_wait_prior(size_t prior) { xk_emu::async_wait_prior(prior); }
