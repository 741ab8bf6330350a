"""policies/plugin.py: a user's policy by FILE.py:Class, module:Class, an entry point or a Python
object; its arguments, what it is handed, its contract at load and run time, its source."""

from __future__ import annotations

import hashlib
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import dsd
from dsd.common.errors import InputError
from dsd.policies.plugin import UserPolicy, checked_k, policy_spec
from dsd.policies.range_table import compile_batch_size_table, synthetic_view
from dsd.policies.spec import parse_policy, policy_source
from dsd.policies.types import StepFeedback, StepView

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "k_policy.py"
H100 = REPO / "policies" / "profiles" / "pr32374_llama31_8b_eagle_h100.json"

POLICIES = """
from dataclasses import dataclass


class Half:
    BATCH_SIZE_ONLY = True

    def choose_k(self, view):
        return view.k_max // 2

    def observe(self, feedback):
        pass


@dataclass
class LimitConfig:
    limit: int = 1
    scale: float = 1.0
    per_row: bool = False


class Limited:
    def __init__(self, k_max, config: LimitConfig = LimitConfig()):
        self.k_max = k_max
        self.config = config

    def choose_k(self, view):
        k = min(self.config.limit, view.k_max)
        return [k] * view.num_decode_reqs if self.config.per_row else k

    def observe(self, feedback):
        pass


class Keywords:
    def __init__(self, k=2, profile=None):
        self.k = k
        self.has_profile = profile is not None

    def choose_k(self, view):
        return min(self.k, view.k_max)

    def observe(self, feedback):
        pass


class Sampler:
    def __init__(self, seed, rng):
        self.rng = rng
        self.seed = seed

    def choose_k(self, view):
        return self.rng.integers(0, view.k_max + 1, view.num_decode_reqs)

    def observe(self, feedback):
        pass


class Returns:
    def __init__(self, value=0):
        self.value = value

    def choose_k(self, view):
        return self.value

    def observe(self, feedback):
        pass


class Raises:
    def choose_k(self, view):
        return 1 // 0

    def observe(self, feedback):
        raise RuntimeError("nothing to learn")


class NoObserve:
    def choose_k(self, view):
        return 0


class NeedsMore:
    def __init__(self, table):
        self.table = table

    def choose_k(self, view):
        return 0

    def observe(self, feedback):
        pass


def make_half():
    return Half()


NOT_A_CLASS = 3
"""


@pytest.fixture
def policies(tmp_path: Path) -> Path:
    path = tmp_path / "mypolicies.py"
    path.write_text(POLICIES, encoding="utf-8")
    return path


def _build(spec: str, k_max: int = 4, **kwargs: object) -> UserPolicy:
    policy = parse_policy(spec, profile=None, k_max=k_max, max_num_seqs=16, **kwargs)  # type: ignore[arg-type]
    assert isinstance(policy, UserPolicy)
    return policy


def _view(batch_size: int, k_max: int = 4) -> StepView:
    return synthetic_view(batch_size, k_max)


def test_a_file_policy_runs_as_written(policies: Path) -> None:
    policy = _build(f"{policies}:Half")
    assert policy.choose_k(_view(3)) == 2
    assert policy.BATCH_SIZE_ONLY is True
    assert compile_batch_size_table(policy, 4, 16) == [[1, 16, 2]]


def test_arguments_fill_the_config_dataclass(policies: Path) -> None:
    policy = _build(f"{policies}:Limited:limit=3,scale=0.5,per_row=true")
    inner = policy.inner
    assert inner.config.limit == 3 and inner.config.scale == 0.5 and inner.config.per_row is True  # type: ignore[attr-defined]
    assert inner.k_max == 4  # type: ignore[attr-defined]
    assert policy.choose_k(_view(2)).tolist() == [3, 3]  # type: ignore[union-attr]
    with pytest.raises(
        InputError, match=r"expected key=value with key in \['limit', 'per_row', 'scale'\]"
    ):
        _build(f"{policies}:Limited:speed=3")
    with pytest.raises(InputError, match="limit must be an integer"):
        _build(f"{policies}:Limited:limit=many")
    with pytest.raises(InputError, match="per_row must be true or false"):
        _build(f"{policies}:Limited:per_row=maybe")


def test_arguments_fill_keyword_parameters_without_a_config(policies: Path) -> None:
    assert _build(f"{policies}:Keywords:k=3").choose_k(_view(1)) == 3
    assert _build(f"{policies}:Keywords").choose_k(_view(1)) == 2
    with pytest.raises(InputError, match=r"key in \['k'\]"):  # profile is dsd's, not a key
        _build(f"{policies}:Keywords:profile=x")


def test_the_run_seed_stream_reaches_the_policy(policies: Path) -> None:
    def draws(seed: int) -> list[int]:
        policy = _build(f"{policies}:Sampler", seed=np.random.SeedSequence(seed))
        return np.concatenate([policy.choose_k(_view(8)) for _ in range(5)]).tolist()  # type: ignore[list-item]

    assert draws(1) == draws(1)
    assert draws(1) != draws(2)
    assert isinstance(_build(f"{policies}:Sampler").inner.seed, np.random.SeedSequence)  # type: ignore[attr-defined]


def test_a_factory_function_and_a_module(policies: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert _build(f"{policies}:make_half").choose_k(_view(1)) == 2
    package = policies.parent / "userpkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "pols.py").write_text(POLICIES)
    monkeypatch.syspath_prepend(str(policies.parent))
    assert _build("userpkg.pols:Half").choose_k(_view(1)) == 2
    source = policy_source("userpkg.pols:Half")
    assert source is not None and source["kind"] == "module" and source["class"] == "Half"
    sys.modules.pop("userpkg.pols", None)
    sys.modules.pop("userpkg", None)


def test_an_installed_entry_point(policies: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (policies.parent / "eppols.py").write_text(POLICIES)
    monkeypatch.syspath_prepend(str(policies.parent))
    point = metadata.EntryPoint(name="halfway", value="eppols:Limited", group="dsd.policies")

    def entry_points(**selection: str) -> list[metadata.EntryPoint]:
        return [point] if selection.get("group") == "dsd.policies" else []

    monkeypatch.setattr(metadata, "entry_points", entry_points)
    assert _build("halfway:limit=2").choose_k(_view(1)) == 2
    source = policy_source("halfway")
    assert source is not None and source["entry_point"] == "halfway"
    with pytest.raises(
        InputError, match=r"unknown policy 'nothing'.*installed \(dsd.policies\): halfway"
    ):
        _build("nothing")
    sys.modules.pop("eppols", None)


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("{dir}/nosuch.py:Half", "nosuch.py: no such file"),
        ("{file}:Nope", "defines no 'Nope' (policies there: Half, Keywords, Limited"),
        ("{file}:NoObserve", "NoObserve is not a K policy (no observe method)"),
        ("{file}:NOT_A_CLASS", "not a class or a factory (int)"),
        ("{dir}/broken.py:Half", "syntax error in {dir}/broken.py line 1"),
        ("{dir}/raising.py:Half", "importing {dir}/raising.py failed: ZeroDivisionError"),
        ("{file}:NeedsMore", "__init__ needs 'table'"),
        ("{file}:9lives", "got class name '9lives'"),
        ("{dir}:Half", "is a folder"),
        ("no_such_package.module:Half", "no module named 'no_such_package'"),
        ("object:Gone#99", "no such policy object in this process"),
        ("bad\x00name.py:Half", "not a valid path"),
    ],
)
def test_bad_specs_are_one_line_errors(policies: Path, spec: str, fragment: str) -> None:
    (policies.parent / "broken.py").write_text("class Half(:\n")
    (policies.parent / "raising.py").write_text("x = 1 / 0\n")
    names = {"dir": str(policies.parent), "file": str(policies)}
    with pytest.raises(InputError) as caught:
        _build(spec.format(**names))
    message = str(caught.value)
    assert fragment.format(**names) in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("5", "choose_k returned K=5 at step 0 (B=3, k_max=4); K must be in 0..4"),
        ("-1", "choose_k returned K=-1"),
        ("[1, 2]", "returned 2 K at step 0 (B=3, k_max=4) for 3 decode rows"),
        ("[0, 9, 0]", "choose_k returned K=9"),
        ("1.5", "returned float"),
        ("True", "returned True"),
        ("None", "returned NoneType"),
    ],
)
def test_the_contract_is_checked_at_run_time(policies: Path, value: str, fragment: str) -> None:
    policy = parse_policy(f"{policies}:Returns", profile=None, k_max=4, max_num_seqs=8)
    policy.inner.value = eval(value)  # type: ignore[attr-defined]
    with pytest.raises(InputError, match=r"mypolicies\.py:Returns") as caught:
        policy.choose_k(_view(3))
    assert fragment in str(caught.value)


def test_errors_in_the_users_code_name_the_file_class_and_line(policies: Path) -> None:
    policy = _build(f"{policies}:Raises")
    with pytest.raises(
        InputError,
        match=r"Raises: choose_k raised ZeroDivisionError: .*mypolicies.py:\d+\) at step 0",
    ):
        policy.choose_k(_view(1))
    feedback = StepFeedback(
        step_index=4,
        time_s=0.0,
        batch_size=1,
        req_ids=np.zeros(1, dtype=np.int64),
        num_spec_tokens=np.zeros(1, dtype=np.int64),
        num_accepted=np.zeros(1, dtype=np.int64),
        duration_s=0.01,
    )
    with pytest.raises(
        InputError, match=r"observe raised RuntimeError: nothing to learn .* after step 4"
    ):
        policy.observe(feedback)


@given(
    k_max=st.integers(0, 6),
    rows=st.integers(0, 5),
    answer=st.one_of(
        st.integers(-3, 9),
        st.lists(st.integers(-3, 9), min_size=0, max_size=6),
    ),
)
def test_checked_k_accepts_exactly_the_contract(k_max: int, rows: int, answer: object) -> None:
    view = StepView(
        step_index=0,
        time_s=0.0,
        batch_size=rows,
        num_decode_reqs=rows,
        req_ids=np.arange(rows, dtype=np.int64),
        context_lens=np.zeros(rows, dtype=np.int64),
        k_max=k_max,
    )
    if isinstance(answer, int):
        valid = 0 <= answer <= k_max
    else:
        assert isinstance(answer, list)
        valid = len(answer) == rows and all(0 <= k <= k_max for k in answer)
    if valid:  # a list or an array alike
        assert np.array_equal(checked_k(answer, view, "p"), np.array(answer, dtype=np.int64))
        if isinstance(answer, list):
            array = np.array(answer, dtype=np.int64)
            assert np.array_equal(checked_k(array, view, "p"), array)
    else:
        with pytest.raises(InputError):
            checked_k(answer, view, "p")


def test_a_learning_policy_does_not_compile_to_a_range_table(policies: Path) -> None:
    with pytest.raises(InputError, match="declares K depends on the batch size alone"):
        compile_batch_size_table(_build(f"{policies}:Keywords"), 4, 8, "mine")


def test_the_source_records_path_class_and_sha256(policies: Path) -> None:
    source = policy_source(f"{policies}:Half")
    assert source == {
        "spec": f"{policies}:Half",
        "kind": "file",
        "path": str(policies.resolve()),
        "class": "Half",
        "sha256": hashlib.sha256(policies.read_bytes()).hexdigest(),
    }
    assert policy_source(f"hysteresis:{policies}:Half:margin=0.1") == {**source}
    assert policy_source("static:2") is None


def test_a_relative_file_is_made_absolute_for_other_processes(
    policies: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(policies.parent)
    assert policy_spec("mypolicies.py:Half:k=1") == f"{policies.resolve()}:Half:k=1"
    assert policy_spec("static:2") == "static:2"
    assert policy_spec("hysteresis:goodput") == "hysteresis:goodput"
    assert policy_spec("hysteresis:mypolicies.py:Half:margin=0.2") == (
        f"hysteresis:{policies.resolve()}:Half:margin=0.2"
    )
    wrapped = parse_policy(
        policy_spec("hysteresis:mypolicies.py:Half:margin=0.2"),
        profile=None,
        k_max=4,
        max_num_seqs=8,
    )
    assert wrapped.choose_k(_view(2)) == 2


class _Counting:
    """Learns a count: a run must get a fresh copy, so two runs give the same result."""

    def __init__(self) -> None:
        self.steps = 0

    def choose_k(self, view: StepView) -> int:
        self.steps += 1
        return min(self.steps % 3, view.k_max)

    def observe(self, feedback: StepFeedback) -> None:
        pass


def test_the_python_api_takes_an_instance_a_class_or_a_factory() -> None:
    runs = [
        dsd.simulate(
            profile=str(H100), policy=policy, max_concurrency=2, num_prompts=4, output_len=16
        )
        for policy in (_Counting(), _Counting, lambda k_max: _Counting())
    ]
    instance = _Counting()
    again = [
        dsd.simulate(
            profile=str(H100), policy=instance, max_concurrency=2, num_prompts=4, output_len=16
        )
        for _ in range(2)
    ]
    assert instance.steps == 0  # the runs used copies
    tpot = {run.metrics["mean_tpot_ms"] for run in runs + again}
    assert len(tpot) == 1
    assert runs[0].metrics["policy"].startswith("object:_Counting#")
    assert runs[0].metrics["policy_source"]["class"] == "_Counting"
    with pytest.raises(InputError, match="give a SPEC string, a KPolicy instance or a factory"):
        dsd.simulate(profile=str(H100), policy=3, max_concurrency=2, num_prompts=4)


def test_the_example_file_runs_and_exports() -> None:
    spec = f"{EXAMPLE}:BatchCutoff:cutoff=4,k_above=0"
    assert dsd.export_vllm(str(H100), max_num_seqs=8, policy=spec) == {
        "num_speculative_tokens": 5,
        "num_speculative_tokens_per_batch_size": [[1, 3, 5], [4, 8, 0]],
    }
    with pytest.raises(InputError, match="EpsilonGreedy: only a policy that declares"):
        dsd.export_vllm(str(H100), max_num_seqs=8, policy=f"{EXAMPLE}:EpsilonGreedy")
    first, second = (
        dsd.simulate(
            profile=str(H100),
            policy=f"{EXAMPLE}:EpsilonGreedy",
            max_concurrency=4,
            num_prompts=8,
            output_len=16,
        )
        for _ in range(2)
    )
    assert first.metrics["k_histogram"] == second.metrics["k_histogram"]
    assert len(first.metrics["k_histogram"]) > 1  # it explores


def test_the_docs_show_the_example_file_as_it_is() -> None:
    docs = (REPO / "docs" / "policies.md").read_text(encoding="utf-8")
    assert f"```python\n{EXAMPLE.read_text(encoding='utf-8')}```" in docs
