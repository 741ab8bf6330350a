"""`dsd generate` and `dsd zoo train | distill-draft | train-eagle`: real text from real
weights, and the zoo (`dsd.api.generate`, `dsd.api.train_pair`, `dsd.api.distill_draft`).
Checkpoints and train.json are written atomically by the backend.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any

import typer

from dsd.cli import flags

zoo_app = typer.Typer(
    help="Train a target/draft pair, or distill a draft for a target, on offline corpora.",
    no_args_is_help=True,
)

# The training knobs shared by `zoo train` and `zoo distill-draft` (backend.zoo.TrainConfig).
TRAINING: flags.FlagGroup = {
    "steps": flags.option(int, 1000, "Optimizer steps."),
    "batch_size": flags.option(int, 16, "Windows per step."),
    "seq_len": flags.option(int, 256, "Tokens per window."),
    "lr": flags.option(float, 1e-3, "Peak AdamW learning rate."),
    "device": flags.PAIR["device"],
    "max_minutes": flags.option(float | None, None, "Stop training after this wall time."),
    "max_corpus_chars": flags.option(
        int | None, None, "Use at most this many corpus characters (quick runs)."
    ),
    "eval_windows": flags.option(int, 64, "Held-out windows for the acceptance evaluation."),
    "eval_k": flags.option(int, 5, "Positions of the reported acceptance rates."),
}
Out = Annotated[Path, typer.Option(help="Output folder.")]
DraftConfig = Annotated[
    str,
    typer.Option(help="Draft shape: a name (nano-/s-/m-draft, ...) or hidden=,layers=,heads=,ffn="),
]
CORPUS_HELP = "Comma-separated: stdlib, prompts, shakespeare."


@contextlib.contextmanager
def _loss_bar(total: int, label: str) -> Iterator[Callable[[int, list[float]], None]]:
    """A progress bar over training steps that shows the latest losses."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    progress = Progress(
        TextColumn(f"[bold]{label}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[losses]}"),
        TimeElapsedColumn(),
    )
    task = progress.add_task(label, total=total, losses="")
    with progress:
        yield lambda done, losses: progress.update(
            task, completed=done, losses=" ".join(f"{loss:.3f}" for loss in losses)
        )


def _print_acceptance(acceptance: dict[str, Any], title: str) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    table.add_column("position i")
    table.add_column("r_i", justify="right")
    table.add_column("AL(K=i)", justify="right")
    for index, rate in enumerate(acceptance["per_position_acceptance_rates"], start=1):
        table.add_row(str(index), f"{rate:.3f}", f"{acceptance['acceptance_length'][index]:.2f}")
    Console().print(table)


@flags.command(zoo_app, "train", TRAINING, flags.SEED)
def zoo_train(
    out: Out,
    target_config: Annotated[
        str, typer.Option(help="Target shape: a name (s-target, m-target, ...) or key=value list.")
    ] = "s-target",
    draft_config: DraftConfig = "s-draft",
    corpus: Annotated[str, typer.Option(help=CORPUS_HELP)] = "stdlib",
    tokenizer: Annotated[str, typer.Option(help="bytes or smollm2.")] = "bytes",
    **train: Any,
) -> None:
    """Train a target and a smaller draft from scratch on the same corpus and tokenizer."""
    from dsd import api

    with _loss_bar(train.get("steps", 1000), "train pair (target, draft loss)") as on_step:
        result = api.train_pair(
            out,
            target_config=target_config,
            draft_config=draft_config,
            corpus=corpus,
            tokenizer=tokenizer,
            on_step=on_step,
            **train,
        )
    target_rec, draft_rec = result.target_record, result.draft_record
    typer.echo(
        f"{target_rec.steps_done} steps in {target_rec.elapsed_s:.1f} s; held-out loss: target "
        f"{target_rec.heldout_loss:.3f}, draft {draft_rec.heldout_loss:.3f}"
    )
    _print_acceptance(draft_rec.acceptance, "held-out greedy acceptance")
    typer.echo(f"wrote {result.target_dir} and {result.draft_dir}")


@flags.command(zoo_app, "distill-draft", TRAINING, flags.SEED)
def zoo_distill_draft(
    out: Out,
    target: Annotated[
        str, typer.Option(help="The target: smollm2-135m, a .gguf file or a checkpoint folder.")
    ] = "smollm2-135m",
    draft_config: DraftConfig = "s-draft",
    loss: Annotated[str, typer.Option(help="kl (to the target's logits) or greedy.")] = "kl",
    corpus: Annotated[str, typer.Option(help=CORPUS_HELP)] = "prompts",
    **train: Any,
) -> None:
    """Train a draft from scratch for a given target (distillation on an offline corpus)."""
    from dsd import api

    with _loss_bar(train.get("steps", 1000), f"distill draft ({loss} loss)") as on_step:
        result = api.distill_draft(
            out,
            target=target,
            draft_config=draft_config,
            loss=loss,
            corpus=corpus,
            on_step=on_step,
            **train,
        )
    record = result.record
    typer.echo(
        f"{record.steps_done} steps in {record.elapsed_s:.1f} s; held-out next-token loss "
        f"{record.heldout_loss:.3f}"
    )
    if record.acceptance:  # an EAGLE head (--draft-config eagle) records none
        _print_acceptance(result.baseline_acceptance, "untrained draft (baseline)")
        _print_acceptance(record.acceptance, "held-out greedy acceptance")
    typer.echo(f"wrote {result.draft_dir}")


@flags.command(zoo_app, "train-eagle", flags.SEED)
def zoo_train_eagle(
    out: Annotated[Path, typer.Option(help="The head file to write (.safetensors).")],
    target: Annotated[str, typer.Option(help="The target (real weights).")] = "smollm2-135m",
    chat_prompts: Annotated[int, typer.Option(help="Chat prompts the target continues.")] = 480,
    gen_tokens: Annotated[int, typer.Option(help="Greedy tokens per chat prompt.")] = 64,
    shakespeare_windows: Annotated[int, typer.Option(help="Windows of the plays (0: none).")] = 50,
    seq_len: Annotated[int, typer.Option(help="Tokens per training sequence.")] = 128,
    draft_vocab: Annotated[
        int, typer.Option(help="Draft vocabulary: most frequent target tokens (0: all).")
    ] = 4096,
    steps: Annotated[int, typer.Option(help="Optimizer steps.")] = 900,
    batch_size: Annotated[int, typer.Option(help="Sequences per step.")] = 8,
    lr: Annotated[float, typer.Option(help="Peak AdamW learning rate.")] = 2e-3,
    max_prompt_tokens: Annotated[
        int, typer.Option(help="Chat prompts are cut to their last this many tokens.")
    ] = 64,
    document_windows: Annotated[
        int, typer.Option(help="Windows of the prompt sets' questions and answers (0: none).")
    ] = 600,
    max_minutes: Annotated[
        float | None, typer.Option(help="Stop the optimizer after this wall time.")
    ] = None,
    **given: Any,
) -> None:
    """Train an EAGLE head for a target on its own greedy outputs (MT-Bench held out)."""
    from dsd import api

    options = {
        "chat_prompts": chat_prompts,
        "gen_tokens": gen_tokens,
        "shakespeare_windows": shakespeare_windows,
        "document_windows": document_windows,
        "seq_len": seq_len,
        "draft_vocab": draft_vocab,
        "steps": steps,
        "batch_size": batch_size,
        "lr": lr,
        "max_prompt_tokens": max_prompt_tokens,
        "max_minutes": max_minutes,
        "seed": given.get("seed", 0),
    }
    with _loss_bar(steps, "train EAGLE head (loss, top-1)") as on_step:
        result = api.distill_draft(
            out, target=target, draft_config="eagle", on_step=on_step, **options
        )
    record = result.record
    typer.echo(
        f"{record.steps_done} steps, {record.elapsed_s:.0f} s in all "
        f"({record.corpus['training_tokens']} training tokens); wrote {result.draft_dir} "
        f"({record.corpus['file_bytes'] / 1e6:.1f} MB) and its .train.json"
    )


def register(app: typer.Typer) -> None:
    """Add `generate` and the `zoo` group to the app."""

    @flags.command(app, "generate", flags.PAIR, flags.SEED)
    def generate(
        prompt: Annotated[list[str], typer.Option(help="A prompt (repeat for several).")],
        k: Annotated[int, typer.Option(help="K: draft tokens per step.")] = 4,
        max_tokens: Annotated[int, typer.Option(help="Output tokens per prompt at most.")] = 64,
        temperature: Annotated[float, typer.Option(help="0 = greedy.")] = 0.0,
        chat: Annotated[
            bool, typer.Option("--chat/--raw", help="Wrap prompts in the chat template.")
        ] = True,
        **given: Any,
    ) -> None:
        """Generate text for a few prompts (speculative decoding when --draft is given)."""
        from rich.console import Console

        from dsd import api

        seed = given.pop("seed", 0)
        console = Console()
        with console.status("loading weights"):
            pair = api.load_pair(**given, seed=seed)
        report = api.generate(
            pair, prompt, k=k, max_tokens=max_tokens, temperature=temperature, chat=chat, seed=seed
        )
        for result in report.results:
            console.rule(f"[bold]{result.prompt}")
            console.print(result.text, markup=False, highlight=False)
        console.rule()
        console.print(api.generation_text(report, k), highlight=False)
        console.print(api.threads_text(given.get("threads"), str(pair.device)), highlight=False)

    app.add_typer(zoo_app, name="zoo")
