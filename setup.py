"""Builds libxkernels with CMake (the same build C++ users get) and puts it in the package.

    pip install --no-build-isolation -e .

Environment:
    XKERNELS_CUDA=0/1      force the CUDA kernels off/on. Default: on when the installed
                           torch is a CUDA build and nvcc is found (a GPU is not needed);
                           otherwise the CPU kernels alone, with any torch build.
    TORCH_CUDA_ARCH_LIST   architectures to compile for. Default: the visible GPUs, or
                           "8.0;9.0a" (Ampere and Hopper) when none is visible.
    CUDA_HOME              the CUDA toolkit; default: found from nvcc.
    MAX_JOBS               parallel compile jobs.
    XKERNELS_BUILD_DIR     CMake's build folder (default build/cmake); one per configuration.
    XKERNELS_PTXAS_VERBOSE=1  print each kernel's registers and spills.
    XKERNELS_LIBSTDCXX     auto (default: link the compiler's shared libstdc++ where it has one) or
                           private (keep a static copy hidden); cmake/SharedLibstdcxx.cmake says why.
"""

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).parent.resolve()
DEFAULT_ARCHS = "8.0;9.0a"


def log(msg):
    print(f"xkernels build: {msg}", flush=True)


def find_cuda_home():
    """The toolkit folder. The nvcc on PATH can be a wrapper script, so ask nvcc itself."""
    if os.environ.get("CUDA_HOME"):
        return Path(os.environ["CUDA_HOME"])
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return None
    try:
        dry = subprocess.run([nvcc, "--dryrun", "-c", "-x", "cu", os.devnull], capture_output=True, text=True)
        m = re.search(r"TOP=(\S+)", dry.stdout + dry.stderr)
        if m:
            return Path(m.group(1)).resolve()
    except OSError:
        pass
    return Path(nvcc).resolve().parent.parent


def use_cuda(torch, cuda_home):
    """(build the CUDA kernels?, why) from the environment, torch and the toolkit."""
    forced = os.environ.get("XKERNELS_CUDA")
    if forced == "1":
        if torch.version.cuda is None or cuda_home is None:
            sys.exit("xkernels build: XKERNELS_CUDA=1 needs a CUDA build of torch and nvcc")
        return True, "XKERNELS_CUDA=1"
    if forced == "0":
        return False, "XKERNELS_CUDA=0"
    if torch.version.cuda is None:
        return False, f"torch {torch.__version__} is a CPU build"
    if cuda_home is None:
        return False, (f"torch {torch.__version__} is a CUDA {torch.version.cuda} build but nvcc was not found "
                       "(put it on PATH or set CUDA_HOME to build the CUDA kernels)")
    return True, f"torch {torch.__version__} is a CUDA {torch.version.cuda} build and nvcc was found"


def cuda_arch_list(torch):
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return os.environ["TORCH_CUDA_ARCH_LIST"]
    if torch.cuda.is_available():
        caps = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
        return ";".join(f"{a}.{b}" + ("a" if a == 9 else "") for a, b in caps)
    log(f"no GPU visible and TORCH_CUDA_ARCH_LIST unset: compiling for {DEFAULT_ARCHS}")
    return DEFAULT_ARCHS


def nvidia_wheel_paths(torch):
    """Headers and libraries that the CUDA build of torch ships as nvidia-* wheels."""
    site = Path(torch.__file__).resolve().parent.parent / "nvidia"
    includes = sorted(str(p) for p in site.glob("*/include") if p.is_dir())
    nvrtc = sorted(site.glob("*/lib/libnvrtc.so*"))
    return includes, (str(nvrtc[0]) if nvrtc else None)


def compile_seconds(ninja_log, since_ns):
    """(seconds, source) of each translation unit that ninja compiled since since_ns, slowest first.
    Ninja's log (v5, the Ninja generator's) has a line per output built: start and end in ms, the
    output's mtime in ns; a later line for an output replaces an earlier one."""
    if not ninja_log.exists():
        return []
    built = {}
    for line in ninja_log.read_text().splitlines():
        fields = line.split("\t")
        if len(fields) != 5 or not fields[0].isdigit() or not fields[3].endswith(".o"):
            continue
        start, end, mtime, output = int(fields[0]), int(fields[1]), int(fields[2]), fields[3]
        built[output] = (end - start) / 1000 if mtime >= since_ns else None
    table = [(sec, re.sub(r"^CMakeFiles/[^/]+\.dir/|\.o$", "", out)) for out, sec in built.items() if sec is not None]
    return sorted(table, key=lambda row: -row[0])


def build_with_cmake(library_path):
    """Configures and builds libxkernels with CMake in build/cmake and copies it to library_path.
    Needs only torch, CMake and a compiler (no setuptools): bench/gpu_check.sh calls it directly."""
    import torch

    build_dir = Path(os.environ.get("XKERNELS_BUILD_DIR", ROOT / "build" / "cmake")).resolve()
    build_dir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ)
    args = [
        f"-DCMAKE_PREFIX_PATH={torch.utils.cmake_prefix_path}",
        "-DCMAKE_BUILD_TYPE=Release",
        f"-DXKERNELS_PTXAS_VERBOSE={'ON' if os.environ.get('XKERNELS_PTXAS_VERBOSE') == '1' else 'OFF'}",
        f"-DXKERNELS_LIBSTDCXX={os.environ.get('XKERNELS_LIBSTDCXX', 'auto')}",
    ]
    if shutil.which("ninja"):
        args.append("-GNinja")
    cuda_home = find_cuda_home()
    cuda, why = use_cuda(torch, cuda_home)
    if cuda:
        archs = cuda_arch_list(torch)
        env["TORCH_CUDA_ARCH_LIST"] = archs
        includes, nvrtc = nvidia_wheel_paths(torch)
        env["CPATH"] = os.pathsep.join(includes + [env.get("CPATH", "")]).rstrip(os.pathsep)
        args += [
            "-DXKERNELS_CUDA=ON",
            "-DXKERNELS_TORCH_CPU_LIBS=OFF",  # a build folder last configured without CUDA cached it ON
            f"-DCMAKE_CUDA_COMPILER={cuda_home / 'bin' / 'nvcc'}",
            f"-DCUDAToolkit_ROOT={cuda_home}",
            f"-DCUDA_TOOLKIT_ROOT_DIR={cuda_home}",
        ]
        if nvrtc:
            args.append(f"-DCUDA_nvrtc_LIBRARY={nvrtc}")
        log(f"CUDA kernels ON: {why} (toolkit {cuda_home}, archs {archs})")
    else:
        args.append("-DXKERNELS_CUDA=OFF")
        if torch.version.cuda is not None:
            # torch's CMake config wants a CUDA toolkit whenever torch is a CUDA build: link its CPU
            # libraries directly instead (cmake/TorchCpuLibs.cmake).
            args += ["-DXKERNELS_TORCH_CPU_LIBS=ON", f"-DXK_TORCH_ROOT={Path(torch.__file__).resolve().parent}",
                     f"-DXK_TORCH_CXX11_ABI={int(torch.compiled_with_cxx11_abi())}"]
        else:
            args.append("-DXKERNELS_TORCH_CPU_LIBS=OFF")
        log(f"CUDA kernels OFF: {why}")
    jobs = os.environ.get("MAX_JOBS", str(os.cpu_count() or 1))
    subprocess.check_call(["cmake", "-S", str(ROOT), "-B", str(build_dir), *args], env=env)
    started_ns = time.time_ns()
    subprocess.check_call(["cmake", "--build", str(build_dir), "-j", jobs], env=env)
    # The slowest translation unit decides a parallel build: the log shows each one's time.
    for seconds, source in compile_seconds(build_dir / ".ninja_log", started_ns):
        log(f"compile seconds {seconds:6.1f} {source}")
    library_path = Path(library_path)
    library_path.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy2(build_dir / "libxkernels.so", library_path)


if __name__ == "__main__":  # setuptools runs this file as __main__
    from setuptools import Extension, setup
    from setuptools.command.build_ext import build_ext

    class CMakeBuild(build_ext):
        def build_extension(self, ext):
            build_with_cmake(self.get_ext_fullpath(ext.name))

    setup(
        ext_modules=[Extension("xkernels.libxkernels", sources=[])],
        cmdclass={"build_ext": CMakeBuild},
    )
