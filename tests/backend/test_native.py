"""The native CPU product (`backend.native`) and how `CpuKernels` routes rows to it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dsd.backend import native
from dsd.backend.model import NATIVE_MAX_ROWS, CpuKernels, ModelConfig, Transformer

needs_native = pytest.mark.skipif(
    native.rows_matmul() is None, reason=f"native product: {native.status()}"
)


@pytest.fixture
def fresh_native(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> Iterator[Callable[[], tuple[Any, str]]]:
    """`native._load` forgotten before and after the test, builds cached under tmp_path."""
    monkeypatch.setenv("DSD_CACHE_DIR", str(tmp_path))
    native._load.cache_clear()
    yield native._load
    native._load.cache_clear()


def tiny_config() -> ModelConfig:
    """Every weight fits the product (in % 8 == 0, out % 4 == 0)."""
    return ModelConfig(
        vocab_size=64, hidden_size=32, num_layers=1, num_heads=4, num_kv_heads=2,
        intermediate_size=64, rope_theta=10000.0, max_position_embeddings=64,
    )  # fmt: skip


def weight(out: int, features: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(out, features, generator=torch.Generator().manual_seed(seed))


@needs_native
@pytest.mark.parametrize(("out", "features"), [(4, 8), (96, 64), (1536, 576), (100, 200)])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 7, 16, 130])
def test_product_agrees_with_torch(out: int, features: int, rows: int) -> None:
    product = native.rows_matmul()
    assert product is not None
    w = weight(out, features)
    x = torch.randn(rows, features, generator=torch.Generator().manual_seed(rows))
    got = product(x, native.pack(w), out)
    assert got.shape == (rows, out)
    torch.testing.assert_close(got, x @ w.T, atol=1e-4, rtol=1e-4)


@needs_native
def test_product_takes_any_leading_shape_and_strides() -> None:
    product = native.rows_matmul()
    assert product is not None
    w = weight(32, 24)
    x = torch.randn(2, 3, 48)[..., ::2]  # [2, 3, 24], not contiguous
    got = product(x, native.pack(w), 32)
    assert got.shape == (2, 3, 32)
    torch.testing.assert_close(got, x @ w.T, atol=1e-5, rtol=1e-5)


@needs_native
@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 40), data=st.data())
def test_a_row_is_the_same_sum_whatever_rows_run_with_it(rows: int, data: st.DataObject) -> None:
    """Bit for bit: a verification of K + 1 tokens gives each token the logits it would get
    alone, so greedy SD cannot differ from plain decoding by rounding."""
    product = native.rows_matmul()
    assert product is not None
    w = weight(20, 40, seed=rows)
    packed = native.pack(w)
    x = torch.randn(rows, 40, generator=torch.Generator().manual_seed(rows + 1))
    row = data.draw(st.integers(0, rows - 1))
    assert torch.equal(product(x, packed, 20)[row], product(x[row : row + 1], packed, 20)[0])


def test_fits_only_float32_cpu_matrices_of_whole_groups() -> None:
    assert native.fits(weight(8, 16))
    assert not native.fits(weight(6, 16))  # out not a multiple of 4
    assert not native.fits(weight(8, 12))  # in not a multiple of 8
    assert not native.fits(weight(8, 16).double())
    assert not native.fits(torch.randn(2, 8, 16))


def test_pack_lays_groups_of_four_rows_eight_inputs_at_a_time() -> None:
    w = torch.arange(8 * 16, dtype=torch.float32).reshape(8, 16)
    packed = native.pack(w).flatten()
    # first chunk: rows 0-3, inputs 0-7; then rows 0-3, inputs 8-15; then rows 4-7
    assert packed[:8].tolist() == w[0, :8].tolist()
    assert packed[8:16].tolist() == w[1, :8].tolist()
    assert packed[32:40].tolist() == w[0, 8:].tolist()
    assert packed[64:72].tolist() == w[4, :8].tolist()


def test_switched_off_by_the_environment(
    monkeypatch: pytest.MonkeyPatch, fresh_native: Callable[[], tuple[Any, str]]
) -> None:
    monkeypatch.setenv(native.ENV_SWITCH, "off")
    assert native.rows_matmul() is None
    assert native.status() == "off (DSD_NATIVE_KERNELS)"


def test_a_failing_compiler_leaves_torch_kernels_with_a_reason(
    monkeypatch: pytest.MonkeyPatch, fresh_native: Callable[[], tuple[Any, str]]
) -> None:
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    monkeypatch.setattr(native.platform, "machine", lambda: "x86_64")
    monkeypatch.setenv("CC", "false")
    assert native.rows_matmul() is None
    assert native.status() == "not built: false failed"
    # and a model prepared there runs on oneDNN, padded as before
    model = Transformer(tiny_config())
    assert model.prepare_cpu_kernels()
    assert model.native_kernels is False


def test_a_cpu_without_avx2_is_refused_before_compiling(
    monkeypatch: pytest.MonkeyPatch, fresh_native: Callable[[], tuple[Any, str]]
) -> None:
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    with mock.patch.object(native.subprocess, "run") as run:
        assert native.rows_matmul() is None
    run.assert_not_called()
    assert "AVX2" in native.status()


@needs_native
def test_the_build_is_cached_by_source_and_compiler(
    fresh_native: Callable[[], tuple[Any, str]], tmp_path: Path
) -> None:
    assert native.rows_matmul() is not None
    built = list((tmp_path / "native").glob("rows_matmul-*.so"))
    assert len(built) == 1
    native._load.cache_clear()
    with mock.patch.object(native.subprocess, "run") as run:
        assert native.rows_matmul() is not None
    run.assert_not_called()  # the second process reuses the library


@needs_native
def test_with_the_cache_off_the_build_leaves_nothing_behind(
    monkeypatch: pytest.MonkeyPatch,
    fresh_native: Callable[[], tuple[Any, str]],
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("DSD_CACHE_DIR", "off")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    tempfile_dir = native.tempfile.tempdir
    native.tempfile.tempdir = None  # re-read TMPDIR
    try:
        assert native.rows_matmul() is not None
    finally:
        native.tempfile.tempdir = tempfile_dir
    assert list(tmp_path.iterdir()) == []


@needs_native
@pytest.mark.parametrize(
    ("threads", "rows", "on_native"),
    [(1, 1, True), (1, 5, True), (1, NATIVE_MAX_ROWS, True), (1, NATIVE_MAX_ROWS + 1, False),
     (2, 1, False), (2, 5, False)],
)  # fmt: skip
def test_cpu_kernels_route_few_rows_on_one_thread_to_the_product(
    threads: int, rows: int, on_native: bool, torch_threads: Callable[[int], None]
) -> None:
    torch_threads(threads)
    product = native.rows_matmul()
    assert product is not None
    calls: list[int] = []

    def counted(*args: Any) -> torch.Tensor:
        calls.append(1)
        return product(*args)

    kernels = CpuKernels(weight(96, 64), counted)
    x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        out = kernels(x)
    assert bool(calls) is on_native
    torch.testing.assert_close(out, x @ kernels.weight.T, atol=1e-4, rtol=1e-4)
    assert kernels.weight.is_contiguous()  # the native layout keeps torch's own


@needs_native
def test_cpu_kernels_without_a_fitting_weight_keep_onednn() -> None:
    kernels = CpuKernels(weight(97, 64), native.rows_matmul())
    assert kernels.native is None and kernels.packed is None
