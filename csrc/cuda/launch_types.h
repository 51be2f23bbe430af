// Element types the CUDA launchers take, without torch headers.
#pragma once

namespace xkernels::cuda {

enum class LogitsType { kFloat32, kBFloat16, kFloat16 };
enum class WeightType { kFloat32, kBFloat16 };

}  // namespace xkernels::cuda
