"""Step latency models fitted to a measured `Profile`: the simulator's cost model.

`TableLatencyModel` reads the profile's ITL(B, K) table with the goodput policy's own
interpolation; `ParametricLatencyModel` fits a small physical model that extrapolates past the
profiled B and K and reports its fit error. Both price prompt tokens with a `PrefillCost` and
compose decode, mixed and prefill-only steps, mixed K in one step, context and padding
(`PaddedPrefill`, `PaddedAttention`) as docs/models.md §1 sets out. Which model a run gets:
`sim.models.latency_choice`.

It does not sample anything (models are pure; latency noise is the executor's) or model TP/PP
communication.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeVar

import numpy as np

from dsd.common.arrays import BoolArray, FloatArray, IntArray
from dsd.policies.context_aware import ContextLatencyFn
from dsd.policies.goodput import ItlTable
from dsd.policies.profile import Profile
from dsd.sim.types import ScheduledBatch

PrefillSource = Literal["profile", "estimated-from-decode-slope", "estimated-from-physical-model"]
MixedKCosting = Literal["padded", "token-equivalent"]
# How a step's prefill chunks run beside its decode rows: in the same forward (vLLM) or as a
# forward of their own, padded to the longest chunk (dsd's torch engine)
PrefillForward = Literal["fused", "separate"]
PREFILL_FORWARDS: tuple[str, ...] = ("fused", "separate")
# What a decode row's attention reads: its own context (vLLM's paged attention) or the step's
# longest row's span (dsd's torch engine gathers every row's KV to one padded length)
AttentionSpan = Literal["ragged", "padded"]
# How a step's prefill rows are laid out: each its own length (vLLM) or padded to the longest
# chunk (dsd's torch engine)
PrefillRows = Literal["ragged", "padded"]
LatencyModelKind = Literal["table", "parametric", "auto"]
# One step's figure (a float) or an array of steps' [n]: the parametric form serves both
Number = TypeVar("Number", float, FloatArray)
Params = Sequence[float] | FloatArray  # the parametric model's values, in PARAM_NAMES order


# --------------------------------------------------------------------------------------------
# Prefill
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PrefillCost:
    """Cost of prompt tokens, piecewise linear in tokens.

    `curve_ms(N)` is the latency of a step that computes N prompt tokens and nothing else;
    `marginal_ms(N) = curve_ms(N) - curve_ms(1)` is what N prompt tokens add to a step that
    already pays for one forward (a decode step).
    """

    num_tokens: tuple[float, ...]  # knots in tokens, ascending, first is 1
    latency_ms: tuple[float, ...]  # latency at each knot, ms, non-decreasing
    source: PrefillSource  # where the knots came from (the CLI prints it)
    tail_ms_per_token: float  # slope used past the last knot, ms/token, >= 0
    # What prompt tokens add to a decode step whose forward they run in, measured on a fused
    # engine (the profile's prefill_in_decode, averaged over its decode batch sizes): knots
    # in tokens, ascending, and their added ms, non-decreasing. Empty: `marginal_ms` stands in.
    in_decode_tokens: tuple[float, ...] = ()
    in_decode_added_ms: tuple[float, ...] = ()
    # The knots as arrays, and the curve at 1 token, made once: a step with prompt tokens
    # reads them (np.interp would convert the tuples at every call).
    _curve: tuple[FloatArray, FloatArray] = field(init=False, repr=False, compare=False)
    _in_decode: tuple[FloatArray, FloatArray] = field(init=False, repr=False, compare=False)
    _one_token_ms: float = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.num_tokens) != len(self.latency_ms) or len(self.num_tokens) < 1:
            raise ValueError("PrefillCost needs as many latencies as knots, at least one")
        for knots in (self.num_tokens, self.in_decode_tokens):
            if any(b <= a for a, b in itertools.pairwise(knots)):
                raise ValueError("PrefillCost knots must be strictly increasing")
        if len(self.in_decode_tokens) != len(self.in_decode_added_ms):
            raise ValueError("PrefillCost needs as many in-decode costs as in-decode knots")
        if not (math.isfinite(self.tail_ms_per_token) and self.tail_ms_per_token >= 0):
            raise ValueError(f"tail slope must be finite and >= 0, got {self.tail_ms_per_token}")
        curve = (np.asarray(self.num_tokens, dtype=np.float64), np.asarray(self.latency_ms))
        object.__setattr__(self, "_curve", curve)
        in_decode = (
            np.asarray((0.0, *self.in_decode_tokens), dtype=np.float64),
            np.asarray((0.0, *self.in_decode_added_ms), dtype=np.float64),
        )
        object.__setattr__(self, "_in_decode", in_decode)
        object.__setattr__(self, "_one_token_ms", self.curve_ms(1.0))

    @staticmethod
    def from_profile(profile: Profile) -> PrefillCost:
        """From the profile's prefill points, else from the decode table's per-token slope."""
        bs, ks, grid = profile.itl_grid()
        if 0 not in set(ks.tolist()):
            raise ValueError("the profile has no K=0 latency points; cannot anchor prefill cost")
        itl_k0 = grid[:, int(np.searchsorted(ks, 0))]  # [nB]
        known = ~np.isnan(itl_k0)
        bs_known, itl_known = bs[known].astype(np.float64), itl_k0[known]
        one_token_ms = float(np.interp(1.0, bs_known, itl_known))
        if profile.prefill:
            by_tokens: dict[int, list[float]] = {}
            for point in profile.prefill:
                by_tokens.setdefault(point.num_tokens, []).append(point.expected_ms)
            tokens = sorted(by_tokens)
            lat = [float(np.mean(by_tokens[n])) for n in tokens]
            if tokens[0] > 1:
                tokens.insert(0, 1)
                lat.insert(0, _one_token_prefill_ms(profile, tokens[1:], lat, one_token_ms))
            # A prefill of more tokens never costs less: enforce monotone knots.
            lat_mono = np.maximum.accumulate(np.asarray(lat))  # [nP]
            if len(tokens) >= 2:
                tail = (lat_mono[-1] - lat_mono[-2]) / (tokens[-1] - tokens[-2])
            else:
                tail = 0.0
            return PrefillCost(
                num_tokens=tuple(float(n) for n in tokens),
                latency_ms=tuple(float(v) for v in lat_mono),
                source="profile",
                tail_ms_per_token=float(max(tail, 0.0)),
                **_in_decode_knots(profile),
            )
        # No prefill data: ms per extra token from ITL(B, 0) between the two largest profiled B
        # (decode rows are one token each, and at large B the step is closest to compute-bound).
        if bs_known.size >= 2:
            slope = (itl_known[-1] - itl_known[-2]) / (bs_known[-1] - bs_known[-2])
        else:
            slope = 0.0
        return PrefillCost(
            num_tokens=(1.0,),
            latency_ms=(one_token_ms,),
            source="estimated-from-decode-slope",
            tail_ms_per_token=float(max(slope, 0.0)),
            **_in_decode_knots(profile),
        )

    @staticmethod
    def from_physical_model(
        profile: Profile, one_row_step_ms: Callable[[float], float]
    ) -> PrefillCost:
        """For a profile without prefill points: the fitted decode model's step of one row of
        N tokens over N tokens of KV (`one_row_step_ms(N)`), at N = 1, 2, 4, ..., 16384 and
        along its last segment past that. The profile's in-decode points are kept."""
        if profile.prefill:
            raise ValueError("the profile has prefill points: use from_profile")
        tokens = tuple(float(2**i) for i in range(15))
        latency = np.maximum.accumulate([one_row_step_ms(n) for n in tokens])  # [15]
        tail = (latency[-1] - latency[-2]) / (tokens[-1] - tokens[-2])
        return PrefillCost(
            num_tokens=tokens,
            latency_ms=tuple(float(v) for v in latency),
            source="estimated-from-physical-model",
            tail_ms_per_token=float(max(tail, 0.0)),
            **_in_decode_knots(profile),
        )

    def curve_ms(self, num_tokens: float) -> float:
        """Latency of a step computing only `num_tokens` prompt tokens, ms."""
        knots, lat = self._curve  # [nP] each
        if num_tokens <= knots[-1]:
            return float(np.interp(num_tokens, knots, lat))
        return float(lat[-1] + self.tail_ms_per_token * (num_tokens - knots[-1]))

    def marginal_ms(self, num_tokens: float) -> float:
        """What `num_tokens` prompt tokens add to a forward that runs anyway, ms (>= 0), read
        from the prefill curve."""
        if num_tokens <= 0:
            return 0.0
        return max(0.0, self.curve_ms(num_tokens + 1.0) - self._one_token_ms)

    @property
    def in_decode_source(self) -> str:
        """Where `in_decode_ms` comes from (run configs and the CLI print it)."""
        return "measured-in-decode" if self.in_decode_tokens else "prefill-curve-marginal"

    def in_decode_ms(self, num_tokens: float) -> float:
        """What `num_tokens` prompt tokens add to a decode step that runs them in its own
        forward (a fused mixed step), ms: the measured knots (from 0 at 0 tokens, the prefill
        curve's tail slope past the last), else `marginal_ms`."""
        if num_tokens <= 0:
            return 0.0
        if not self.in_decode_tokens:
            return self.marginal_ms(num_tokens)
        knots, added = self._in_decode  # [nI + 1] each, from 0 at 0 tokens
        if num_tokens <= self.in_decode_tokens[-1]:
            return float(np.interp(num_tokens, knots, added))
        last = self.in_decode_tokens[-1]
        return self.in_decode_added_ms[-1] + self.tail_ms_per_token * (num_tokens - last)


def measured_on_fast_path(profile: Profile) -> bool:
    """Whether the profile's decode steps ran at the fast path's fixed shapes (its metadata)."""
    return bool(profile.metadata.get("fast_path", "off") != "off")


def profile_contexts(profile: Profile) -> list[int]:
    """The profile's recorded decode contexts (tokens held), ascending; [] if none."""
    return sorted({p.context_len for p in profile.latency if p.context_len is not None})


def _one_token_prefill_ms(
    profile: Profile, tokens: Sequence[int], latency_ms: Sequence[float], one_row_decode_ms: float
) -> float:
    """The prefill curve's value at 1 token, below the profile's smallest prefill point.

    Where prefill and decode run the same forward (the reference engine, vLLM), a one-token
    prefill is the B = 1, K = 0 decode step. On dsd's fast path (the profile's metadata
    `fast_path`) decode steps replay fixed shapes while prefill runs eagerly, so a decode step is
    far cheaper than any prefill and anchoring there overprices every prompt row (docs/models.md
    §1.4). There the curve is extended along its own first segment instead (not below 0, not
    above its first point)."""
    if not measured_on_fast_path(profile):
        return one_row_decode_ms
    if len(tokens) < 2:
        return float(latency_ms[0])
    slope = (latency_ms[1] - latency_ms[0]) / (tokens[1] - tokens[0])
    return float(np.clip(latency_ms[0] - slope * (tokens[0] - 1), 0.0, latency_ms[0]))


def _in_decode_knots(profile: Profile) -> dict[str, tuple[float, ...]]:
    """`PrefillCost`'s in-decode knots from a profile: per chunk size the mean added ms over
    the measured decode batch sizes, made non-decreasing in tokens. Empty if not measured."""
    by_tokens: dict[int, list[float]] = {}
    for point in profile.prefill_in_decode:
        by_tokens.setdefault(point.num_tokens, []).append(point.added_ms)
    tokens = sorted(by_tokens)
    added = np.maximum.accumulate(np.asarray([np.mean(by_tokens[n]) for n in tokens], float))
    return {
        "in_decode_tokens": tuple(float(n) for n in tokens),
        "in_decode_added_ms": tuple(float(v) for v in added),
    }


def _split_batch(batch: ScheduledBatch) -> tuple[IntArray, IntArray, int]:
    """(K of decode rows [D], context of decode rows [D], prompt tokens of prefill rows)."""
    num_decode = batch.num_decode_reqs
    ks = batch.num_spec_tokens[:num_decode]  # [D]
    contexts = batch.num_computed_tokens[:num_decode]  # [D]
    if num_decode == batch.num_scheduled_tokens.shape[0]:
        return ks, contexts, 0  # no prefill rows (most steps): skip the reduction
    prefill_tokens = int(np.add.reduce(batch.num_scheduled_tokens[num_decode:]))
    return ks, contexts, prefill_tokens


# --------------------------------------------------------------------------------------------
# Table model
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TableLatencyModel:
    """ITL(B, K) read from the profile's table with the goodput policy's own interpolation.

    Calls `policies.goodput.ItlTable` (it is not re-implemented here), so the simulated engine
    and the goodput policy agree on ITL exactly: linear in B between profiled B and clamped at
    the ends, linear in K between the profiled K of each B and clamped at its ends. A K past the
    largest profiled K therefore reads the last profiled K: use the parametric model (or
    `sim.models.latency_choice.fit_latency_model(kind="auto", k_max=...)`) to run K beyond the
    profile.

    A profile measured at two or more context lengths, each a full table, gives the model a
    context axis: a step reads the table of every profiled context and interpolates linearly
    in the decode rows' mean context (tokens held: computed + 1, as the profiler records it),
    extrapolating past the ends along the nearest two contexts (attention reads grow linearly
    in context; a falling slope, which is noise, is taken as flat). `decode_itl_ms` and the
    goodput policy read the context-averaged table.
    """

    profile: Profile  # the measured profile (its K=0 points are required)
    mixed_k: MixedKCosting = "padded"  # how a step with different K per row is charged
    prefill: PrefillCost = field(init=False)  # cost of prompt tokens
    itl_table: ItlTable = field(init=False, repr=False)  # the goodput policy's filled table
    # (context, its own table) per profiled context when there are >= 2; () otherwise
    context_tables: tuple[tuple[float, ItlTable], ...] = field(init=False, repr=False)
    # Memo of decode ITL by (table index, D, charged K): step_ms runs every step.
    _memo: dict[tuple[int, float, float], float] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.profile.latency:
            raise ValueError("the profile has no latency points")
        if self.mixed_k not in ("padded", "token-equivalent"):
            raise ValueError(f"mixed_k must be padded or token-equivalent, got {self.mixed_k!r}")
        object.__setattr__(self, "itl_table", ItlTable.from_profile(self.profile))
        object.__setattr__(self, "context_tables", _context_tables(self.profile))
        object.__setattr__(self, "prefill", PrefillCost.from_profile(self.profile))
        object.__setattr__(self, "_memo", {})

    @property
    def context_free(self) -> bool:
        """step_ms reads each decode row's K and the prefill tokens, never the contexts."""
        return not self.context_tables

    @property
    def prefill_source(self) -> PrefillSource:
        return self.prefill.source

    def decode_itl_ms(self, batch_size: int, num_spec_tokens: int) -> float:
        if batch_size < 1 or num_spec_tokens < 0:
            raise ValueError(f"need B >= 1 and K >= 0, got B={batch_size}, K={num_spec_tokens}")
        return self._itl(float(batch_size), float(num_spec_tokens))

    def _itl(self, batch_size: float, num_spec_tokens: float, table_index: int = -1) -> float:
        """ITL of the averaged table (table_index -1) or of one context's table."""
        key = (table_index, batch_size, num_spec_tokens)
        cached = self._memo.get(key)
        if cached is None:
            table = self.itl_table if table_index < 0 else self.context_tables[table_index][1]
            cached = float(table.itl_ms_at(batch_size, num_spec_tokens))
            self._memo[key] = cached
        return cached

    def _itl_at_context(self, batch_size: float, num_spec_tokens: float, context: float) -> float:
        """ITL at a mean context: linear between the two profiled contexts around it, or along
        the nearest two past either end (slope >= 0 there)."""
        levels = [level for level, _table in self.context_tables]
        upper = min(max(int(np.searchsorted(levels, context)), 1), len(levels) - 1)
        lower = upper - 1
        at_lower = self._itl(batch_size, num_spec_tokens, lower)
        at_upper = self._itl(batch_size, num_spec_tokens, upper)
        slope = (at_upper - at_lower) / (levels[upper] - levels[lower])
        if context > levels[upper]:
            return at_upper + max(slope, 0.0) * (context - levels[upper])
        if context < levels[lower]:
            slope = max(slope, 0.0)
        return max(at_lower + slope * (context - levels[lower]), 1e-6)

    def step_ms(self, batch: ScheduledBatch) -> float:
        ks, contexts, prefill_tokens = _split_batch(batch)
        num_decode = int(ks.shape[0])
        if num_decode == 0:
            if prefill_tokens <= 0:
                raise ValueError(f"step {batch.step_index} schedules no tokens")
            return self.prefill.curve_ms(prefill_tokens)
        if self.mixed_k == "padded":
            k_charged = float(np.maximum.reduce(ks))
        else:
            k_charged = float(ks.sum() + num_decode) / num_decode - 1.0
        if self.context_tables:
            decode_ms = self._itl_at_context(
                float(num_decode), k_charged, float(contexts.mean()) + 1.0
            )
        else:
            decode_ms = self._itl(float(num_decode), k_charged)
        return decode_ms + self.prefill.in_decode_ms(prefill_tokens)


def _context_tables(profile: Profile) -> tuple[tuple[float, ItlTable], ...]:
    """One ITL table per profiled context when the profile has >= 2 contexts and each covers
    the whole (B, K) grid; () otherwise (the model is context-free)."""
    levels = profile_contexts(profile)
    if len(levels) < 2:
        return ()
    grid = {(p.batch_size, p.num_spec_tokens) for p in profile.latency}
    tables = []
    for level in levels:
        points = tuple(p for p in profile.latency if p.context_len == level)
        if {(p.batch_size, p.num_spec_tokens) for p in points} != grid:
            return ()
        tables.append(
            (float(level), ItlTable.from_profile(dataclasses.replace(profile, latency=points)))
        )
    return tuple(tables)


# --------------------------------------------------------------------------------------------
# Parametric model
# --------------------------------------------------------------------------------------------

# Parameter order of the parametric model (all >= 0, ms or ms per unit):
PARAM_NAMES: tuple[str, ...] = (
    "host_ms",  # per-step host overhead (scheduling, sampling, launch)
    "spec_fixed_ms",  # fixed cost of a step that drafts at all (draft setup, K >= 1)
    "spec_per_row_ms",  # per-row part of that fixed cost
    "draft_pass_ms",  # one draft forward pass, fixed part
    "draft_pass_per_row_ms",  # one draft forward pass, per row
    "weight_read_ms",  # target forward, memory-bound floor (weights)
    "row_read_ms",  # target forward, per-row memory traffic
    "kv_read_ms_per_token",  # target forward, KV cache read per context token
    "compute_per_row_ms",  # compute-bound step: per decode row (its token, sampling, ...)
    "compute_spec_per_row_ms",  # compute-bound step: per row of a step that drafts at all
    "compute_per_draft_token_ms",  # compute-bound step: per drafted token (verify + draft row)
    "matrix_product_ms",  # memory-bound floor of a forward of 2+ tokens over one token's (CPU)
)
# The one-token forward's own kernel: on the engine's CPU kernels one row on one thread is a
# matrix-vector product and every other forward a matrix product, which a host may run slower
# (docs/models.md 1.2). Fitted on CPU profiles only; elsewhere pinned at 0, out of the fit.
MATRIX_PRODUCT = PARAM_NAMES.index("matrix_product_ms")
# What the engine's CPU kernels compute for a forward of 1, 2, 3 tokens (`backend.model.
# padded_rows`: 2-3 rows padded to the 4 oneDNN's layout is blocked for; one row on one thread
# unpadded, on several padded too), for CPU profiles that predate `metadata["forward_tokens"]`.
CPU_FORWARD_TOKENS = {True: (1, 4, 4), False: (4, 4, 4)}  # by "ran on one thread"
# Sharpness of the smooth max between memory-bound and compute-bound time: a p-norm, so the
# step is max(mem, compute) far from the ridge and a little above both near it.
SMOOTH_MAX_POWER = 4.0


@dataclass(frozen=True)
class FitReport:
    """How well the parametric model fits the profile's latency points."""

    batch_sizes: tuple[int, ...]  # B of each fitted point
    num_spec_tokens: tuple[int, ...]  # K of each fitted point
    measured_ms: tuple[float, ...]  # profiled median ITL, ms
    predicted_ms: tuple[float, ...]  # model ITL, ms
    relative_residuals: tuple[float, ...]  # (predicted - measured) / measured per point
    max_abs_pct: float  # max |relative residual| * 100
    median_abs_pct: float  # median |relative residual| * 100
    params: dict[str, float]  # fitted parameters by PARAM_NAMES
    context_aware: bool  # False: the profile recorded no context, KV term fixed at 0
    # standard error of each parameter by PARAM_NAMES, from the fit's Jacobian (the linearised
    # covariance s^2 (J^T J)^+ of the relative residuals); inf where the points do not pin it
    # down, 0 for a parameter pinned by its bounds (kv without context)
    param_std: dict[str, float] = field(default_factory=dict)

    def summary(self) -> str:
        return (
            f"parametric fit on {len(self.measured_ms)} points: median |err| "
            f"{self.median_abs_pct:.2f}%, max |err| {self.max_abs_pct:.2f}%"
        )


def _smooth_max(memory_ms: Number, compute_ms: Number) -> Number:
    """(m^p + c^p)^(1/p) of floats or arrays; scaled by m + c so the power cannot overflow."""
    p = SMOOTH_MAX_POWER
    scale = memory_ms + compute_ms + 1e-12
    blended: Number = scale * ((memory_ms / scale) ** p + (compute_ms / scale) ** p) ** (1.0 / p)
    return blended


def forward_tokens_of(profile: Profile) -> tuple[int, ...]:
    """What the profiled engine's forward of 1, 2, ... tokens computes where it pads (the
    profile's `metadata["forward_tokens"]`; CPU profiles without it ran the CPU kernels of
    `CPU_FORWARD_TOKENS`); () where it computes what it is given."""
    recorded = profile.metadata.get("forward_tokens")
    if recorded is not None:
        return tuple(int(tokens) for tokens in recorded)
    if profile.metadata.get("device_type") != "cpu":
        return ()
    threads = profile.metadata.get("threads", {}).get("torch_intra_op_threads", 1)
    return CPU_FORWARD_TOKENS[threads == 1]


def verify_width(num_rows: int, k: int, worth_tokens: int) -> int:
    """Tokens per row of the engine's verify forward of `num_rows` rows of `k` + 1 tokens whose
    kernels compute `worth_tokens` for them: every row widened alike (trash tokens) until the
    forward holds that many, so 3 rows at K = 0 compute 6 on the CPU kernels (which compute 4
    for 3). `backend.engine.SpecDecodeEngine` runs it; `padding_tokens` prices it."""
    return max(k + 1, -(-worth_tokens // num_rows))


def padding_tokens(forward_tokens: Sequence[int], num_decode: float, max_k: float) -> float:
    """Tokens the engine's verify forward of `num_decode` rows of `max_k` + 1 tokens computes
    beyond them (`verify_width`), where its kernels would pad the forward (`forward_tokens`,
    of `forward_tokens_of`). 0 past the padded counts."""
    tokens = num_decode * (max_k + 1.0)
    count = int(tokens)
    if not 0 < count <= len(forward_tokens):
        return 0.0
    width = verify_width(int(num_decode), int(max_k), forward_tokens[count - 1])
    return num_decode * width - tokens


def _step_parts(
    params: Params,
    num_decode: Number,
    max_k: Number,
    verified_tokens: Number,
    context_tokens: Number,
    pad_tokens: Number,
) -> tuple[Number, Number, Number]:
    """(memory-bound ms, compute-bound ms, drafting 0/1) of steps, for floats or arrays [n].
    `pad_tokens`: what the forward computes beyond the D (max K + 1) tokens of its rows (the
    CPU kernels' padding), each priced as a drafted token."""
    _host, spec0, spec1, draft0, draft1, weights, row, kv, row_c, spec_c, token_c, matrix = params
    drafting: Number = 1.0 * (max_k > 0)  # type: ignore[assignment]
    several: Number = 1.0 * (verified_tokens > 1)  # type: ignore[assignment]
    # The whole step (draft passes included) is either bandwidth- or compute-bound.
    draft_ms = (
        drafting * (spec0 + spec1 * num_decode)
        + max_k * draft0
        + (max_k * num_decode + pad_tokens) * draft1
    )
    memory_ms = weights + row * num_decode + kv * context_tokens + draft_ms + matrix * several
    drafted_tokens = verified_tokens - num_decode + pad_tokens  # each row verifies K_i + 1
    compute_ms = (row_c + spec_c * drafting) * num_decode + token_c * drafted_tokens
    return memory_ms, compute_ms, drafting


def _parametric_ms(
    params: Params,
    num_decode: Number,
    max_k: Number,
    verified_tokens: Number,
    context_tokens: Number,
    pad_tokens: Number,
) -> Number:
    """Decode step latency of one step (floats) or of arrays of steps [n]; docs/models.md.
    Plain float arithmetic for one step: the simulator prices every step so."""
    memory_ms, compute_ms, _ = _step_parts(
        params, num_decode, max_k, verified_tokens, context_tokens, pad_tokens
    )
    return params[0] + _smooth_max(memory_ms, compute_ms)


def _parametric_jacobian(
    params: FloatArray,
    num_decode: FloatArray,
    max_k: FloatArray,
    verified_tokens: FloatArray,
    context_tokens: FloatArray,
    pad_tokens: FloatArray,
) -> FloatArray:
    """d(step ms)/d(params) [n, p] in PARAM_NAMES order: the smooth max's partials (m/s)^(p-1)
    and (c/s)^(p-1) times each term's coefficient (the fit converges in fewer steps than with
    finite differences)."""
    memory, compute, drafting = _step_parts(
        params, num_decode, max_k, verified_tokens, context_tokens, pad_tokens
    )
    blended = np.maximum(_smooth_max(memory, compute), 1e-12)  # [n]
    d_memory = (memory / blended) ** (SMOOTH_MAX_POWER - 1.0)  # [n]
    d_compute = (compute / blended) ** (SMOOTH_MAX_POWER - 1.0)  # [n]
    columns = (
        np.ones_like(num_decode),  # host
        d_memory * drafting,  # spec fixed
        d_memory * drafting * num_decode,  # spec per row
        d_memory * max_k,  # draft pass
        d_memory * (max_k * num_decode + pad_tokens),  # draft pass per row (and padding)
        d_memory,  # weights
        d_memory * num_decode,  # row read
        d_memory * context_tokens,  # kv read
        d_compute * num_decode,  # compute per row
        d_compute * drafting * num_decode,  # compute per drafting row
        d_compute * (verified_tokens - num_decode + pad_tokens),  # per drafted token
        d_memory * (verified_tokens > 1),  # matrix product
    )
    return np.stack(columns, axis=1)


def _context_aware(profile: Profile) -> bool:
    """Whether every latency point recorded its context (else the KV term is pinned at 0)."""
    return all(p.context_len is not None for p in profile.latency)


def _parameter_std(
    jacobian: FloatArray, residuals: FloatArray, free: BoolArray, kv_pinned: bool
) -> dict[str, float]:
    """Standard errors of the fitted parameters (see FitReport.param_std); `jacobian` has the
    `free` parameters' columns, the others are pinned at 0 (standard error 0)."""
    jac = np.asarray(jacobian, dtype=np.float64)  # [n, free p]
    dof = max(jac.shape[0] - jac.shape[1], 1)
    variance = float(np.sum(residuals**2)) / dof
    normal = jac.T @ jac  # [p, p]
    covariance = np.linalg.pinv(normal) * variance  # [p, p]
    std = np.sqrt(np.clip(np.diag(covariance), 0.0, None))  # [p]
    # a direction the points do not move (a zero column of J) has no information at all
    std[np.abs(jac).max(axis=0) == 0] = np.inf
    all_std = np.zeros(len(PARAM_NAMES))
    all_std[free] = std
    errors = {name: float(v) for name, v in zip(PARAM_NAMES, all_std, strict=True)}
    if kv_pinned:
        errors["kv_read_ms_per_token"] = 0.0
    return errors


@dataclass(frozen=True)
class ParametricLatencyModel:
    """Fitted decode cost: host overhead + smooth-max(memory, compute) of the whole step.

    ITL = h + smax(w + r D + kv sum(L) + [K>0](s0 + s1 D) + K d0 + (K D + P) d1 + [T>1] g,
                   (c + [K>0] c_s) D + c_t (sum(K_i) + P))
    (K = max K_i, T = sum(K_i + 1); g and the padding P only on CPU profiles) with all
    parameters >= 0, so ITL never decreases in K or context, nor in B but where the padding
    makes fewer rows compute more tokens (`padding_tokens`: D = 3, K = 0 computes 6 on the CPU
    kernels, D = 4 computes 4). P: what the verify forward computes beyond D (K + 1) tokens
    (none in a step that runs prefill chunks, which have tokens enough).
    """

    params: tuple[float, ...]  # fitted values, in PARAM_NAMES order
    reference_context_len: float  # mean context per row used by decode_itl_ms, tokens
    prefill: PrefillCost  # cost of prompt tokens
    fit_report: FitReport  # fit error on the profile's points
    forward_tokens: tuple[int, ...] = ()  # `forward_tokens_of` the profile: the padding

    def __post_init__(self) -> None:
        if len(self.params) != len(PARAM_NAMES):
            raise ValueError(f"expected {len(PARAM_NAMES)} parameters, got {len(self.params)}")
        if any(not (math.isfinite(v) and v >= 0) for v in self.params):
            raise ValueError(f"parameters must be finite and >= 0, got {self.params}")

    @property
    def prefill_source(self) -> PrefillSource:
        return self.prefill.source

    @staticmethod
    def fit(profile: Profile) -> ParametricLatencyModel:
        """Least-squares fit (relative error, robust loss) to every latency point. Deterministic."""
        points = profile.latency
        if len(points) < 3:
            raise ValueError(f"need >= 3 latency points to fit, the profile has {len(points)}")
        num_decode = np.array([p.batch_size for p in points], dtype=np.float64)  # [n]
        ks = np.array([p.num_spec_tokens for p in points], dtype=np.float64)  # [n]
        measured = np.array([p.expected_ms for p in points], dtype=np.float64)  # [n]
        context_aware = _context_aware(profile)
        per_row_ctx = np.array(
            [float(p.context_len or 0) if context_aware else 0.0 for p in points]
        )  # [n]
        context = per_row_ctx * num_decode  # [n]
        verified = num_decode * (ks + 1.0)  # [n]
        forward_tokens = forward_tokens_of(profile)
        pads = np.array(
            [padding_tokens(forward_tokens, d, k) for d, k in zip(num_decode, ks, strict=True)]
        )  # [n]

        smallest = float(measured.min())
        initial = np.array(
            [
                0.1 * smallest,  # host
                0.05 * smallest,  # spec fixed
                1e-3,  # spec per row
                0.05 * smallest,  # draft pass
                1e-3,  # draft pass per row
                0.7 * smallest,  # weight read
                1e-3,  # row read
                1e-6 if context_aware else 0.0,  # kv read per token
                float(measured.max() / num_decode.max()),  # compute per row
                1e-3,  # compute per row of a drafting step
                float(measured.max() / verified.max()),  # compute per drafted token
                0.05 * smallest,  # matrix product
            ]
        )
        upper = np.full(len(PARAM_NAMES), np.inf)
        if not context_aware:
            # No context recorded: the KV term is not identifiable; pin it at 0. By its bound,
            # not by `free` as g below: dropping its (zero) column changes the solver's path in
            # the shallow valley, and so the published profile's fit (max residual 1.64% ->
            # 1.69%) and every report priced by it.
            upper[PARAM_NAMES.index("kv_read_ms_per_token")] = 1e-300

        # the matrix-product term only where the engine's CPU kernels ran the profile
        free = np.ones(len(PARAM_NAMES), dtype=bool)
        free[MATRIX_PRODUCT] = profile.metadata.get("device_type") == "cpu"

        def full(params: FloatArray) -> FloatArray:
            values = np.zeros(len(PARAM_NAMES))
            values[free] = params
            return values

        def residuals(params: FloatArray) -> FloatArray:
            predicted = _parametric_ms(full(params), num_decode, ks, verified, context, pads)
            relative: FloatArray = (predicted - measured) / measured
            return relative

        def jacobian(params: FloatArray) -> FloatArray:
            slopes = _parametric_jacobian(full(params), num_decode, ks, verified, context, pads)
            return slopes[:, free] / measured[:, None]  # [n, free p]

        from scipy.optimize import least_squares  # ~0.3 s to import: only when fitting

        result = least_squares(
            residuals,
            initial[free],
            jac=jacobian,
            bounds=(np.zeros(int(free.sum())), upper[free]),
            loss="soft_l1",  # robust: one outlier point must not bend the whole surface
            f_scale=0.05,
            x_scale="jac",
            method="trf",
            # The points leave a shallow valley (host vs weights, spec vs draft costs). The
            # exact trust-region solver crawls along it: thousands of steps, stopping short of
            # the minimum; LSMR's damped steps reach the minimum in a few dozen (docs/models.md
            # 1.2, "The fit").
            tr_solver="lsmr",
            max_nfev=2000,
        )
        fitted = full(np.maximum(result.x, 0.0))
        if not context_aware:
            fitted[PARAM_NAMES.index("kv_read_ms_per_token")] = 0.0
        predicted = _parametric_ms(fitted, num_decode, ks, verified, context, pads)
        rel = (predicted - measured) / measured  # [n]
        report = FitReport(
            batch_sizes=tuple(int(p.batch_size) for p in points),
            num_spec_tokens=tuple(int(p.num_spec_tokens) for p in points),
            measured_ms=tuple(float(v) for v in measured),
            predicted_ms=tuple(float(v) for v in predicted),
            relative_residuals=tuple(float(v) for v in rel),
            max_abs_pct=float(np.abs(rel).max() * 100.0),
            median_abs_pct=float(np.median(np.abs(rel)) * 100.0),
            params={name: float(v) for name, v in zip(PARAM_NAMES, fitted, strict=True)},
            context_aware=context_aware,
            param_std=_parameter_std(result.jac, rel, free, kv_pinned=not context_aware),
        )
        return ParametricLatencyModel.from_fit(profile, tuple(float(v) for v in fitted), report)

    @staticmethod
    def from_fit(
        profile: Profile, params: tuple[float, ...], fit_report: FitReport
    ) -> ParametricLatencyModel:
        """The model of `params` fitted to `profile` (by `fit`, or stored from an earlier fit):
        its reference context and prefill cost come from the profile."""
        if _context_aware(profile):
            reference_ctx = float(np.mean([float(p.context_len or 0) for p in profile.latency]))
        else:
            reference_ctx = 0.0
        if profile.prefill:
            prefill = PrefillCost.from_profile(profile)
        else:  # a prompt of N tokens priced as the fitted step of one row verifying N tokens
            prefill = PrefillCost.from_physical_model(
                profile, lambda n: _parametric_ms(params, 1.0, 0.0, n, n, 0.0)
            )
        return ParametricLatencyModel(
            params=params,
            reference_context_len=reference_ctx,
            prefill=prefill,
            fit_report=fit_report,
            forward_tokens=forward_tokens_of(profile),
        )

    @property
    def context_free(self) -> bool:
        """step_ms never reads the contexts: the KV term is 0 (a profile without contexts)."""
        return self.params[PARAM_NAMES.index("kv_read_ms_per_token")] == 0.0

    def decode_itl_ms(self, batch_size: int, num_spec_tokens: int) -> float:
        if batch_size < 1 or num_spec_tokens < 0:
            raise ValueError(f"need B >= 1 and K >= 0, got B={batch_size}, K={num_spec_tokens}")
        return self.forward_ms(
            float(batch_size),
            float(num_spec_tokens),
            float(batch_size * (num_spec_tokens + 1)),
            float(batch_size) * self.reference_context_len,
        )

    def forward_ms(
        self,
        num_decode: float,
        max_k: float,
        verified_tokens: float,
        context_tokens: float,
        with_prefill: bool = False,
    ) -> float:
        """One step of `num_decode` rows verifying `verified_tokens` tokens over
        `context_tokens` of KV, drafting `max_k` per row, by the fitted form, ms (padded as
        the engine pads its forward of D (max K + 1) tokens unless prefill chunks share it)."""
        pad = 0.0
        if self.forward_tokens and not with_prefill:
            pad = padding_tokens(self.forward_tokens, num_decode, max_k)
        return _parametric_ms(self.params, num_decode, max_k, verified_tokens, context_tokens, pad)

    def step_ms(self, batch: ScheduledBatch) -> float:
        ks, contexts, prefill_tokens = _split_batch(batch)
        num_decode = int(ks.shape[0])
        if num_decode == 0:
            if prefill_tokens <= 0:
                raise ValueError(f"step {batch.step_index} schedules no tokens")
            return self.prefill.curve_ms(prefill_tokens)
        decode = self.forward_ms(
            float(num_decode),
            float(np.maximum.reduce(ks)),
            float(np.add.reduce(ks) + num_decode),
            float(np.add.reduce(contexts)),
            with_prefill=prefill_tokens > 0,
        )
        return decode + self.prefill.in_decode_ms(prefill_tokens)


# --------------------------------------------------------------------------------------------
# Coverage and the context policy's view of a model
# --------------------------------------------------------------------------------------------


def table_covers(profile: Profile, k_values: Sequence[int]) -> bool:
    """True when every profiled B row has K=0 and spans every K in `k_values`."""
    _bs, ks, grid = profile.itl_grid()
    if not k_values:
        return True
    for row in grid:
        known = ks[~np.isnan(row)]
        if known.size == 0 or known[0] > 0 or known[-1] < max(k_values):
            return False
    return 0 in set(ks.tolist())


def context_latency_fn(
    latency: TableLatencyModel | ParametricLatencyModel,
) -> ContextLatencyFn:
    """ITL(B, K [n], total context tokens) ms [n] of the run's fitted decode model.

    What the `context` policy optimises against: the parametric model prices the KV read of
    `context_tokens` (uniform K per row, so B (K + 1) verified tokens); the table model has no
    context axis and reads ITL(B, K).
    """
    if isinstance(latency, ParametricLatencyModel):
        parametric = latency

        def parametric_ms(batch_size: float, ks: FloatArray, context_tokens: float) -> FloatArray:
            k_values = np.asarray(ks, dtype=np.float64)  # [n]
            return np.array(
                [
                    parametric.forward_ms(batch_size, k, batch_size * (k + 1.0), context_tokens)
                    for k in k_values.tolist()
                ],
                dtype=np.float64,
            )  # [n]

        return parametric_ms
    table = latency.itl_table

    def table_ms(batch_size: float, ks: FloatArray, context_tokens: float) -> FloatArray:
        del context_tokens  # the PR table has no context axis
        return np.asarray(table.itl_ms_at(batch_size, ks), dtype=np.float64)  # [n]

    return table_ms
