"""pip install of tutti_torch against an already built or installed libtutti.

    TUTTI_PREFIX=/opt/tutti /usr/bin/python3 -m pip install --no-build-isolation --no-index src/pytorch
    # or, without TUTTI_PREFIX: PKG_CONFIG_PATH=/opt/tutti/lib/pkgconfig (tutti.pc)

TUTTI_PREFIX is an install prefix (include/nccl.h, include/tutti/tutti.h,
lib/libtutti.so) or a CMake build tree of tutti (libtutti.so at its top, the
headers taken from this source tree). Without it, pkg-config's tutti.pc is
used. The extension is compiled against the torch that the installing python
imports, so the build must not be isolated (--no-build-isolation: pip would
otherwise look for setuptools and torch on an index). The library's directory
is written into the extension's RUNPATH; LD_LIBRARY_PATH is not needed.
See docs/pytorch.md.
"""
import hashlib
import os
import shlex
import subprocess
import sys

from setuptools import setup

HERE = os.path.dirname(os.path.abspath(__file__))
SRC_ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
os.chdir(HERE)  # setuptools wants paths relative to setup.py

try:
    import torch  # noqa: F401
    from torch.utils.cpp_extension import BuildExtension, CppExtension
except ImportError as e:
    sys.exit("tutti_torch: torch is not importable by %s (%s). Install it (Debian: apt install "
             "python3-torch libtorch-dev) and build with --no-build-isolation." % (sys.executable, e))


def tutti_paths():
    """(include dirs, library dir, version) of libtutti."""
    prefix = os.environ.get("TUTTI_PREFIX")
    if prefix:
        prefix = os.path.abspath(os.path.expanduser(prefix))
        for libdir in (os.path.join(prefix, "lib"), os.path.join(prefix, "lib64"), prefix):
            if os.path.exists(os.path.join(libdir, "libtutti.so")):
                break
        else:
            sys.exit("tutti_torch: no libtutti.so in %s/lib, %s/lib64 or %s (TUTTI_PREFIX)" % ((prefix,) * 3))
        inc = os.path.join(prefix, "include")
        if not os.path.exists(os.path.join(inc, "tutti", "tutti.h")):
            inc = os.path.join(SRC_ROOT, "include")  # a build tree: this source tree's headers
        if not os.path.exists(os.path.join(inc, "tutti", "tutti.h")):
            sys.exit("tutti_torch: tutti/tutti.h found neither in %s/include nor in %s/include"
                     % (prefix, SRC_ROOT))
        return [inc], os.path.realpath(libdir), os.environ.get("TUTTI_VERSION", "0.1.0")
    try:
        cflags = subprocess.run(["pkg-config", "--cflags-only-I", "tutti"], check=True,
                                capture_output=True, text=True).stdout
        libs = subprocess.run(["pkg-config", "--libs-only-L", "tutti"], check=True,
                              capture_output=True, text=True).stdout
        version = subprocess.run(["pkg-config", "--modversion", "tutti"], check=True,
                                 capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit("tutti_torch: set TUTTI_PREFIX to tutti's install prefix (or build directory), "
                 "or make pkg-config find tutti.pc (PKG_CONFIG_PATH=<prefix>/lib/pkgconfig): %s"
                 % getattr(e, "stderr", e))
    incs = [os.path.realpath(f[2:]) for f in shlex.split(cflags) if f.startswith("-I")]
    libdirs = [os.path.realpath(f[2:]) for f in shlex.split(libs) if f.startswith("-L")]
    if not libdirs:
        sys.exit("tutti_torch: tutti.pc names no library directory")
    return incs, libdirs[0], version


incs, libdir, version = tutti_paths()
print("tutti_torch: building against libtutti in %s (headers: %s), torch %s"
      % (libdir, ", ".join(incs), torch.__version__))
# setuptools keeps its objects in build/ and skips a link that looks up to
# date, so a second install against another prefix would keep the first one's
# RPATH (libtutti.so.0 then not found). One build directory per library
# directory.
build_base = os.path.join("build", hashlib.sha1(libdir.encode()).hexdigest()[:12])

setup(
    name="tutti_torch",
    version=version,
    description="tutti (vendor-neutral, NCCL-compatible collectives) as a torch.distributed backend",
    packages=["tutti_torch"],
    package_dir={"tutti_torch": "tutti_torch"},
    ext_modules=[CppExtension(
        "tutti_torch._C",
        ["process_group_tutti.cc"],
        include_dirs=incs,
        library_dirs=[libdir],
        runtime_library_dirs=[libdir],
        libraries=["tutti"],
        extra_compile_args=["-std=c++17", "-O2", "-fvisibility=hidden", "-Wno-unused-parameter"],
    )],
    cmdclass={"build_ext": BuildExtension.with_options(use_ninja=False)},
    python_requires=">=3.8",
    zip_safe=False,
    options={"build": {"build_base": build_base}},
)
