// Stand-in for the CUDA header of the same name: the emulation provides what the kernels use.
#pragma once
#include "../cuda_emu.h"
