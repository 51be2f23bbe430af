"""Rewrites a .cu (or .cuh) file into C++ for the CUDA emulation: the pieces of CUDA syntax a host
compiler cannot parse, and static shared memory. Every other line stays as it is (line numbers are
kept for messages).

    kernel<T, 8><<<grid, block, smem, stream>>>(args)  ->  ::xk_emu::launch("kernel", kernel<T, 8>, grid, block, smem, stream)(args)
    cudaLaunchKernelEx(&config, kernel<T>, args)         ->  ::xk_emu::launch_ex("kernel", &config, kernel<T>, args)
    config.gridDim, config.blockDim                      ->  config.grid_dim, config.block_dim (the built-ins are macros)
    extern __shared__ float smem[];                      ->  float* smem = ::xk_emu::dynamic_smem<float>();
    __shared__ float a[4], b;                            ->  static char a_xk_site; auto& a = ::xk_emu::block_shared<float[4]>(&a_xk_site); (and b)

Static shared memory becomes one copy per running block (the blocks of a cluster run together), found
by the declaration's site (a function-local static: one per template instance) and the block.
"""
import re
import sys
from pathlib import Path

LAUNCH = re.compile(r"([A-Za-z_][\w:]*(?:<[^<>;]*>)?)<<<(.*?)>>>")
LAUNCH_EX = re.compile(r"cudaLaunchKernelEx\(([^,]+),\s*([A-Za-z_][\w:]*(?:<[^<>;]*>)?)\s*,")
DYNAMIC_SMEM = re.compile(r"extern\s+__shared__\s+(?:__align__\(\d+\)\s+|alignas\(\d+\)\s+)?([\w:]+)\s+(\w+)\[\];")
STATIC_SMEM = re.compile(r"__shared__\s+(?:__align__\(\d+\)\s+|alignas\(\d+\)\s+)?([\w:]+(?:<[^<>;]*>)?)\s+([^;()]+);")
DECLARATOR = re.compile(r"\s*(\w+)((?:\[[^\]]+\])*)\s*$")


def static_smem(m):
    out = []
    for part in m[2].split(","):
        d = DECLARATOR.fullmatch(part)
        if not d:
            raise SystemExit(f"translate.py: a __shared__ declarator it cannot rewrite: {part!r}")
        name, dims = d[1], d[2]
        out.append(f"static char {name}_xk_site; auto& {name} = ::xk_emu::block_shared<{m[1]}{dims}>(&{name}_xk_site);")
    return " ".join(out)


def translate(text):
    # The kernel's name goes along, so that the emulation can tell which kernels have run.
    text = LAUNCH.sub(lambda m: f'::xk_emu::launch("{re.sub("<.*", "", m[1]).split("::")[-1]}", {m[1]}, {m[2]})', text)
    text = LAUNCH_EX.sub(lambda m: f'::xk_emu::launch_ex("{re.sub("<.*", "", m[2]).split("::")[-1]}", {m[1]}, {m[2]},',
                         text)
    text = re.sub(r"(\.|->)\s*(grid|block)Dim\b", r"\1\2_dim", text)
    text = DYNAMIC_SMEM.sub(r"\1* \2 = ::xk_emu::dynamic_smem<\1>();", text)
    text = STATIC_SMEM.sub(static_smem, text)
    if "<<<" in text or "cudaLaunchKernelEx(" in text or re.search(r"__shared__", "\n".join(l.split("//")[0] for l in text.splitlines())):
        raise SystemExit("translate.py: a launch or shared memory declaration it cannot rewrite")
    return text


if __name__ == "__main__":
    src, dst = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
    dst.write_text(f'#line 1 "{src}"\n' + translate(src.read_text()))
