"""What a measurement records of where it ran: device, dtype, library versions, threads, load,
the matrix-product path, and what the target's forward computes for few tokens. Profiles and
reports store it in their metadata so a figure can be traced to its machine."""

from __future__ import annotations

import datetime as dt
import platform
import sys
from collections.abc import Callable
from importlib import metadata as importlib_metadata
from typing import Any

import torch

from dsd.backend.fast_path import cublaslt_max_rows
from dsd.backend.model import Transformer
from dsd.backend.native import status as native_status
from dsd.backend.threads import thread_settings
from dsd.common.machine import cpu_model, load_average


def environment_metadata(device: torch.device, dtype: torch.dtype) -> dict[str, Any]:
    """Device name, dtype, versions, date, threads and load, for a profile's or report's
    metadata; on CUDA also the matrix library and TF32 setting (`matmul`): float32 step times
    depend on them (results/gpu/2026-11-28-h100); on CPU in float32 whether the native product
    runs (`matmul`, `backend.native.status`)."""
    matmul: dict[str, Any] = {}
    if device.type == "cuda":
        device_name = torch.cuda.get_device_name(device)
        matmul = {
            "matmul": {
                "blas": str(torch.backends.cuda.preferred_blas_library()).rsplit(".", 1)[-1],
                "tf32": torch.backends.cuda.matmul.allow_tf32,
                # the fast path's steps of at most this many rows on cuBLASLt (0: off)
                "cublaslt_max_rows": cublaslt_max_rows(),
            }
        }
    else:
        device_name = f"cpu ({cpu_model()})"
        if dtype == torch.float32:  # the few-row products' kernel (`backend.native`)
            matmul = {"matmul": {"native_product": native_status()}}
    versions = {"python": sys.version.split()[0], "torch": torch.__version__}
    for package in ("dsd", "numpy"):
        try:
            versions[package] = importlib_metadata.version(package)
        except importlib_metadata.PackageNotFoundError:
            versions[package] = "unknown"
    return {
        "device": device_name,
        "device_type": device.type,
        "dtype": str(dtype).removeprefix("torch."),
        "versions": versions,
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "platform": platform.platform(),
        "threads": thread_settings(),
        "load_average": load_average(),
        **matmul,
    }


# Token counts `forward_tokens` asks the target about (its CPU kernels pad up to 4)
FORWARD_TOKENS_SCAN = 16


def forward_tokens(target: Transformer) -> list[int]:
    """What the target's forward of 1, 2, ... tokens computes, up to the last count its kernels
    pad ([] where none is padded): the profile's `metadata["forward_tokens"]`, which the
    parametric latency model prices (`sim.models.latency.forward_tokens_of`). Read on the thread
    setting the profile is measured with (one row on one thread is not padded)."""
    widths = [target.tokens_worth_computing(n) for n in range(1, FORWARD_TOKENS_SCAN + 1)]
    padded = [n for n, width in enumerate(widths, start=1) if width != n]
    return widths[: max(padded)] if padded else []


def machine_differences(recorded: dict[str, Any], here: dict[str, Any]) -> list[str]:
    """What differs between where a profile was taken (its metadata, `environment_metadata`
    then) and here: device (the CPU model or GPU name), dtype, torch threads and the matrix
    product path, each as 'KEY: THEN (profile) vs NOW (here)'. A key either side lacks is not
    compared (a PR #32374 profile records none)."""

    def threads(metadata: dict[str, Any]) -> Any:
        settings = metadata.get("threads")
        return settings.get("torch_intra_op_threads") if isinstance(settings, dict) else None

    readers: dict[str, Callable[[dict[str, Any]], Any]] = {
        "device": lambda m: m.get("device"),
        "dtype": lambda m: m.get("dtype"),
        "threads": threads,
        "matmul": lambda m: m.get("matmul"),
    }
    differences = []
    for key, read in readers.items():
        then, now = read(recorded), read(here)
        if then is not None and now is not None and then != now:
            differences.append(f"{key}: {then} (profile) vs {now} (here)")
    return differences


_warned: set[tuple[str, str]] = set()


def warn_if_elsewhere(profile_path: str, recorded: dict[str, Any], here: dict[str, Any]) -> None:
    """One line on stderr, once per profile and difference in a process, when a profile taken
    on another machine prices a real run here (its step times, and what goodput and the
    simulator read from them, are that machine's)."""
    differences = machine_differences(recorded, here)
    key = (profile_path, "; ".join(differences))
    if differences and key not in _warned:
        _warned.add(key)
        print(
            f"warning: profile {profile_path} was taken elsewhere ({key[1]}): its step times "
            "are not this machine's; profile here, or re-time it (dsd validate re-times)",
            file=sys.stderr,
        )
