"""`dsd generate` and `dsd zoo train | distill-draft`: real text from real weights, and the zoo.

Wiring only: models come from backend.weights, generation from backend.generate, training and
evaluation from backend.zoo; this module parses flags, shows progress and prints results.
Checkpoints and train.json are written atomically by the backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from dsd.common.errors import InputError

zoo_app = typer.Typer(
    help="Train a target/draft pair, or distill a draft for a target, on offline corpora.",
    no_args_is_help=True,
)

Device = Annotated[str, typer.Option(help="cpu or cuda.")]
Seed = Annotated[int, typer.Option(help="Seed of init, data order and sampling.")]
Corpus = Annotated[str, typer.Option(help="Comma-separated: stdlib, prompts, shakespeare.")]
Steps = Annotated[int, typer.Option(help="Optimizer steps.")]
BatchSize = Annotated[int, typer.Option(help="Windows per step.")]
SeqLen = Annotated[int, typer.Option(help="Tokens per window.")]
Lr = Annotated[float, typer.Option(help="Peak AdamW learning rate.")]
Out = Annotated[Path, typer.Option(help="Output folder.")]
MaxMinutes = Annotated[float | None, typer.Option(help="Stop training after this wall time.")]
MaxCorpusChars = Annotated[
    int | None, typer.Option(help="Use at most this many corpus characters (quick runs).")
]
EvalWindows = Annotated[int, typer.Option(help="Held-out windows for the acceptance evaluation.")]
EvalK = Annotated[int, typer.Option(help="Positions of the reported acceptance rates.")]
DraftConfig = Annotated[
    str,
    typer.Option(help="Draft shape: a name (nano-/s-/m-draft, ...) or hidden=,layers=,heads=,ffn="),
]


def _device(device: str) -> str:
    if device not in ("cpu", "cuda"):
        raise InputError(f"--device must be cpu or cuda, got {device!r}")
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise InputError("--device cuda: CUDA is not available on this machine")
    return device


def generate(
    target: Annotated[
        str, typer.Option(help="smollm2-135m, a .gguf file, an HF folder or a zoo checkpoint.")
    ],
    prompt: Annotated[list[str], typer.Option(help="A prompt (repeat for several).")],
    draft: Annotated[
        str | None,
        typer.Option(help="Draft model (same vocabulary), or exit:N (target's first N layers)."),
    ] = None,
    k: Annotated[int, typer.Option(help="K: draft tokens per step.")] = 4,
    max_tokens: Annotated[int, typer.Option(help="Output tokens per prompt at most.")] = 64,
    temperature: Annotated[float, typer.Option(help="0 = greedy.")] = 0.0,
    chat: Annotated[
        bool, typer.Option("--chat/--raw", help="Wrap prompts in the chat template.")
    ] = True,
    device: Device = "cpu",
    dtype: Annotated[str, typer.Option(help="float32, bfloat16 or float16.")] = "float32",
    seed: Seed = 0,
) -> None:
    """Generate text for a few prompts (speculative decoding when --draft is given)."""
    import torch

    from dsd.backend.generate import GenerationConfig, generate_texts
    from dsd.backend.weights import load_model

    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    if dtype not in dtypes:
        raise InputError(f"--dtype must be one of {', '.join(dtypes)}, got {dtype!r}")
    config = GenerationConfig(
        max_tokens=max_tokens, temperature=temperature, num_spec_tokens=k, seed=seed, chat=chat
    )
    console = Console()
    with console.status("loading weights"):
        loaded = load_model(target, device=_device(device), dtype=dtypes[dtype])
    report = generate_texts(loaded, prompt, config, draft_spec=draft)
    for result in report.results:
        console.rule(f"[bold]{result.prompt}")
        console.print(result.text, markup=False, highlight=False)
    console.rule()
    tokens_per_s = report.num_output_tokens / report.elapsed_s if report.elapsed_s > 0 else 0.0
    line = (
        f"{report.num_output_tokens} output tokens in {report.elapsed_s:.2f} s "
        f"({tokens_per_s:.1f} tok/s)"
    )
    if draft is not None:
        rates = ", ".join(f"{rate:.2f}" for rate in report.per_position_rates)
        line += f"; K={k}, acceptance length {report.acceptance_length:.2f}, r_i = [{rates}]"
    console.print(line, highlight=False)


def _progress(total: int, label: str) -> tuple[Progress, Any]:
    progress = Progress(
        TextColumn(f"[bold]{label}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[losses]}"),
        TimeElapsedColumn(),
    )
    task = progress.add_task(label, total=total, losses="")
    return progress, task


def _acceptance_table(acceptance: dict[str, Any], title: str) -> Table:
    table = Table(title=title)
    table.add_column("position i")
    table.add_column("r_i", justify="right")
    table.add_column("AL(K=i)", justify="right")
    for index, rate in enumerate(acceptance["per_position_acceptance_rates"], start=1):
        table.add_row(str(index), f"{rate:.3f}", f"{acceptance['acceptance_length'][index]:.2f}")
    return table


@zoo_app.command("train")
def zoo_train(
    out: Out,
    target_config: Annotated[
        str, typer.Option(help="Target shape: a name (s-target, m-target, ...) or key=value list.")
    ] = "s-target",
    draft_config: DraftConfig = "s-draft",
    corpus: Corpus = "stdlib",
    tokenizer: Annotated[str, typer.Option(help="bytes or smollm2.")] = "bytes",
    steps: Steps = 1000,
    batch_size: BatchSize = 16,
    seq_len: SeqLen = 256,
    lr: Lr = 1e-3,
    device: Device = "cpu",
    seed: Seed = 0,
    max_minutes: MaxMinutes = None,
    max_corpus_chars: MaxCorpusChars = None,
    eval_windows: EvalWindows = 64,
    eval_k: EvalK = 5,
) -> None:
    """Train a target and a smaller draft from scratch on the same corpus and tokenizer."""
    from dsd.backend.corpus import parse_corpus_names
    from dsd.backend.zoo import TrainConfig, train_pair

    config = TrainConfig(
        out_dir=str(out),
        corpus=parse_corpus_names(corpus),
        tokenizer=tokenizer,
        steps=steps,
        batch_size=batch_size,
        seq_len=seq_len,
        lr=lr,
        seed=seed,
        device=_device(device),
        max_minutes=max_minutes,
        max_corpus_chars=max_corpus_chars,
        eval_windows=eval_windows,
        eval_k=eval_k,
    )
    console = Console()
    progress, task = _progress(steps, "train pair")

    def on_step(done: int, losses: list[float]) -> None:
        progress.update(
            task, completed=done, losses=f"target {losses[0]:.3f} draft {losses[1]:.3f}"
        )

    with progress:
        result = train_pair(config, target_config, draft_config, on_step=on_step)
    target_rec, draft_rec = result.target_record, result.draft_record
    console.print(
        f"{target_rec.steps_done} steps in {target_rec.elapsed_s:.1f} s; held-out loss: target "
        f"{target_rec.heldout_loss:.3f}, draft {draft_rec.heldout_loss:.3f}",
        highlight=False,
    )
    console.print(_acceptance_table(draft_rec.acceptance, "held-out greedy acceptance"))
    console.print(f"wrote {result.target_dir} and {result.draft_dir}", highlight=False)


@zoo_app.command("distill-draft")
def zoo_distill_draft(
    out: Out,
    target: Annotated[
        str, typer.Option(help="The target: smollm2-135m, a .gguf file or a checkpoint folder.")
    ] = "smollm2-135m",
    draft_config: DraftConfig = "s-draft",
    loss: Annotated[str, typer.Option(help="kl (to the target's logits) or greedy.")] = "kl",
    corpus: Corpus = "prompts",
    steps: Steps = 1000,
    batch_size: BatchSize = 16,
    seq_len: SeqLen = 256,
    lr: Lr = 1e-3,
    device: Device = "cpu",
    seed: Seed = 0,
    max_minutes: MaxMinutes = None,
    max_corpus_chars: MaxCorpusChars = None,
    eval_windows: EvalWindows = 64,
    eval_k: EvalK = 5,
) -> None:
    """Train a draft from scratch for a given target (distillation on an offline corpus)."""
    from dsd.backend.corpus import parse_corpus_names
    from dsd.backend.zoo import TrainConfig, distill_draft

    if loss not in ("kl", "greedy"):
        raise InputError(f"--loss must be kl or greedy, got {loss!r}")
    config = TrainConfig(
        out_dir=str(out),
        corpus=parse_corpus_names(corpus),
        steps=steps,
        batch_size=batch_size,
        seq_len=seq_len,
        lr=lr,
        seed=seed,
        device=_device(device),
        max_minutes=max_minutes,
        max_corpus_chars=max_corpus_chars,
        eval_windows=eval_windows,
        eval_k=eval_k,
    )
    console = Console()
    progress, task = _progress(steps, "distill draft")

    def on_step(done: int, losses: list[float]) -> None:
        progress.update(task, completed=done, losses=f"{loss} {losses[0]:.3f}")

    with progress:
        result = distill_draft(config, target, draft_config, loss, on_step=on_step)  # type: ignore[arg-type]
    record = result.record
    console.print(
        f"{record.steps_done} steps in {record.elapsed_s:.1f} s; held-out next-token loss "
        f"{record.heldout_loss:.3f}",
        highlight=False,
    )
    console.print(_acceptance_table(result.baseline_acceptance, "untrained draft (baseline)"))
    console.print(_acceptance_table(record.acceptance, "held-out greedy acceptance"))
    console.print(f"wrote {result.draft_dir}", highlight=False)


def register(app: typer.Typer) -> None:
    """Add `generate` and the `zoo` group to the app."""
    app.command("generate")(generate)
    app.add_typer(zoo_app, name="zoo")
