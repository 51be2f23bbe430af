#include "refine_read.h"

#include <c10/util/Exception.h>

#include <cstdlib>
#include <cstring>

#include "../cpu/read_stats.h"

namespace xkernels {

RefineRead refine_read_from_env() {
  const char* v = std::getenv("XKERNELS_REFINE_READ");
  if (v == nullptr || *v == '\0' || std::strcmp(v, "auto") == 0) return RefineRead::kAuto;
  if (std::strcmp(v, "gemm") == 0) return RefineRead::kGemm;
  if (std::strcmp(v, "fused") == 0) return RefineRead::kFused;
  TORCH_CHECK(false, "XKERNELS_REFINE_READ must be auto, gemm or fused, got '", v, "'");
}

bool cpu_read_fused() { return refine_read_from_env() != RefineRead::kGemm && cpu::read_stats_supported(); }

}  // namespace xkernels
