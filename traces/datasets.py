"""Prompt sets (MT-Bench, Spec-Bench, HumanEval, GSM8K, EAGLE, InstructCoder) and vLLM's `random`.

Prompt lengths are SmolLM2 tokens precomputed into `traces/data/prompt_lengths.json` (raw and
chat-templated; the templated one by default, as vLLM bench counts it), so the run-time path
needs no tokenizer. Output lengths, cycling to `num_prompts`, and the `random` set's vLLM
semantics are in docs/workloads.md.

It does not make arrival times (traces.arrivals) and does not tokenize.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np

from dsd.common.errors import InputError
from dsd.traces.workload import RequestSpec, Workload, prompt_key

DATA_DIR = Path(__file__).resolve().parent / "data"
PROMPTS_DIR = DATA_DIR / "prompts"
PROMPT_LENGTHS_PATH = DATA_DIR / "prompt_lengths.json"

# Output tokens per request when none is given: vLLM bench's 256 for MT-Bench and Spec-Bench
# (the average used in vLLM's SD benchmarks); we use the same for the other sets so results
# across sets differ only in the prompts.
DEFAULT_OUTPUT_LEN = 256


@dataclass(frozen=True, slots=True)
class PromptRecord:
    """One prompt of a prompt set."""

    text: str  # first-turn prompt text, raw (no chat template)
    tag: str  # category, e.g. MT-Bench "coding"; RequestSpec.tag
    raw_len: int  # tokens of `text` alone (SmolLM2 tokenizer), >= 1
    chat_len: int  # tokens of `text` in the chat template with the generation prompt, >= raw_len
    # tokens of the set's reference answer to this prompt, the request's default max_tokens;
    # None where the set has no references (DEFAULT_OUTPUT_LEN then)
    output_len: int | None = None


def _jsonl_rows(path: Path) -> Iterator[tuple[int, dict[str, object]]]:
    """(line number, object) for every non-blank line of a JSONL (optionally .gz) file."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as lines:
        for line_no, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise InputError(f"{path.name}: line {line_no}: invalid JSON ({exc.msg})") from None
            if not isinstance(row, dict):
                raise InputError(f"{path.name}: line {line_no}: expected a JSON object")
            yield line_no, row


def _turns_reader(file_name: str) -> Callable[[], list[tuple[str, str]]]:
    """Reader for FastChat-style question files: first turn, `category` as tag."""

    def read() -> list[tuple[str, str]]:
        path = PROMPTS_DIR / file_name
        items = []
        for line_no, row in _jsonl_rows(path):
            turns = row.get("turns")
            if not isinstance(turns, list) or not turns or not isinstance(turns[0], str):
                raise InputError(f"{path.name}: line {line_no}: 'turns' must be a list of text")
            items.append((turns[0], str(row.get("category", "none"))))
        return items

    return read


def _field_reader(file_name: str, field: str, tag: str) -> Callable[[], list[tuple[str, str]]]:
    """Reader for files with the prompt in one text field and one tag for the whole set."""

    def read() -> list[tuple[str, str]]:
        path = PROMPTS_DIR / file_name
        items = []
        for line_no, row in _jsonl_rows(path):
            text = row.get(field)
            if not isinstance(text, str) or not text:
                raise InputError(f"{path.name}: line {line_no}: '{field}' must be non-empty text")
            items.append((text, tag))
        return items

    return read


def render_edit_prompt(instruction: str, code: str) -> str:
    """A code-edit task as one user turn: the instruction, a blank line, the code fenced.

    The fence (```python: every InstructCoder input is Python) marks exactly where the code
    starts and ends, as a user pasting code into a chat does, so the instruction cannot run into
    the code and the model sees the code verbatim (the n-grams its edited copy will repeat).
    Surrounding whitespace of the instruction and trailing whitespace of the code are dropped
    (some instructions end in a space, some inputs in a newline); leading indentation is kept.
    """
    return f"{instruction.strip()}\n\n```python\n{code.rstrip()}\n```"


def _edit_rows(file_name: str) -> list[tuple[str, str]]:
    """(rendered prompt, reference output) of every InstructCoder-style edit task in file order."""
    path = PROMPTS_DIR / file_name
    rows = []
    for line_no, row in _jsonl_rows(path):
        fields = {}
        for field in ("instruction", "input", "output"):
            value = row.get(field)
            if not isinstance(value, str) or not value.strip():
                raise InputError(f"{path.name}: line {line_no}: '{field}' must be non-empty text")
            fields[field] = value
        rows.append((render_edit_prompt(fields["instruction"], fields["input"]), fields["output"]))
    return rows


def _edit_reader(file_name: str, tag: str) -> Callable[[], list[tuple[str, str]]]:
    """Reader for code-edit files (instruction + input code, see render_edit_prompt)."""

    def read() -> list[tuple[str, str]]:
        return [(prompt, tag) for prompt, _ in _edit_rows(file_name)]

    return read


def _edit_reference_reader(file_name: str) -> Callable[[], list[str]]:
    """Reference outputs of a code-edit file, one per prompt of `_edit_reader`, in file order."""

    def read() -> list[str]:
        return [reference for _, reference in _edit_rows(file_name)]

    return read


# name -> reader of (first-turn text, tag) in file order. A plain dict is the registry.
PROMPT_SET_READERS: dict[str, Callable[[], list[tuple[str, str]]]] = {
    "mt-bench": _turns_reader("mt_bench_question.jsonl"),
    "spec-bench": _turns_reader("spec_bench_question.jsonl"),
    "humaneval": _field_reader("HumanEval.jsonl.gz", "prompt", "code"),
    "gsm8k": _field_reader("gsm8k_test.jsonl", "question", "math"),
    "eagle-gsm8k": _turns_reader("eagle_gsm8k_question.jsonl"),
    "eagle-humaneval": _turns_reader("eagle_humaneval_question.jsonl"),
    "eagle-qa": _turns_reader("eagle_qa_question.jsonl"),
    "eagle-sum": _turns_reader("eagle_sum_question.jsonl"),
    # the file's only per-task metadata is the author's initials, so one tag for the whole set
    "instructcoder": _edit_reader("instructcoder_edit_eval.jsonl", "code-edit"),
}
PROMPT_SET_NAMES: tuple[str, ...] = tuple(PROMPT_SET_READERS)

# name -> reader of reference answers, one per prompt in the same order, for the sets whose
# requests default to their reference's token count as output length (stored as `output_len`).
PROMPT_SET_REFERENCE_READERS: dict[str, Callable[[], list[str]]] = {
    "instructcoder": _edit_reference_reader("instructcoder_edit_eval.jsonl"),
}


def texts_sha256(texts: list[str]) -> str:
    """Fingerprint of a prompt set's texts, stored with the lengths to catch stale data."""
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8"))
        digest.update(b"\x00")
    return digest.hexdigest()


@cache
def _shipped_lengths() -> dict[str, object]:
    try:
        loaded = json.loads(PROMPT_LENGTHS_PATH.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(
            f"{PROMPT_LENGTHS_PATH.name}: missing; run traces/scripts/compute_prompt_lengths.py"
        ) from None
    if not isinstance(loaded, dict):
        raise InputError(f"{PROMPT_LENGTHS_PATH.name}: expected a JSON object")
    return loaded


@cache
def load_prompt_set(name: str) -> tuple[PromptRecord, ...]:
    """Every prompt of a named set in file order, with its shipped token lengths."""
    if name not in PROMPT_SET_READERS:
        known = ", ".join(PROMPT_SET_NAMES)
        raise InputError(f"unknown prompt set {name!r}; known: {known}")
    items = PROMPT_SET_READERS[name]()
    datasets = _shipped_lengths().get("datasets")
    entry = datasets.get(name) if isinstance(datasets, dict) else None
    if not isinstance(entry, dict):
        raise InputError(f"{PROMPT_LENGTHS_PATH.name}: no lengths for {name!r}")
    raw_lens, chat_lens = entry.get("raw_len"), entry.get("chat_len")
    if (
        not isinstance(raw_lens, list)
        or not isinstance(chat_lens, list)
        or len(raw_lens) != len(items)
        or len(chat_lens) != len(items)
        or entry.get("texts_sha256") != texts_sha256([text for text, _ in items])
    ):
        raise InputError(
            f"{PROMPT_LENGTHS_PATH.name}: lengths for {name!r} do not match the prompt file; "
            "run traces/scripts/compute_prompt_lengths.py"
        )
    output_lens: list[int | None] = [None] * len(items)
    if name in PROMPT_SET_REFERENCE_READERS:
        references = PROMPT_SET_REFERENCE_READERS[name]()
        stored = entry.get("output_len")
        if (
            not isinstance(stored, list)
            or len(stored) != len(items)
            or len(references) != len(items)
            or entry.get("references_sha256") != texts_sha256(references)
        ):
            raise InputError(
                f"{PROMPT_LENGTHS_PATH.name}: output lengths for {name!r} do not match the "
                "reference answers; run traces/scripts/compute_prompt_lengths.py"
            )
        output_lens = [int(length) for length in stored]
    return tuple(
        PromptRecord(text=text, tag=tag, raw_len=int(raw), chat_len=int(chat), output_len=out)
        for (text, tag), raw, chat, out in zip(items, raw_lens, chat_lens, output_lens, strict=True)
    )


def _check_count(field: str, value: int | None, minimum: int) -> None:
    if value is not None and value < minimum:
        raise InputError(f"{field}: must be >= {minimum}, got {value}")


def prompt_set_workload(
    name: str,
    *,
    num_prompts: int | None = None,
    output_len: int | None = None,
    chat_template: bool = True,
    shuffle: bool = False,
    rng: np.random.Generator | None = None,
    exclude_keys: Collection[str] = (),
) -> Workload:
    """Requests from a named prompt set, all arriving at 0 (see traces.arrivals to re-time).

    num_prompts: requests to make; None takes each prompt once. Cycles the set when larger.
    output_len: max_tokens of every request; None is each prompt's reference length in sets
        with references (instructcoder), else DEFAULT_OUTPUT_LEN (256).
    chat_template: prompt_len counts the chat-templated prompt (vLLM bench default) or raw text.
    shuffle: permute the set with `rng` before taking/cycling (rng required then).
    exclude_keys: `prompt_key`s of prompts to leave out before taking (a profile's acceptance
        prompts, so a run predicts prompts the profile never saw); InputError when none is left.
    """
    _check_count("num_prompts", num_prompts, 1)
    _check_count("output_len", output_len, 1)
    records = load_prompt_set(name)
    if exclude_keys:
        excluded = frozenset(exclude_keys)
        records = tuple(record for record in records if prompt_key(record.text) not in excluded)
        if not records:
            raise InputError(f"held_out_prompts: every prompt of {name} was profiled")
    order = np.arange(len(records))  # [size]
    if shuffle:
        if rng is None:
            raise InputError("shuffle: needs a seed")
        order = rng.permutation(len(records))  # [size]
    count = len(records) if num_prompts is None else num_prompts
    requests = []
    for index in range(count):
        record = records[int(order[index % len(records)])]
        if output_len is not None:
            max_tokens = output_len
        elif record.output_len is not None:
            max_tokens = record.output_len
        else:
            max_tokens = DEFAULT_OUTPUT_LEN
        requests.append(
            RequestSpec(
                prompt_len=record.chat_len if chat_template else record.raw_len,
                output_len=max_tokens,
                tag=record.tag,
                prompt=record.text,
            )
        )
    return Workload(name=name, requests=tuple(requests))


@dataclass(frozen=True)
class RandomLengths:
    """vLLM bench's `random` dataset length knobs."""

    input_len: int = 1024  # --random-input-len: mean prompt tokens, >= 1
    output_len: int = 128  # --random-output-len: mean output tokens, >= 1
    range_ratio: float = 0.0  # --random-range-ratio r in [0, 1): lengths in [L(1-r), L(1+r)]

    def __post_init__(self) -> None:
        if self.input_len < 1:
            raise InputError(f"random_input_len: must be >= 1, got {self.input_len}")
        if self.output_len < 1:
            raise InputError(f"random_output_len: must be >= 1, got {self.output_len}")
        if not 0.0 <= self.range_ratio < 1.0:
            raise InputError(f"random_range_ratio: must be in [0, 1), got {self.range_ratio}")
        if math.floor(self.input_len * (1 - self.range_ratio)) < 1:
            raise InputError(
                f"random_input_len: {self.input_len} with range ratio {self.range_ratio} "
                "allows prompts of 0 tokens"
            )

    def input_bounds(self) -> tuple[int, int]:
        """Inclusive [low, high] of prompt lengths."""
        return (
            math.floor(self.input_len * (1 - self.range_ratio)),
            math.ceil(self.input_len * (1 + self.range_ratio)),
        )

    def output_bounds(self) -> tuple[int, int]:
        """Inclusive [low, high] of output lengths; never below 1 token."""
        return (
            max(1, math.floor(self.output_len * (1 - self.range_ratio))),
            max(1, math.ceil(self.output_len * (1 + self.range_ratio))),
        )


def random_workload(
    num_prompts: int, lengths: RandomLengths, *, rng: np.random.Generator
) -> Workload:
    """`num_prompts` requests with uniform integer lengths, all arriving at 0, no prompt text."""
    _check_count("num_prompts", num_prompts, 1)
    input_low, input_high = lengths.input_bounds()
    output_low, output_high = lengths.output_bounds()
    # One (prompt, output) pair per request, in request order: request i's lengths are the
    # stream's i-th pair, the same whatever num_prompts is (common random numbers).
    lengths_drawn = rng.integers(
        [input_low, output_low], [input_high + 1, output_high + 1], size=(num_prompts, 2)
    )  # [N, 2]
    requests = tuple(
        RequestSpec(prompt_len=int(prompt_len), output_len=int(output_len), tag="random")
        for prompt_len, output_len in lengths_drawn.tolist()
    )
    return Workload(name="random", requests=requests)
