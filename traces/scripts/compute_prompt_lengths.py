"""Regenerate traces/data/prompt_lengths.json: token lengths of every shipped prompt set.

Tokenizer: SmolLM2's (backend/data/tokenizer/tokenizer.json) through the `tokenizers` package.
For each prompt two lengths are stored: the raw first-turn text, and the text rendered with the
tokenizer's chat template (`chat_template.jinja`, one user message, generation prompt added),
which is what `vllm bench serve` sends by default. SmolLM2's tokenizer adds no special tokens
on encode, so both counts are plain `len(encode(text).ids)`.

Sets with reference answers (`PROMPT_SET_REFERENCE_READERS`, e.g. instructcoder) also store
`output_len`, the token count of each prompt's reference answer (the request's default
max_tokens), and `references_sha256`, the fingerprint of those answers. The other sets' entries
have neither key, so their entries are exactly what they were before the keys existed.

Run:  python traces/scripts/compute_prompt_lengths.py [--check]
--check compares with the shipped file instead of writing it (exit 1 on a difference).
This script needs `tokenizers` and `jinja2`; nothing at run time does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO_ROOT))

from dsd.common import strict_json  # noqa: E402
from dsd.traces.datasets import (  # noqa: E402
    PROMPT_LENGTHS_PATH,
    PROMPT_SET_NAMES,
    PROMPT_SET_READERS,
    PROMPT_SET_REFERENCE_READERS,
    texts_sha256,
)

TOKENIZER_DIR = REPO_ROOT / "backend" / "data" / "tokenizer"


def render_chat(template_text: str, text: str) -> str:
    """The prompt as vLLM bench sends it: one user turn, generation prompt added."""
    import jinja2

    template = jinja2.Environment(autoescape=False).from_string(template_text)  # noqa: S701
    return template.render(messages=[{"role": "user", "content": text}], add_generation_prompt=True)


def compute_lengths() -> dict[str, object]:
    """The whole JSON document: tokenizer provenance and per-set lengths in file order."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json"))
    template_text = (TOKENIZER_DIR / "chat_template.jinja").read_text(encoding="utf-8")
    datasets: dict[str, object] = {}
    for name in PROMPT_SET_NAMES:
        texts = [text for text, _ in PROMPT_SET_READERS[name]()]
        raw = tokenizer.encode_batch(texts, add_special_tokens=True)
        chat = tokenizer.encode_batch(
            [render_chat(template_text, text) for text in texts], add_special_tokens=True
        )
        entry: dict[str, object] = {
            "num_prompts": len(texts),
            "texts_sha256": texts_sha256(texts),
            "raw_len": [len(encoding.ids) for encoding in raw],
            "chat_len": [len(encoding.ids) for encoding in chat],
        }
        if name in PROMPT_SET_REFERENCE_READERS:
            references = PROMPT_SET_REFERENCE_READERS[name]()
            answers = tokenizer.encode_batch(references, add_special_tokens=True)
            entry["references_sha256"] = texts_sha256(references)
            entry["output_len"] = [len(encoding.ids) for encoding in answers]
        datasets[name] = entry
    return {
        "tokenizer": "SmolLM2-135M-Instruct tokenizer.json (backend/data/tokenizer), 49,152 tokens",
        "raw_len": "tokens of the first-turn text alone",
        "chat_len": "tokens of the text in chat_template.jinja, one user turn, generation prompt",
        "output_len": "sets with reference answers only: tokens of each prompt's reference answer "
        "(references_sha256 fingerprints them), the request's default max_tokens",
        "generated_by": "traces/scripts/compute_prompt_lengths.py",
        "datasets": datasets,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args()
    document = compute_lengths()
    if args.check:
        shipped = json.loads(PROMPT_LENGTHS_PATH.read_text(encoding="utf-8"))
        if shipped != document:
            print(f"{PROMPT_LENGTHS_PATH} is stale", file=sys.stderr)
            return 1
        print(f"{PROMPT_LENGTHS_PATH} is up to date")
        return 0
    fd, tmp_name = tempfile.mkstemp(dir=PROMPT_LENGTHS_PATH.parent, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as out:
        out.write(strict_json.dumps(document, separators=(",", ":")))
        out.write("\n")
    os.chmod(tmp_name, 0o644)  # mkstemp makes 0600; the shipped file is world-readable
    os.replace(tmp_name, PROMPT_LENGTHS_PATH)
    print(f"wrote {PROMPT_LENGTHS_PATH}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
