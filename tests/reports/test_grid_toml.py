"""TOML sweep grids: expansion in the documented order, seeds per load point, and one-line
InputErrors naming the key for every malformed grid."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from dsd.common.errors import InputError
from dsd.reports.grid import expand_grid, load_grid
from dsd.reports.sweep import cell_seed, load_seed

REPO = Path(__file__).resolve().parents[2]
H100 = REPO / "policies" / "profiles" / "pr32374_llama31_8b_eagle_h100.json"
HEAD = f'profile = "{H100}"\npolicies = ["static:0", "goodput"]\n'


def _cells(tmp_path: Path, text: str) -> list:
    path = tmp_path / "grid.toml"
    path.write_text(text)
    return expand_grid(load_grid(path))


def _key(cell) -> tuple:
    labels = dict(cell.labels)
    return (
        labels["workload"],
        cell.config.scheduling,
        cell.max_concurrency,
        cell.config.request_rate,
        cell.sweep_seed,
        cell.policy,
    )


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        # closed loop, policies innermost
        (
            "max_concurrency = [4, 1]\n",
            [
                ("mt-bench", "sync", 4, math.inf, 0, "static:0"),
                ("mt-bench", "sync", 4, math.inf, 0, "goodput"),
                ("mt-bench", "sync", 1, math.inf, 0, "static:0"),
                ("mt-bench", "sync", 1, math.inf, 0, "goodput"),
            ],
        ),
        # seeds inside the load point, scheduling outside it
        (
            'max_concurrency = 2\nseeds = [5, 6]\nscheduling = ["async", "sync"]\n',
            [
                ("mt-bench", m, 2, math.inf, s, p)
                for m in ("async", "sync")
                for s in (5, 6)
                for p in ("static:0", "goodput")
            ],
        ),
        # two workloads; the second has its own open-loop rates and no cap
        (
            'max_concurrency = [1]\n[[workloads]]\nname = "a"\n'
            '[[workloads]]\nname = "b"\ndataset = "random"\nnum_prompts = 10\n'
            'request_rate = [2.0, "inf"]\nmax_concurrency = [3]\n',
            [
                ("a", "sync", 1, math.inf, 0, "static:0"),
                ("a", "sync", 1, math.inf, 0, "goodput"),
                ("b", "sync", 3, 2.0, 0, "static:0"),
                ("b", "sync", 3, 2.0, 0, "goodput"),
                ("b", "sync", 3, math.inf, 0, "static:0"),
                ("b", "sync", 3, math.inf, 0, "goodput"),
            ],
        ),
    ],
)
def test_grid_expands_in_the_documented_order(tmp_path: Path, body: str, expected: list) -> None:
    cells = _cells(tmp_path, HEAD + body)
    assert [_key(c) for c in cells] == expected
    assert [c.index for c in cells] == list(range(len(cells)))


def test_swept_config_fields_expand_outside_the_load_points_and_fixed_ones_apply(
    tmp_path: Path,
) -> None:
    body = (
        "max_concurrency = [1, 2]\n[config]\nhost_overhead_ms = 0.25\n"
        'latency_model = ["table", "parametric"]\n'
    )
    cells = _cells(tmp_path, HEAD + body)
    assert [(c.config.latency_model, c.max_concurrency, c.policy) for c in cells] == [
        (m, c, p) for m in ("table", "parametric") for c in (1, 2) for p in ("static:0", "goodput")
    ]
    assert {c.config.host_overhead_ms for c in cells} == {0.25}
    assert dict(cells[0].labels)["latency_model"] == "table"


def test_category_acceptance_is_a_fixed_table_of_tag_rates(tmp_path: Path) -> None:
    body = (
        "max_concurrency = [1, 2]\n[config.category_acceptance]\n"
        "math = [0.6, 0.36]\nstem = [0.5, 0, 0.0]\n"
    )
    cells = _cells(tmp_path, HEAD + body)
    assert len(cells) == 4  # a table, not an axis
    expected = (("math", (0.6, 0.36)), ("stem", (0.5, 0, 0.0)))
    assert {c.config.category_acceptance for c in cells} == {expected}


def test_prompts_and_seeds_follow_the_load_point(tmp_path: Path) -> None:
    cells = _cells(tmp_path, HEAD + "max_concurrency = [1, 8]\nnum_prompts_per_concurrency = 3\n")
    assert [c.config.num_prompts for c in cells] == [3, 3, 24, 24]
    assert [c.config.seed for c in cells] == [cell_seed(0, 1)] * 2 + [cell_seed(0, 8)] * 2
    assert load_seed(0, 8, 2.0) != load_seed(0, 8, 3.0) != cell_seed(0, 8)


def test_relative_profile_paths_are_taken_from_the_grid_folder(tmp_path: Path) -> None:
    grid = load_grid(REPO / "examples" / "grid.toml")
    assert grid.profiles == (str(H100.resolve()),)
    assert len(expand_grid(grid)) == 4 * 3 + 4 * 2  # the shipped example: 20 cells


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (HEAD + "max_concurrency = [1]\nbogus = 1\n", "bogus: unknown key"),  # top-level typo
        (HEAD + "max_concurrency = []\n", "max_concurrency: empty list"),  # empty axis
        (HEAD + "max_concurrency = [1]\nseeds = []\n", "seeds: empty list"),  # empty seeds
        (HEAD + 'max_concurrency = ["4"]\n', "max_concurrency: expected integers >= 1"),  # type
        (HEAD + "max_concurrency = [0]\n", "max_concurrency: expected integers >= 1"),  # range
        (HEAD + "max_concurrency = [2, 2]\n", "max_concurrency: duplicate value 2"),  # repeat
        (HEAD + "max_concurrency = [1]\nrequest_rate = [-1.0]\n", "request_rate: expected"),
        (HEAD + 'max_concurrency = [1]\nscheduling = ["later"]\n', "scheduling: expected"),
        (f'profile = "{H100}"\nmax_concurrency = [1]\n', "policies: missing"),  # required key
        ('policies = ["goodput"]\nmax_concurrency = [1]\n', "profile: missing"),  # required key
        ('profile = "nope.json"\npolicies = ["goodput"]\n', "profile: nope.json: no such file"),
        (HEAD + "policies = []\n", "invalid TOML"),  # the same key twice is a TOML error
        (
            HEAD + "max_concurrency = [1]\n[config]\nmax_num_seq = 4\n",
            "config.max_num_seq: unknown",
        ),
        (HEAD + 'max_concurrency = [1]\n[config]\npolicy = "x"\n', "config.policy: unknown"),
        (HEAD + 'max_concurrency = [1]\n[config]\nmax_num_seqs = "8"\n', "max_num_seqs: must be"),
        (
            HEAD + "max_concurrency = [1]\n[config]\nlatency_model = []\n",
            "config.latency_model: empty",
        ),
        (
            HEAD + 'max_concurrency = [1]\n[[workloads]]\ndatset = "x"\n',
            "workloads[0].datset: unknown",
        ),
        (
            HEAD + "max_concurrency = [1]\n[[workloads]]\nrandom_lengths = 3\n",
            "random_lengths: expected a table",
        ),
        (
            HEAD + "max_concurrency = [1]\n[[workloads]]\nrandom_lengths = { input = 3 }\n",
            "random_lengths.input: unknown",
        ),
        (
            HEAD + '[[workloads]]\ndataset = "random"\nnum_prompts = 4\n',
            "request_rate inf without max_concurrency",
        ),
        (HEAD + "max_concurrency = [1]\nworkloads = 3\n", "workloads: expected an array"),
        (
            HEAD + "max_concurrency = [1]\n[config]\ncategory_acceptance = [[0.5]]\n",
            "config.category_acceptance: expected a table of tag = [rates]",
        ),
        (
            HEAD + "max_concurrency = [1]\n[config.category_acceptance]\nmath = [1.5]\n",
            "config.category_acceptance[0]: rates",
        ),
        (
            HEAD + "max_concurrency = [1]\n[config.category_acceptance]\nmath = 0.5\n",
            "rates must be a non-empty tuple",
        ),
        (
            HEAD + 'max_concurrency = [1]\n[[workloads]]\nname = "a"\n[[workloads]]\nname = "a"\n',
            "duplicate value 'a'",
        ),
        (
            HEAD + "max_concurrency = [1]\nnum_prompts = 3\nnum_prompts_per_concurrency = 2\n",
            "give num_prompts or",
        ),
    ],
)
def test_bad_grids_raise_one_line_input_errors_naming_the_key(
    tmp_path: Path, text: str, message: str
) -> None:
    path = tmp_path / "grid.toml"
    path.write_text(text)
    with pytest.raises(InputError) as caught:
        expand_grid(load_grid(path))
    text_of_error = str(caught.value)
    assert "\n" not in text_of_error and text_of_error.startswith(str(path)), text_of_error
    assert message in text_of_error, text_of_error


def test_a_users_policy_file_is_relative_to_the_grid_and_checked(tmp_path: Path) -> None:
    policies = tmp_path / "mine"
    policies.mkdir()
    (policies / "half.py").write_text(
        "class Half:\n"
        "    def choose_k(self, view):\n"
        "        return view.k_max // 2\n\n"
        "    def observe(self, feedback):\n"
        "        pass\n"
    )
    grid = (
        f'profile = "{H100}"\npolicies = ["mine/half.py:Half", "static:0"]\nmax_concurrency = [1]\n'
    )
    cells = _cells(tmp_path, grid)
    assert [cell.policy for cell in cells] == [f"{policies / 'half.py'}:Half", "static:0"]
    path = tmp_path / "grid.toml"
    path.write_text(grid.replace('Half"', 'Halve"'))
    with pytest.raises(
        InputError, match=r"grid.toml: policies: policy .*half.py:Halve: .*no 'Halve'"
    ):
        load_grid(path)
