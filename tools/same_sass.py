#!/usr/bin/env python3
"""Whether a CUDA source compiles to the same machine code as at another revision.

Runs here (no GPU, no cuobjdump): compiles SOURCE (a .cu file of a configured CUDA build, e.g.
src/ops/cuda/moe.cu) to a cubin twice with the build's own nvcc command, once from the working
tree and once from REV's src/ (git archive into a temporary folder), then compares every
kernel's .text section byte for byte. A refactor of a kernel (pieces moved into functions,
names changed) that prints "same" for every kernel cannot have changed what the GPU runs, so it
needs no GPU run to be trusted; one that prints "differs" needs the GPU tests and an A/B.

Usage: tools/same_sass.py SOURCE [--base REV] [--build DIR]
  REV: the revision to compare with (default HEAD); DIR: the configured build (default build)
Exit status: 0 when every kernel is the same, 1 when any differs or is only on one side.
"""
import argparse
import pathlib
import re
import shlex
import struct
import subprocess
import sys
import tempfile


# An anonymous namespace's mangled name carries a hash of the source file's path, which differs
# between the tree and the base's copy: `44_GLOBAL__N__7cd22945_11_sampling_cu_a25cc2f9`.
ANONYMOUS_NAMESPACE = re.compile(r"\d+_GLOBAL__N__[0-9a-f]+_\d+_\w+?_[0-9a-f]{8}")


def kernel_texts(cubin: pathlib.Path) -> dict:
    """{mangled kernel name (anonymous namespaces as one name): its .text bytes} of an ELF cubin."""
    data = cubin.read_bytes()
    (section_offset,) = struct.unpack_from("<Q", data, 0x28)
    entry_size, count, names_index = struct.unpack_from("<HHH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, section_offset + i * entry_size) for i in range(count)]
    names_offset = sections[names_index][4]
    texts = {}
    for section in sections:
        start = names_offset + section[0]
        name = data[start:data.index(b"\0", start)].decode()
        if name.startswith(".text."):
            kernel = ANONYMOUS_NAMESPACE.sub("12_GLOBAL__N_1", name[len(".text."):])
            texts[kernel] = data[section[4]:section[4] + section[5]]
    return texts


def compile_command(build: pathlib.Path, source: pathlib.Path) -> list:
    """The build's nvcc command for SOURCE's object, as an argument list."""
    commands = subprocess.run(["ninja", "-C", str(build), "-t", "commands"], check=True, capture_output=True,
                              text=True).stdout.splitlines()
    wanted = [c for c in commands if f" -c {source.resolve()} " in c + " "]
    if not wanted:
        sys.exit(f"same_sass: no compile command for {source} in {build} (configure it with -DGLMS_CUDA=ON)")
    return shlex.split(wanted[-1])


def to_cubin(command: list, build: pathlib.Path, output: pathlib.Path, replace_from: str = "",
             replace_to: str = "") -> None:
    args = []
    skip_next = False
    for arg in command:
        if skip_next:
            skip_next = False
            continue
        if arg == "-o":
            args += ["-o", str(output)]
            skip_next = True
            continue
        if arg in ("-MD", "-MMD"):
            continue
        if arg in ("-MT", "-MF"):
            skip_next = True
            continue
        if arg == "-c":
            args.append("-cubin")
            continue
        if replace_from:
            arg = arg.replace(replace_from, replace_to)
        args.append(arg)
    result = subprocess.run(args, cwd=build, capture_output=True, text=True)
    if result.returncode != 0:
        sys.exit(f"same_sass: nvcc failed:\n{result.stderr[-4000:]}")


def demangle(names: list) -> dict:
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True).stdout.splitlines()
        return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}
    except FileNotFoundError:
        return {n: n for n in names}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source")
    parser.add_argument("--base", default="HEAD")
    parser.add_argument("--build", default="build")
    options = parser.parse_args()
    root = pathlib.Path(subprocess.run(["git", "rev-parse", "--show-toplevel"], check=True, capture_output=True,
                                       text=True).stdout.strip())
    source = pathlib.Path(options.source)
    command = compile_command(pathlib.Path(options.build), source)
    with tempfile.TemporaryDirectory() as temporary:
        folder = pathlib.Path(temporary)
        archive = subprocess.run(["git", "-C", str(root), "archive", options.base, "src"], check=True,
                                 capture_output=True).stdout
        (folder / "base").mkdir()
        subprocess.run(["tar", "-x", "-C", str(folder / "base")], input=archive, check=True)
        build = pathlib.Path(options.build).resolve()
        to_cubin(command, build, folder / "tree.cubin")
        to_cubin(command, build, folder / "base.cubin", str(root / "src"), str(folder / "base" / "src"))
        tree, base = kernel_texts(folder / "tree.cubin"), kernel_texts(folder / "base.cubin")
    names = sorted(set(tree) | set(base))
    readable = demangle(names)
    all_same = True
    for name in names:
        a, b = base.get(name), tree.get(name)
        if a is None or b is None:
            print(f"only in {'the tree' if a is None else options.base}: {readable[name]}")
            all_same = False
        elif a == b:
            print(f"same     {len(a) // 16:6d} instructions  {readable[name]}")
        else:
            differing = sum(1 for i in range(0, min(len(a), len(b)), 16) if a[i:i + 16] != b[i:i + 16])
            print(f"differs  {len(a) // 16:6d} -> {len(b) // 16} instructions, {differing} differ: {readable[name]}")
            all_same = False
    print(f"{source}: {'every kernel the same as' if all_same else 'not the same machine code as'} {options.base}")
    return 0 if all_same else 1


if __name__ == "__main__":
    sys.exit(main())
