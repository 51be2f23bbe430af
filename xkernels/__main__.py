"""Command line: `python -m xkernels info` prints how the package was built and its ops."""

import argparse
import sys

import torch

import xkernels


def info(_args):
    build = xkernels.build_info()
    ops = sorted(name.split("::")[1] for name in torch._C._dispatch_get_all_op_names()
                 if name.startswith("xkernels::") and name != "xkernels::build_info")
    print(f"xkernels     {build['version']}  ({xkernels._LIBRARY_PATH})")
    print(f"torch        {torch.__version__}  (CUDA {torch.version.cuda or 'none'})")
    print(f"CUDA kernels {'compiled for ' + build['cuda_archs'] if build['cuda'] else 'not compiled'}")
    print(f"GPU          {torch.cuda.get_device_name() if torch.cuda.is_available() else 'none visible'}")
    print(f"ops          {', '.join(ops)}")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m xkernels", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="versions, CUDA architectures and the ops available").set_defaults(run=info)
    args = parser.parse_args(argv)
    args.run(args)


if __name__ == "__main__":
    sys.exit(main())
