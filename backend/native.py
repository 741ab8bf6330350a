"""The CPU matrix product for few rows (`native_matmul.c`), built with the system's C compiler.

`rows_matmul()` returns the product `x @ weight.T` over a packed weight (`pack`), or None where
it cannot run here; `status()` says which, in one line, for reports. It runs on one thread, on
x86-64 CPUs with AVX2 and FMA, float32 only. Why it exists: on a 2-core AMD EPYC host torch's
oneDNN and MKL products of 2-16 rows cost 1.5-2x one row, where the weights' memory traffic,
the same for all, should dominate (docs/backend.md has the measurement).

The shared library is compiled once per source and compiler (about a second) into
`<cache dir>/native/` (`common.disk_memo.cache_dir`; with the cache off, a temporary folder
removed once the library is loaded) and loaded with ctypes. Set `DSD_NATIVE_KERNELS=off` to
run without it.

Not here: several threads, other dtypes or instruction sets, or where the product is used
(`backend.model.CpuKernels`).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from dsd.common.disk_memo import cache_dir

SOURCE = Path(__file__).with_name("native_matmul.c")
FLAGS = ("-O3", "-mavx2", "-mfma", "-std=c99", "-shared", "-fPIC")
ENV_SWITCH = "DSD_NATIVE_KERNELS"
ROW_GROUP = 4  # output rows packed together (native_matmul.c)
LANES = 8  # inputs per packed chunk: one AVX2 register of float32

RowsMatmul = Callable[[torch.Tensor, torch.Tensor, int], torch.Tensor]


def pack(weight: torch.Tensor) -> torch.Tensor:
    """The kernel's layout of a [out, in] weight: [out/4, in/8, 4, 8], contiguous (a copy)."""
    out, features = weight.shape
    grouped = weight.detach().reshape(out // ROW_GROUP, ROW_GROUP, features // LANES, LANES)
    return grouped.permute(0, 2, 1, 3).contiguous()


def fits(weight: torch.Tensor) -> bool:
    """Whether the kernel takes this weight: float32 on CPU, 2-D, in % 8 == 0, out % 4 == 0."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.float32
        and weight.dim() == 2
        and weight.shape[0] % ROW_GROUP == 0
        and weight.shape[1] % LANES == 0
    )


def rows_matmul() -> RowsMatmul | None:
    """`f(x, packed, out_features) -> x @ weight.T` ([..., in] -> [..., out]), or None where the
    kernel cannot run here (`status()` says why)."""
    return _load()[0]


def status() -> str:
    """One line: the kernel in use, or why not."""
    return _load()[1]


@functools.cache
def _load() -> tuple[RowsMatmul | None, str]:
    if os.environ.get(ENV_SWITCH, "").strip().lower() in ("0", "off", "false", "no"):
        return None, f"off ({ENV_SWITCH})"
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return None, f"not built: {platform.machine()} is not x86-64"
    capability = torch.backends.cpu.get_cpu_capability()
    if capability not in ("AVX2", "AVX512"):
        return None, f"not built: the CPU lacks AVX2 (torch reports {capability})"
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None, "not built: no C compiler (cc, gcc or $CC)"
    try:
        library = _compiled_library(compiler)
    except subprocess.CalledProcessError as exc:
        detail = (exc.stderr or "").strip().splitlines()
        return None, f"not built: {compiler} failed" + (f": {detail[0]}" if detail else "")
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"not built: {exc}"
    function = library.dsd_rows_matmul
    function.restype = None
    function.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_int] * 3

    def product(x: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
        if x.dtype != torch.float32 or x.device.type != "cpu":
            raise ValueError(f"native product: float32 CPU input required, got {x.dtype}")
        features = x.shape[-1]
        flat = x.reshape(-1, features).contiguous()
        result = torch.empty(flat.shape[0], out_features, dtype=torch.float32)
        function(
            flat.data_ptr(), packed.data_ptr(), result.data_ptr(), flat.shape[0], features,
            out_features,
        )  # fmt: skip
        return result.view(*x.shape[:-1], out_features)

    return product, "native (AVX2, one thread)"


def _compiled_library(compiler: str) -> ctypes.CDLL:
    """The library for this source, flags and compiler: from the cache, else built into it;
    with the cache off or unusable, built into a temporary folder removed once loaded."""
    key = hashlib.sha256(SOURCE.read_bytes() + repr((FLAGS, compiler)).encode()).hexdigest()
    name = f"rows_matmul-{key[:16]}.so"
    shared = cache_dir()
    if shared is not None:
        with contextlib.suppress(OSError):  # unwritable, or a broken entry: build privately
            return ctypes.CDLL(str(_build(compiler, shared / "native", name)))
    with tempfile.TemporaryDirectory(prefix="dsd-native-") as folder:
        return ctypes.CDLL(str(_build(compiler, Path(folder), name)))


def _build(compiler: str, folder: Path, name: str) -> Path:
    """folder/name, compiled unless it exists; written whole (concurrent builders each write
    their own file and rename it, the last one wins)."""
    library = folder / name
    if library.exists():
        return library
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f".{name}.{os.getpid()}"
    try:
        subprocess.run(  # noqa: S603 (the user's own compiler, on our source)
            [compiler, *FLAGS, str(SOURCE), "-o", str(partial)],
            check=True, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        os.replace(partial, library)
    finally:
        partial.unlink(missing_ok=True)
    return library
