"""Which latency model a run gets (`--latency-model`), and how well each holds between the
profiled batch sizes.

- `leave_one_knot_out` / `knot_error_pct`: every interior B of a profile dropped, the model
  fitted on the rest, its error at the dropped points (docs/models.md 1.2); "auto" and the
  summary hold out at most MAX_HELD_OUT_KNOTS of them, spread evenly. A progress line on
  stderr past a second of fitting; a fit of more than MAX_FITTED_BATCH_SIZES profiled B is
  refused (auto takes the table there).
- `select_latency_model` (and `fit_latency_model`, its model alone): "table", "parametric", or
  "auto": of the models that can run the profile (the table only where it covers K = 0..k_max),
  the one whose worst error at a profiled point, held out or fitted, is lowest, the fit only
  when clearly (`FIT_MARGIN`); the table where the run prices mixed K token-equivalent (a
  pricing of the table). Its `LatencyChoice` says which and why (a run's config.json).
- A parametric fit is a pure function of the profile's latency points and of `sim.models.latency`'s
  code, so it is kept on disk (`dsd.common.disk_memo`): "auto" fits once on all points, then
  once per held-out interior B, and stops as soon as an error shows the fit cannot win (its
  fitted error first: then no held-out fit at all); every later run of the same profile skips
  them all.

Not here: the models themselves (`sim.models.latency`).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

from dsd.common.disk_memo import disk_memo, source_fingerprint
from dsd.common.progress import Advance, delayed_stderr_progress
from dsd.policies.profile import Profile
from dsd.sim.models import latency as latency_module
from dsd.sim.models.latency import (
    FitReport,
    LatencyModelKind,
    MixedKCosting,
    ParametricLatencyModel,
    TableLatencyModel,
    forward_tokens_of,
    table_covers,
)
from dsd.sim.models.shipped_fits import SHIPPED_FITS

LatencyModel = TableLatencyModel | ParametricLatencyModel
KINDS: tuple[LatencyModelKind, ...] = ("table", "parametric")
# "auto" takes the fit only where its worst error is under this share of the table's: the table
# is the measurement at its points, and runs spend most steps at or near profiled B (on the CPU
# reports a fit 12% worst vs the table's 13-15% still priced the validation cells worse:
# docs/models.md 1.2).
FIT_MARGIN = 0.5
# "auto" takes the table without fitting where the table's own worst |error| at a profiled B,
# held out or fitted, is under this: a profile dense enough to interpolate within measurement
# noise (a few percent: docs/validation.md) gains nothing from a fit, which
# costs seconds per held-out B. Every profile shipped here is far above it (12-229%).
TABLE_HOLDS_PCT = 2.0
# "auto" holds out at most this many interior B, spread evenly (ends included): with more, each
# held-out fit still costs a whole fit (seconds at 64 B) and a dense profile's worst knot error
# is seen on a sample as well. Every profile shipped here has fewer (their results unchanged).
MAX_HELD_OUT_KNOTS = 8
# A parametric fit takes at most this many profiled B (its cost grows with the points: a minute
# of scipy per fit near the cap); the table takes any number.
MAX_FITTED_BATCH_SIZES = 256


@dataclass(frozen=True)
class LatencyChoice:
    """The latency model a run uses, what was asked for, and why."""

    kind: str  # "table" or "parametric"
    requested: str  # "table", "parametric" or "auto"
    reason: str  # one line
    # auto between two candidates: kind -> {"held_out_max_abs_pct", "fitted_max_abs_pct"}
    scores: dict[str, dict[str, float]] = dataclasses.field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        """JSON-ready record for config.json."""
        return {"reason": self.reason, "scores": self.scores}


@dataclass(frozen=True)
class HeldOutKnot:
    """A latency model's error at one batch size it was fitted without (leave one knot out)."""

    kind: str  # "table" or "parametric"
    batch_size: int  # the interior B whose points were dropped before fitting
    error_pct: dict[int, float]  # K -> (predicted / measured - 1) x 100 at that B

    @property
    def worst(self) -> tuple[int, float]:
        """(K, error %) of the largest |error| at this B."""
        k = max(self.error_pct, key=lambda key: abs(self.error_pct[key]))
        return k, self.error_pct[k]


# --------------------------------------------------------------------------------------------
# The factory
# --------------------------------------------------------------------------------------------


def fit_latency_model(
    profile: Profile,
    kind: LatencyModelKind = "auto",
    k_max: int | None = None,
    mixed_k: MixedKCosting = "padded",
) -> LatencyModel:
    """The latency model `select_latency_model` picks."""
    return select_latency_model(profile, kind, k_max, mixed_k)[0]


def select_latency_model(
    profile: Profile,
    kind: LatencyModelKind = "auto",
    k_max: int | None = None,
    mixed_k: MixedKCosting = "padded",
) -> tuple[LatencyModel, LatencyChoice]:
    """A latency model for `profile` and the record of the choice.

    "table": the profile's table (needs K=0 and every K to be run inside the profiled range).
    "parametric": the fitted model. "auto": the parametric model when the table does not cover
    K=0..k_max (k_max defaults to the profile's) at every profiled B; the table with fewer
    than 3 profiled B (nothing to hold out, and the table is exact at its points); else the
    table where its own worst |error| over the profiled B, each held out (leave one knot out)
    or fitted, is under TABLE_HOLDS_PCT (no fit needed); else the parametric model where its
    worst |error| is under FIT_MARGIN times the table's, else the table; the table with more
    than MAX_FITTED_BATCH_SIZES profiled B (where a fit is needed there, ValueError).
    `mixed_k="token-equivalent"` is a pricing of the table (the parametric model has its own):
    "auto" then takes the table. ValueError for an unknown kind, a model that cannot be built,
    or token-equivalent pricing without the table.
    """
    if kind == "table":
        return TableLatencyModel(profile, mixed_k=mixed_k), LatencyChoice(
            "table", kind, "asked for"
        )
    if kind not in ("parametric", "auto"):
        raise ValueError(f"unknown latency model kind {kind!r}: table, parametric or auto")
    wanted = profile.k_max if k_max is None else k_max
    covered = table_covers(profile, [wanted])
    if mixed_k == "token-equivalent" and (kind == "parametric" or not covered):
        why = "asked for" if kind == "parametric" else f"its table does not cover K=0..{wanted}"
        raise ValueError(
            f"mixed_k=token-equivalent prices mixed K on the profile's table, and the parametric "
            f"model ({why}) has its own pricing: use mixed_k=padded or a table that covers K"
        )
    if kind == "parametric" or not covered:
        _check_fit_size(profile, kind)
    if kind == "parametric":
        return _fit_with_progress(profile), LatencyChoice("parametric", kind, "asked for")
    if not covered:
        reason = f"the table does not cover K=0..{wanted} at every profiled B"
        return _fit_with_progress(profile), LatencyChoice("parametric", kind, reason)
    table = TableLatencyModel(profile, mixed_k=mixed_k)
    if mixed_k == "token-equivalent":
        reason = "mixed_k=token-equivalent is a pricing of the table"
        return table, LatencyChoice("table", kind, reason)
    if len(profile.batch_sizes()) < 3:
        reason = "fewer than 3 profiled B: none to hold out, and the table is exact at its points"
        return table, LatencyChoice("table", kind, reason)
    if len(profile.batch_sizes()) > MAX_FITTED_BATCH_SIZES:
        reason = (
            f"more than {MAX_FITTED_BATCH_SIZES} profiled B: a table that dense needs no fit "
            "(the fit's cost grows with the points)"
        )
        return table, LatencyChoice("table", kind, reason)
    scores: dict[str, dict[str, float]] = {"table": model_scores(profile, "table")}  # instant
    table_worst = max(scores["table"].values())
    if table_worst < TABLE_HOLDS_PCT:
        reason = (
            f"the table holds between its profiled B (worst |error| {table_worst:.1f}%, held out "
            f"or fitted, under {TABLE_HOLDS_PCT:g}%): no fit needed"
        )
        return table, LatencyChoice("table", kind, reason, scores)
    # The fit wins only below this: its scoring stops at the first error that reaches it
    bound = FIT_MARGIN * table_worst
    held_out = held_out_batch_sizes(profile)
    title = f"latency model auto: fits with each of {len(held_out)} profiled B held out"
    try:
        # one unit per parametric fit; silent unless past a second
        with delayed_stderr_progress(len(held_out) + 1, title) as advance:
            fitted = fit_parametric(profile)
            advance("all B")
            scores["parametric"] = model_scores(
                profile, "parametric", advance, stop_at=bound, full=fitted
            )
    except ValueError as exc:  # too few points left to fit the parametric model on
        return table, LatencyChoice("table", kind, f"the parametric model cannot be scored: {exc}")
    worst = {name: max(score.values()) for name, score in scores.items()}
    chosen = "parametric" if worst["parametric"] < bound else "table"
    # (where the table wins, the fit's figure is the worst error before its scoring stopped)
    reason = (
        f"worst |error| at a profiled B, held out or fitted: table {worst['table']:.1f}%, "
        f"parametric {worst['parametric']:.1f}% (the fit replaces the table below "
        f"{FIT_MARGIN:g}x its error)"
    )
    model = table if chosen == "table" else fitted
    return model, LatencyChoice(chosen, kind, reason, scores)


def _check_fit_size(profile: Profile, kind: LatencyModelKind) -> None:
    """ValueError when the parametric fit `kind` may need would take more profiled B than
    MAX_FITTED_BATCH_SIZES (minutes of scipy per fit, silently)."""
    count = len(profile.batch_sizes())
    if count > MAX_FITTED_BATCH_SIZES:
        raise ValueError(
            f"{count} profiled batch sizes: the parametric fit ({kind}) takes at most "
            f"{MAX_FITTED_BATCH_SIZES}; use --latency-model table, or profile fewer B"
        )


def _fit_with_progress(profile: Profile) -> ParametricLatencyModel:
    """`fit_parametric`, with a progress line past a second."""
    with delayed_stderr_progress(1, "latency model: parametric fit") as advance:
        model = fit_parametric(profile)
        advance("all B")
    return model


# --------------------------------------------------------------------------------------------
# The parametric fit, kept on disk
# --------------------------------------------------------------------------------------------


@functools.cache
def _fit_code() -> dict[str, str]:
    """What a stored fit depends on besides the points: the fit's code and solver."""
    # The packages' own version strings (importlib.metadata costs ~25 ms to import)
    import numpy
    import scipy

    return {
        "latency.py": source_fingerprint(latency_module),
        "scipy": scipy.__version__,
        "numpy": numpy.__version__,
    }


def fit_parametric(profile: Profile) -> ParametricLatencyModel:
    """`ParametricLatencyModel.fit(profile)`, or the same fit stored by an earlier process."""
    key = {
        "points": [list(dataclasses.astuple(point)) for point in profile.latency],
        "device_type": profile.metadata.get("device_type"),  # the fit frees a CPU-only term
        "forward_tokens": list(forward_tokens_of(profile)),  # and prices its padding
        "code": _fit_code(),
    }

    def encode(model: ParametricLatencyModel) -> dict[str, Any]:
        return {"params": list(model.params), "report": dataclasses.asdict(model.fit_report)}

    def decode(stored: dict[str, Any]) -> ParametricLatencyModel:
        report: dict[str, Any] = {
            name: tuple(value) if isinstance(value, list) else value
            for name, value in stored["report"].items()
        }
        params = tuple(float(v) for v in stored["params"])
        return ParametricLatencyModel.from_fit(profile, params, FitReport(**report))

    return disk_memo(
        "parametric-fit",
        key,
        lambda: ParametricLatencyModel.fit(profile),
        encode,
        decode,
        shipped=SHIPPED_FITS,
    )


# --------------------------------------------------------------------------------------------
# Leave one knot out
# --------------------------------------------------------------------------------------------


def held_out_batch_sizes(profile: Profile, limit: int | None = MAX_HELD_OUT_KNOTS) -> list[int]:
    """The interior profiled B (neither the smallest nor the largest) that leave-one-knot-out
    drops in turn: all of them, or `limit` spread evenly over them by rank (ends included)."""
    interior = profile.batch_sizes()[1:-1]
    if limit is None or len(interior) <= limit:
        return interior
    last = len(interior) - 1
    ranks = sorted({round(i * last / max(limit - 1, 1)) for i in range(limit)})
    return [interior[rank] for rank in ranks]


def leave_one_knot_out(
    profile: Profile,
    kind: LatencyModelKind,
    advance: Advance | None = None,
    *,
    limit: int | None = None,
    stop_at: float | None = None,
) -> list[HeldOutKnot]:
    """For every interior profiled B (`held_out_batch_sizes`: all, or `limit` of them spread
    evenly), the `kind` model fitted on the other B's points, and its error on the dropped
    ones (the measured side is the mean median over contexts at each K). Empty with fewer than
    3 batch sizes. `advance` is called after each fit. `stop_at`: no more knots once one has an
    |error| of at least this many percent.

    How well the model holds between the points a profile measured (docs/models.md 1.2).
    """
    knots: list[HeldOutKnot] = []
    # Each held-out fit starts from the fixed initial guess, never from the fit on every point:
    # the points leave flat directions, and a start that saw the dropped knot would carry it
    # into them (a warm start read the PR profile's B = 64 at 4.1-4.5%, against 4.6% cold).
    for batch_size in held_out_batch_sizes(profile, limit):
        rest = dataclasses.replace(
            profile, latency=tuple(p for p in profile.latency if p.batch_size != batch_size)
        )
        model = _model_of_kind(rest, kind)
        knots.append(HeldOutKnot(str(kind), batch_size, knot_error_pct(model, profile, batch_size)))
        if advance is not None:
            advance(f"B={batch_size}")
        if stop_at is not None and abs(knots[-1].worst[1]) >= stop_at:
            break
    return knots


def _model_of_kind(profile: Profile, kind: LatencyModelKind) -> LatencyModel:
    """The table or the parametric fit of `profile`, no choice and no progress line of its own
    (its caller's counts the fits)."""
    if kind == "table":
        return TableLatencyModel(profile)
    if kind == "parametric":
        return fit_parametric(profile)
    raise ValueError(f"leave one knot out scores table or parametric, not {kind!r}")


def knot_error_pct(model: LatencyModel, profile: Profile, batch_size: int) -> dict[int, float]:
    """K -> (model ITL / measured - 1) x 100 at a profiled `batch_size` (measured: the mean
    median over the profile's contexts at that (B, K))."""
    measured: dict[int, list[float]] = {}
    for point in profile.latency:
        if point.batch_size == batch_size:
            measured.setdefault(point.num_spec_tokens, []).append(point.expected_ms)
    return {
        k: 100.0 * (model.decode_itl_ms(batch_size, k) / (sum(ms) / len(ms)) - 1.0)
        for k, ms in sorted(measured.items())
    }


def model_scores(
    profile: Profile,
    kind: LatencyModelKind,
    advance: Advance | None = None,
    *,
    stop_at: float | None = None,
    full: LatencyModel | None = None,
) -> dict[str, float]:
    """The `kind` model's worst |error| % at a held-out interior B (against the mean over
    contexts) and at any profiled point when fitted on all points (the parametric model's fit
    error, each context its own point; the table's is 0 but for contexts it averages).
    `advance` is called after each held-out fit. `stop_at`: fit no more held-out knots once an
    error reaches it (the fitted one first: then none), so the held-out figure is the worst of
    those fitted, a lower bound. `full`: the `kind` model fitted on every point, where the
    caller has it."""
    full = full if full is not None else _model_of_kind(profile, kind)
    if isinstance(full, ParametricLatencyModel):
        fitted = full.fit_report.max_abs_pct  # per point: each context its own
    else:  # exact at its points, but for contexts averaged where it has no context axis
        fitted = max(
            abs(v) for b in profile.batch_sizes() for v in knot_error_pct(full, profile, b).values()
        )
    if stop_at is not None and fitted >= stop_at:
        return {"held_out_max_abs_pct": 0.0, "fitted_max_abs_pct": fitted}
    knots = leave_one_knot_out(profile, kind, advance, limit=MAX_HELD_OUT_KNOTS, stop_at=stop_at)
    held_out = max((abs(v) for knot in knots for v in knot.error_pct.values()), default=0.0)
    return {"held_out_max_abs_pct": held_out, "fitted_max_abs_pct": fitted}


def held_out_summary(profile: Profile) -> str:
    """One line: each model's worst leave-one-knot-out error and where, and the model "auto"
    picks ("" below 3 B)."""
    parts = []
    for kind in KINDS:
        knots = leave_one_knot_out(profile, kind, limit=MAX_HELD_OUT_KNOTS)
        if not knots:
            return ""
        worst = max(knots, key=lambda knot: abs(knot.worst[1]))
        k, error = worst.worst
        parts.append(f"{kind} worst {error:+.1f}% (B={worst.batch_size}, K={k})")
    _model, choice = select_latency_model(profile)
    return (
        "latency between profiled B (each interior B left out, predicted): "
        + ", ".join(parts)
        + f"; auto uses {choice.kind} ({choice.reason})"
    )
