"""A PEP 517 build backend with no dependencies, and the project's wheel command.

The extension is built by CMake with the rest of Vesper (src/python/); this only packs it with
the pure-Python files into a wheel, so that `pip install ./python` works offline (no setuptools
to download) and `python3 python/vesper_build.py --build-dir build-ci --out dist` writes the
wheel directly.

Which extension: $VESPER_BUILD_DIR/python/vesper/_vesper<EXT_SUFFIX> (a relative
VESPER_BUILD_DIR is taken from the repository root), else the most recently built one among
../build*/python/vesper/. Its suffix must match the interpreter that builds
(and so installs) the wheel.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import pathlib
import sys
import sysconfig
import zipfile

HERE = pathlib.Path(__file__).resolve().parent
NAME = "vesper"
VERSION = "0.1.0"


def _extension() -> pathlib.Path:
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    build_dir = os.environ.get("VESPER_BUILD_DIR")
    if build_dir:
        # pip runs the backend in python/, so a relative path is taken from the repository root.
        root = pathlib.Path(build_dir) if os.path.isabs(build_dir) else HERE.parent / build_dir
        candidates = [root.resolve() / "python" / NAME / f"_vesper{suffix}"]
    else:
        candidates = sorted(HERE.parent.glob(f"build*/python/{NAME}/_vesper{suffix}"),
                            key=lambda p: p.stat().st_mtime, reverse=True)
    for c in candidates:
        if c.is_file():
            return c
    raise RuntimeError(
        f"no built _vesper{suffix} found ({'VESPER_BUILD_DIR=' + build_dir if build_dir else '../build*'}): "
        "build it first (cmake --build <build> --target _vesper), with the same Python")


def _tag() -> str:
    impl = f"cp{sys.version_info.major}{sys.version_info.minor}"
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    return f"{impl}-{impl}-{platform}"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def _metadata() -> bytes:
    return (f"Metadata-Version: 2.1\nName: {NAME}\nVersion: {VERSION}\n"
            "Summary: vLLM's offline and asyncio APIs on Vesper's engine (GGUF models, CPU)\n"
            "Requires-Python: >=3.9\n").encode()


def _write_wheel(out_dir: str) -> str:
    tag = _tag()
    wheel_name = f"{NAME}-{VERSION}-{tag}.whl"
    dist_info = f"{NAME}-{VERSION}.dist-info"
    files = {}
    for py in sorted((HERE / NAME).glob("*.py")):
        files[f"{NAME}/{py.name}"] = py.read_bytes()
    ext = _extension()
    files[f"{NAME}/{ext.name}"] = ext.read_bytes()
    files[f"{dist_info}/METADATA"] = _metadata()
    files[f"{dist_info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: vesper_build\n"
                                   f"Root-Is-Purelib: false\nTag: {tag}\n").encode()
    record = [_record_line(n, d) for n, d in files.items()] + [f"{dist_info}/RECORD,,"]
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, wheel_name)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (0o755 if name.endswith(ext.name) else 0o644) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    return wheel_name


# PEP 517 hooks.
def get_requires_for_build_wheel(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory, config_settings=None):
    dist_info = pathlib.Path(metadata_directory) / f"{NAME}-{VERSION}.dist-info"
    dist_info.mkdir(parents=True, exist_ok=True)
    (dist_info / "METADATA").write_bytes(_metadata())
    return dist_info.name


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    return _write_wheel(wheel_directory)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Pack the built vesper package into a wheel")
    parser.add_argument("--build-dir", help="the CMake build directory (default: newest ../build*)")
    parser.add_argument("--out", default="dist", help="where to write the wheel")
    args = parser.parse_args()
    if args.build_dir:
        os.environ["VESPER_BUILD_DIR"] = os.path.abspath(args.build_dir)
    print(os.path.join(args.out, _write_wheel(args.out)))
