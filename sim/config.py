"""The config of one run of the engine loop: every knob, validated on construction.

`RunConfig` is frozen and picklable (sweeps ship it to worker processes) and reads no files;
`sim.resolve` loads what it names and chooses the defaults it leaves open.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from dsd.common.errors import InputError, require_choice, require_int, require_number
from dsd.policies.types import K_TIMINGS, MAX_NUM_SEQS, MAX_SPEC_TOKENS, KTiming, SchedulingMode
from dsd.sim.models.latency import LatencyModelKind, MixedKCosting
from dsd.sim.scheduler import SPECULATIVE_METHODS
from dsd.traces.datasets import RandomLengths
from dsd.traces.loaders import TraceOptions
from dsd.traces.rollout import RolloutConfig

AcceptanceKind = Literal["per-position", "heterogeneous", "empirical", "replay"]
PrefillCostMode = Literal["profile", "free"]
SchedulerKind = Literal["dsd", "vllm"]

SCHEDULING_MODES: tuple[str, ...] = ("sync", "async")
SCHEDULER_KINDS: tuple[str, ...] = ("dsd", "vllm")
LATENCY_MODEL_KINDS: tuple[str, ...] = ("auto", "table", "parametric")
ACCEPTANCE_MODEL_KINDS: tuple[str, ...] = ("heterogeneous", "per-position", "empirical", "replay")
PREFILL_COST_MODES: tuple[str, ...] = ("profile", "free")
MIXED_K_COSTINGS: tuple[str, ...] = ("padded", "token-equivalent")

# vLLM's engine defaults (V1, OpenAI server) used when the config leaves them open.
DEFAULT_MAX_NUM_SEQS = 256
DEFAULT_MAX_NUM_BATCHED_TOKENS = 8192
DEFAULT_BLOCK_SIZE = 16
# Most re-runs a prediction interval may take (`interval_runs`).
MAX_INTERVAL_RUNS = 1000
# k_max of a run whose config and profile give none (a real run of a static policy).
DEFAULT_K_MAX = 4


def _check_category_acceptance(value: object) -> None:
    if not isinstance(value, tuple):
        raise InputError(f"category_acceptance: must be a tuple of (tag, rates), got {value!r}")
    seen: set[str] = set()
    for index, item in enumerate(value):
        where = f"category_acceptance[{index}]"
        if not isinstance(item, tuple) or len(item) != 2 or not isinstance(item[0], str):
            raise InputError(f"{where}: must be a (tag, rates) pair, got {item!r}")
        tag, rates = item
        if not tag or tag in seen:
            raise InputError(f"{where}: tag must be non-empty and unique, got {tag!r}")
        seen.add(tag)
        if not isinstance(rates, tuple) or not rates:
            raise InputError(f"{where}: rates must be a non-empty tuple, got {rates!r}")
        for position, rate in enumerate(rates):
            if (
                isinstance(rate, bool)
                or not isinstance(rate, int | float)
                or not (0.0 <= float(rate) <= 1.0)
            ):
                raise InputError(f"{where}: rates[{position}] must be in [0, 1], got {rate!r}")


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """Every knob of one run of the engine loop. Validated on construction; reads no files.

    The simulator uses all of it; a real run (`dsd run`, the measured side of `dsd validate`)
    uses the policy, workload and scheduler fields and the latency model (what `context`
    optimises against), and its executor ignores the simulator's executor fields (acceptance
    model, host overhead, jitter, ablation switches).
    """

    # Profile file (our JSON or PR #32374's): latency table, acceptance rates, k_max. The
    # simulator needs one; a real run only when its policy reads one (None: no profile).
    profile: str | None = None
    # K policy SPEC (policies.spec): static:K, table:JSON_OR_PATH, goodput, online[:...].
    policy: str
    # Workload name (traces.registry.KNOWN_NAMES) or a .csv/.parquet/.jsonl workload file.
    dataset: str = "mt-bench"
    # Requests to send (None: the whole set / trace; 1000 for random), like --num-prompts.
    num_prompts: int | None = None
    # Cap on requests in flight (None: no cap), like --max-concurrency; closed loop with inf rate.
    max_concurrency: int | None = None
    # Mean requests/s of the arrivals; inf sends at 0 (or keeps a trace's own times).
    request_rate: float = math.inf
    # Gamma shape of the inter-arrival gaps (1.0 = Poisson), like --burstiness.
    burstiness: float = 1.0
    # Override every request's output tokens (max_tokens); None keeps the dataset's.
    output_len: int | None = None
    # Prompt-set lengths counted with the chat template (vLLM bench default).
    chat_template: bool = True
    # Permute a prompt set with the seed before taking num_prompts.
    shuffle: bool = False
    # Leave out the prompts the profile's acceptance run recorded (`Profile.draft_outcome_keys`)
    # before taking num_prompts: a prediction for prompts the profile never saw (held out).
    held_out_prompts: bool = False
    # The `random` dataset's lengths (--random-input-len/--random-output-len/--random-range-ratio).
    random_lengths: RandomLengths = field(default_factory=RandomLengths)
    # Window / sampling / caps / time scale for traces and workload files (None: defaults).
    trace_options: TraceOptions | None = None
    # The rl-rollout shape (None: defaults).
    rollout: RolloutConfig | None = None
    # "sync": plan after each outcome; "async": plan step t+1 while step t runs (vLLM async).
    scheduling: SchedulingMode = "sync"
    # When the K a policy picks at step t is verified: "next-step" (vLLM 0.33: drafted at the
    # end of step t, verified at t + 1; sync and async) or "same-step" (sync only: at step t).
    k_timing: KTiming = "next-step"
    # Whose scheduler plans the steps: "dsd" (sim.scheduler, the fast default) or "vllm"
    # (vLLM 0.33's own, installed; sim.vllm_oracle.VllmScheduler): the simulator only.
    scheduler: SchedulerKind = "dsd"
    # vLLM's drafting method (sim.scheduler.SPECULATIVE_METHODS): the KV lookahead slots and
    # per-row budget slots its scheduler reserves (ngram: none; eagle/eagle3/mtp: K lookahead;
    # draft_model: K lookahead + 1 slot; pard: K + K; p-eagle: K + K - 1).
    speculative_method: str = "ngram"
    # Most requests running at once; None: 256 (vLLM's default).
    max_num_seqs: int | None = None
    # Token budget per step (decode rows with drafts + prefill chunks); vLLM's default 8192.
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    # Longest context, tokens; None: longest request (prompt + output) + k_max + 1, so no
    # request is cut and drafts are never trimmed by it.
    max_model_len: int | None = None
    # KV pool in blocks of 16 tokens; None: every running sequence can hold its longest request
    # (min(max_num_seqs, requests) x ceil(max_model_len / 16)), so nothing is ever preempted.
    num_kv_blocks: int | None = None
    # Largest K (num_speculative_tokens); None: the profile's k_max, else DEFAULT_K_MAX, raised
    # to the K the policy fixes (static:K, a range table's largest K: policies.spec_k_max).
    k_max: int | None = None
    # Step latency model: "table" (the profile, goodput's interpolation), "parametric" (fitted,
    # extrapolates), "auto" (table when it covers K=0..k_max at every profiled B).
    latency_model: LatencyModelKind = "auto"
    # Acceptance model (docs/models.md §2): "heterogeneous" (requests differ: Beta-distributed
    # rates), "per-position" (all alike), "empirical" (each request replays one measured
    # request's draft sequence, then samples its (drafted, accepted) histogram), "replay"
    # (recorded drafts and matches position by position: `replay_recording`, else the bundled
    # early-exit recording).
    acceptance_model: AcceptanceKind = "heterogeneous"
    # Replay recording file for acceptance_model "replay": a "dsd-replay" JSON of a real run
    # (sim.models.replay; request i replays recorded request i, so the run's own workload replays
    # exactly) or an early-exit match recording. None: the bundled recording.
    replay_recording: str | None = None
    # Host time per step that the profile's step timing did not see, ms, >= 0, added to every
    # step; None: the profile's measured host-overhead model if it has one, else 0.
    host_overhead_ms: float | None = None
    # The part of host_overhead_ms spent planning the step (admissions, scheduler, policy),
    # which async scheduling overlaps with the previous step; needs host_overhead_ms. None:
    # 0 with host_overhead_ms; the measured model's own split without it.
    host_planning_ms: float | None = None
    # Lognormal step-latency noise sigma (0: none); duration *= exp(sigma * Z).
    jitter_sigma: float = 0.0
    # Ablation: "profile" charges prompt tokens from the profile; "free" charges nothing for them.
    prefill_cost: PrefillCostMode = "profile"
    # Ablation: charge every decode step at this B and show it to the policy (None: the real B).
    fixed_batch_size: int | None = None
    # Run seed, >= 0: roots every random stream (see the module docstring).
    seed: int = 0
    # The simulator only: re-runs on seeds derived from `seed` that state how far the
    # workload's own sampling moves the run's figures (`sim.interval`: a 90% prediction
    # interval per figure); each costs one more simulation. 0: none.
    interval_runs: int = 0
    # How the table model charges a step whose rows draft different K: "padded" ITL(D, max K)
    # (what the draft's max-K passes cost) or "token-equivalent" ITL(D, sum(K_i + 1) / D - 1).
    # The parametric model has its own decomposition and ignores this.
    mixed_k: MixedKCosting = "padded"
    # Per-category acceptance: (tag, per-position rates r_1..r_n) pairs; a request whose
    # RequestSpec.tag is listed draws from those rates (per-position model), the rest from
    # `acceptance_model`. Empty: no routing. Lets a workload's acceptance move with its mix.
    category_acceptance: tuple[tuple[str, tuple[float, ...]], ...] = ()

    def __post_init__(self) -> None:
        if self.profile is not None and (
            not isinstance(self.profile, str) or not self.profile.strip()
        ):
            raise InputError(f"profile: must be a non-empty string or None, got {self.profile!r}")
        for name in ("policy", "dataset"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise InputError(f"{name}: must be a non-empty string, got {value!r}")
        require_int(self.num_prompts, "num_prompts", 1, optional=True)
        require_int(self.max_concurrency, "max_concurrency", 1, optional=True)
        require_number(self.request_rate, "request_rate", minimum=0.0, allow_inf=True)
        if self.request_rate == 0:
            raise InputError("request_rate: must be > 0 (inf sends everything at once)")
        require_number(self.burstiness, "burstiness", minimum=0.0)
        if self.burstiness == 0:
            raise InputError("burstiness: must be > 0, got 0")
        require_int(self.output_len, "output_len", 1, optional=True)
        if not isinstance(self.random_lengths, RandomLengths):
            raise InputError("random_lengths: must be a traces.datasets.RandomLengths")
        if self.trace_options is not None and not isinstance(self.trace_options, TraceOptions):
            raise InputError("trace_options: must be a traces.loaders.TraceOptions or None")
        if self.rollout is not None and not isinstance(self.rollout, RolloutConfig):
            raise InputError("rollout: must be a traces.rollout.RolloutConfig or None")
        if not isinstance(self.held_out_prompts, bool):
            raise InputError(
                f"held_out_prompts: must be true or false, got {self.held_out_prompts!r}"
            )
        require_choice(self.scheduling, "scheduling", SCHEDULING_MODES)
        require_choice(self.k_timing, "k_timing", K_TIMINGS)
        require_choice(self.speculative_method, "speculative_method", SPECULATIVE_METHODS)
        require_choice(self.scheduler, "scheduler", SCHEDULER_KINDS)
        if self.scheduler == "vllm" and self.k_timing != "next-step":
            raise InputError("k_timing: vLLM's scheduler verifies a step's K at the next step")
        if self.k_timing == "same-step" and self.scheduling == "async":
            raise InputError("k_timing: same-step needs --scheduling sync")
        require_int(self.max_num_seqs, "max_num_seqs", 1, MAX_NUM_SEQS, optional=True)
        require_int(self.max_num_batched_tokens, "max_num_batched_tokens", 1)
        require_int(self.max_model_len, "max_model_len", 2, optional=True)
        require_int(self.num_kv_blocks, "num_kv_blocks", 1, optional=True)
        require_int(self.k_max, "k_max", 0, MAX_SPEC_TOKENS, optional=True)
        require_choice(self.latency_model, "latency_model", LATENCY_MODEL_KINDS)
        require_choice(self.acceptance_model, "acceptance_model", ACCEPTANCE_MODEL_KINDS)
        if self.replay_recording is not None:
            if not isinstance(self.replay_recording, str) or not self.replay_recording.strip():
                raise InputError(
                    f"replay_recording: must be a file path or None, got {self.replay_recording!r}"
                )
            if self.acceptance_model != "replay":
                raise InputError(
                    "replay_recording: only the replay acceptance model reads a recording, "
                    f"got acceptance_model {self.acceptance_model!r}"
                )
        require_number(self.host_overhead_ms, "host_overhead_ms", minimum=0.0, optional=True)
        require_number(self.host_planning_ms, "host_planning_ms", minimum=0.0, optional=True)
        if self.host_planning_ms is not None and (
            self.host_overhead_ms is None or self.host_planning_ms > self.host_overhead_ms
        ):
            raise InputError(
                f"host_planning_ms: {self.host_planning_ms} must be a part of host_overhead_ms "
                f"({self.host_overhead_ms}): give both, planning <= overhead"
            )
        require_number(self.jitter_sigma, "jitter_sigma", minimum=0.0)
        require_choice(self.prefill_cost, "prefill_cost", PREFILL_COST_MODES)
        require_int(self.fixed_batch_size, "fixed_batch_size", 1, optional=True)
        require_int(self.seed, "seed", 0)
        require_int(self.interval_runs, "interval_runs", 0, MAX_INTERVAL_RUNS)
        require_choice(self.mixed_k, "mixed_k", MIXED_K_COSTINGS)
        _check_category_acceptance(self.category_acceptance)
