"""Tokenizers for real text: SmolLM2's BPE tokenizer, a byte-level tokenizer, and the chat template.

- `smollm2`: the tokenizer of SmolLM2-135M-Instruct (49,152 tokens) from the bundled
  backend/data/tokenizer/tokenizer.json, run by the `tokenizers` package. Models trained with it
  share SmolLM2's vocabulary, so SmolLM2 can be their target or teacher.
- `bytes`: 256 byte tokens plus the three ChatML specials; for small models trained from scratch.

The chat template is SmolLM2's ChatML (backend/data/tokenizer/chat_template.jinja), rendered by
hand: `<|im_start|>{role}\\n{content}<|im_end|>\\n` per message, SmolLM's default system message
when the first message is not a system one, and `<|im_start|>assistant\\n` as generation prompt.

This module does not know about models or generation; it maps text to ids and back.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from dsd.common.errors import InputError

TOKENIZER_DIR = Path(__file__).resolve().parent / "data" / "tokenizer"
TokenizerName = Literal["smollm2", "bytes"]
TOKENIZER_NAMES: tuple[str, ...] = ("smollm2", "bytes")

# ChatML specials, in SmolLM2's id order (0, 1, 2)
END_OF_TEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS: tuple[str, ...] = (END_OF_TEXT, IM_START, IM_END)
DEFAULT_SYSTEM_MESSAGE = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


class TextTokenizer(Protocol):
    """What generation and training need from a tokenizer."""

    name: str  # registry name ("smollm2", "bytes")
    vocab_size: int  # number of ids, specials included
    stop_ids: tuple[int, ...]  # ids that end a generated reply (<|im_end|>, <|endoftext|>)
    end_of_text_id: int  # id placed between documents when training

    def encode(self, text: str) -> list[int]:
        """Ids of a text; special token strings in it become their special ids."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ids; special tokens are dropped."""
        ...


class SmolLM2Tokenizer:
    """SmolLM2's byte-level BPE tokenizer (bundled tokenizer.json)."""

    name = "smollm2"

    def __init__(self, path: Path = TOKENIZER_DIR / "tokenizer.json") -> None:
        from tokenizers import Tokenizer

        if not path.is_file():
            raise InputError(f"{path}: tokenizer file missing")
        self._tokenizer = Tokenizer.from_file(str(path))
        self.vocab_size = int(self._tokenizer.get_vocab_size(with_added_tokens=True))
        found = [self._tokenizer.token_to_id(token) for token in SPECIAL_TOKENS]
        ids = [int(token_id) for token_id in found if token_id is not None]
        if len(ids) != len(SPECIAL_TOKENS):
            raise InputError(f"{path}: tokenizer lacks the ChatML special tokens")
        self.end_of_text_id = ids[0]
        self.stop_ids: tuple[int, ...] = (ids[2], ids[0])

    def encode(self, text: str) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Ids of many texts at once (the tokenizers package runs them in parallel)."""
        encodings = self._tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [list(encoding.ids) for encoding in encodings]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tokenizer.decode(list(ids), skip_special_tokens=True))


_SPECIAL_SPLIT = re.compile("(" + "|".join(re.escape(token) for token in SPECIAL_TOKENS) + ")")


class ByteTokenizer:
    """UTF-8 bytes as ids 0..255, then <|endoftext|>=256, <|im_start|>=257, <|im_end|>=258."""

    name = "bytes"
    vocab_size: int = 256 + len(SPECIAL_TOKENS)
    end_of_text_id: int = 256
    stop_ids: tuple[int, ...] = (258, 256)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        for piece in _SPECIAL_SPLIT.split(text):
            if piece in SPECIAL_TOKENS:
                ids.append(256 + SPECIAL_TOKENS.index(piece))
            elif piece:
                ids.extend(piece.encode("utf-8"))
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")


def load_tokenizer(name: str) -> TextTokenizer:
    """A tokenizer by registry name."""
    if name == "smollm2":
        return SmolLM2Tokenizer()
    if name == "bytes":
        return ByteTokenizer()
    raise InputError(f"tokenizer: unknown name {name!r} (choose from {', '.join(TOKENIZER_NAMES)})")


@dataclass(frozen=True)
class ChatMessage:
    """One chat turn."""

    role: str  # "system", "user" or "assistant"
    content: str  # the text of the turn


def render_chat(messages: Sequence[ChatMessage], add_generation_prompt: bool = True) -> str:
    """SmolLM2's ChatML chat template as a string (what chat_template.jinja renders)."""
    parts: list[str] = []
    if messages and messages[0].role != "system":
        parts.append(f"{IM_START}system\n{DEFAULT_SYSTEM_MESSAGE}{IM_END}\n")
    for message in messages:
        parts.append(f"{IM_START}{message.role}\n{message.content}{IM_END}\n")
    if add_generation_prompt:
        parts.append(f"{IM_START}assistant\n")
    return "".join(parts)


def chat_prompt(user_text: str, system: str | None = None) -> str:
    """The rendered prompt of a single user turn (optionally with a system message)."""
    messages = [ChatMessage("system", system)] if system is not None else []
    messages.append(ChatMessage("user", user_text))
    return render_chat(messages)
