"""Rewrites a .cu file into C++ for the CUDA emulation: the two pieces of CUDA syntax a host
compiler cannot parse. Every other line stays as it is (line numbers are kept for messages).

    kernel<T, 8><<<grid, block, smem, stream>>>(args)  ->  ::xk_emu::launch("kernel", kernel<T, 8>, grid, block, smem, stream)(args)
    extern __shared__ float smem[];                      ->  float* smem = ::xk_emu::dynamic_smem<float>();
"""
import re
import sys
from pathlib import Path

LAUNCH = re.compile(r"([A-Za-z_][\w:]*(?:<[^<>;]*>)?)<<<(.*?)>>>")
DYNAMIC_SMEM = re.compile(r"extern\s+__shared__\s+(?:__align__\(\d+\)\s+|alignas\(\d+\)\s+)?([\w:]+)\s+(\w+)\[\];")


def translate(text):
    # The kernel's name goes along, so that the emulation can tell which kernels have run.
    text = LAUNCH.sub(lambda m: f'::xk_emu::launch("{re.sub("<.*", "", m[1]).split("::")[-1]}", {m[1]}, {m[2]})', text)
    text = DYNAMIC_SMEM.sub(r"\1* \2 = ::xk_emu::dynamic_smem<\1>();", text)
    if "<<<" in text or re.search(r"extern\s+__shared__", text):
        raise SystemExit("translate.py: a launch or dynamic shared memory declaration it cannot rewrite")
    return text


if __name__ == "__main__":
    src, dst = Path(sys.argv[1]).resolve(), Path(sys.argv[2])
    dst.write_text(f'#line 1 "{src}"\n' + translate(src.read_text()))
