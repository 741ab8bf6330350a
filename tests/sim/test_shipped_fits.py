"""The bundled profiles' parametric fits ship with dsd (sim.models.shipped_fits): a first run,
with an empty cache or none, chooses and builds their latency model without fitting, and a
shipped fit is the fit a run would compute."""

from __future__ import annotations

import dataclasses

import pytest

from dsd.policies.profile_io import load_profile
from dsd.sim.models.latency import ParametricLatencyModel
from dsd.sim.models.latency_choice import fit_parametric, select_latency_model
from dsd.sim.models.shipped_fits import BUNDLED_PROFILES, SHIPPED_FITS

STALE = (
    "a bundled profile's fit is not shipped for this code and these numpy/scipy versions: "
    "write them again with `python -m dsd.sim.models.shipped_fits` and commit "
    f"{SHIPPED_FITS.name}/"
)


@pytest.mark.parametrize("path", BUNDLED_PROFILES, ids=lambda path: path.stem)
@pytest.mark.parametrize("kind", ["auto", "parametric"])
def test_a_bundled_profile_gets_its_latency_model_without_fitting(
    monkeypatch: pytest.MonkeyPatch, path, kind: str
) -> None:
    monkeypatch.setenv("DSD_CACHE_DIR", "off")

    def no_fit(profile: object) -> ParametricLatencyModel:
        raise AssertionError(STALE)

    monkeypatch.setattr(ParametricLatencyModel, "fit", staticmethod(no_fit))
    model, choice = select_latency_model(load_profile(str(path)), kind)  # type: ignore[arg-type]
    assert choice.kind in ("table", "parametric")
    assert model is not None


@pytest.mark.slow
@pytest.mark.parametrize("path", BUNDLED_PROFILES, ids=lambda path: path.stem)
def test_a_shipped_fit_is_the_fit(monkeypatch: pytest.MonkeyPatch, path) -> None:
    monkeypatch.setenv("DSD_CACHE_DIR", "off")
    profile = load_profile(str(path))
    shipped = fit_parametric(profile)
    fitted = ParametricLatencyModel.fit(profile)
    assert shipped.params == fitted.params
    assert dataclasses.asdict(shipped.fit_report) == dataclasses.asdict(fitted.fit_report)
