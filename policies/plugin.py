"""A researcher's own K policy, named by a SPEC like the built-ins: loading, arguments, contract.

`policies.spec.parse_policy` comes here for every SPEC whose name is not a built-in: a class (or
factory) in a file (`path/to/file.py:ClassName[:key=value,...]`, relative to the working
directory), in an importable module (`package.module:ClassName`), registered under the entry
point group `dsd.policies` (`NAME`), or a Python object handed to the API (`object:NAME#N`,
registered by `policy_spec`; it exists only in this process, so a Ray worker cannot rebuild
it). The built policy is a `UserPolicy`, which checks every `choose_k` answer and turns what the
user's code raises into one-line `InputError`s naming the file and class; `policy_source(spec)`
is what results record of the code. Arguments, what the run hands in, the contract:
docs/policies.md, "Write your own policy".

This module loads and checks; it does not run policies (the engine does) nor property-test them
(`sim.policy_check`).
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import importlib
import importlib.util
import inspect
import pickle
import re
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import numpy as np

from dsd.common.arrays import IntArray
from dsd.common.errors import InputError
from dsd.policies.range_table import RangeTable, compile_batch_size_table, compile_range_table
from dsd.policies.types import KPolicy, StepFeedback, StepView, batch_size_only

ENTRY_POINT_GROUP = "dsd.policies"
OBJECT_PREFIX = "object:"
# __init__ parameters dsd fills from the run (never from key=value arguments).
INJECTED = ("k_max", "max_num_seqs", "profile", "seed", "rng")

SpecKind = Literal["file", "module", "entry-point", "object"]
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")

# (resolved path, sha256) -> the module loaded from that file's bytes (loaded once per process)
_FILE_MODULES: dict[tuple[str, str], ModuleType] = {}
# object:NAME#N -> what the Python API was given (this process only)
_OBJECTS: dict[str, object] = {}


@dataclass(frozen=True)
class UserSpec:
    """A user's SPEC taken apart (no file read yet)."""

    kind: SpecKind
    location: str  # file path as given, module name, entry point name, or object key
    class_name: str  # "" for an entry point (its value names the class) and an object
    argument: str | None  # the `key=value,...` part, if any
    text: str  # the SPEC as given, for messages


def split_user_spec(spec: str) -> UserSpec:
    """The parts of a user's SPEC (see the module doc); InputError when it names nothing."""
    text = spec.strip()
    if text.startswith(OBJECT_PREFIX):
        return UserSpec("object", text, "", None, text)
    parts = text.split(":")
    head = parts[0].strip()
    if len(parts) >= 2 and (head.endswith(".py") or "/" in head or "\\" in head):
        kind: SpecKind = "file"
    elif len(parts) >= 2 and "." in head and _IDENTIFIER.match(head):
        kind = "module"
    else:
        argument = ":".join(parts[1:]) if len(parts) > 1 else None
        return UserSpec("entry-point", head, "", argument, text)
    class_name = parts[1].strip()
    if not class_name.isidentifier():
        raise InputError(
            f"policy {text!r}: expected {head}:ClassName[:key=value,...], got class name "
            f"{class_name!r}"
        )
    argument = ":".join(parts[2:]) if len(parts) > 2 else None
    return UserSpec(kind, head, class_name, argument, text)


def is_user_spec(spec: str, builtin_names: Any) -> bool:
    """Whether a SPEC names a user's policy rather than one of `builtin_names`."""
    return spec.strip().partition(":")[0].strip().lower() not in builtin_names


# --------------------------------------------------------------------------------------------
# Finding the class
# --------------------------------------------------------------------------------------------


def _describe(error: BaseException) -> str:
    """`Type: message (file:line)` of an error raised in the user's code, on one line."""
    frames = traceback.extract_tb(error.__traceback__)
    where = f" ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    message = " ".join(str(error).split())
    return f"{type(error).__name__}{': ' + message if message else ''}{where}"


def _read_file(path_text: str, label: str) -> tuple[Path, bytes]:
    path = Path(path_text).expanduser()
    try:
        return path, path.read_bytes()
    except FileNotFoundError:
        raise InputError(f"policy {label}: {path_text}: no such file") from None
    except IsADirectoryError:
        raise InputError(f"policy {label}: {path_text}: is a folder, expected a .py file") from None
    except OSError as error:
        raise InputError(f"policy {label}: {path_text}: cannot read: {error.strerror}") from None
    except ValueError:  # a NUL byte in the path
        raise InputError(f"policy {label}: {path_text!r}: not a valid path") from None


def load_file_module(path_text: str, label: str) -> tuple[ModuleType, Path, str]:
    """(module, resolved path, sha256) of a user's Python file, executed once per content."""
    path, data = _read_file(path_text, label)
    digest = hashlib.sha256(data).hexdigest()
    resolved = path.resolve()
    key = (str(resolved), digest)
    if key in _FILE_MODULES:
        return _FILE_MODULES[key], resolved, digest
    stem = re.sub(r"\W", "_", resolved.stem)
    name = f"dsd_user_policy_{stem}_{digest[:12]}"
    loader_spec = importlib.util.spec_from_file_location(name, resolved)
    if loader_spec is None or loader_spec.loader is None:
        raise InputError(f"policy {label}: {path_text}: not a Python file")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[name] = module  # dataclasses and typing look the module up by name
    sys.path.insert(0, str(resolved.parent))  # the file may import its neighbours
    try:
        loader_spec.loader.exec_module(module)
    except SyntaxError as error:
        del sys.modules[name]
        raise InputError(
            f"policy {label}: syntax error in {path_text} line {error.lineno}: {error.msg}"
        ) from None
    except Exception as error:
        del sys.modules[name]
        raise InputError(
            f"policy {label}: importing {path_text} failed: {_describe(error)}"
        ) from None
    finally:
        sys.path.remove(str(resolved.parent))
    _FILE_MODULES[key] = module
    return module, resolved, digest


def _import_module(name: str, label: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as error:
        raise InputError(
            f"policy {label}: no module named {error.name!r} (install it, or name a file: "
            "path/to/file.py:ClassName)"
        ) from None
    except SyntaxError as error:
        raise InputError(
            f"policy {label}: syntax error in {error.filename} line {error.lineno}: {error.msg}"
        ) from None
    except Exception as error:
        raise InputError(f"policy {label}: importing {name} failed: {_describe(error)}") from None


def _entry_point(name: str, spec: str) -> tuple[str, str]:
    """(module, attribute) an installed package registers as policy `name`."""
    from importlib import metadata

    found = [ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == name]
    if not found:
        from dsd.policies.spec import POLICY_BUILDERS

        installed = sorted(ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP))
        known = ", ".join(sorted(POLICY_BUILDERS)) + (
            f"; installed ({ENTRY_POINT_GROUP}): {', '.join(installed)}" if installed else ""
        )
        raise InputError(
            f"unknown policy {spec!r}; known: {known}; or a user's policy "
            "FILE.py:ClassName / package.module:ClassName"
        )
    module, _sep, attribute = found[0].value.partition(":")
    if not attribute:
        raise InputError(
            f"policy {name!r}: entry point {found[0].value!r} must be package.module:ClassName"
        )
    return module.strip(), attribute.strip()


def _attribute(module: ModuleType, class_name: str, where: str, label: str) -> Any:
    obj = module
    for part in class_name.split("."):
        obj = getattr(obj, part, None)  # type: ignore[assignment]
        if obj is None:
            policies = sorted(
                name
                for name, value in vars(module).items()
                if isinstance(value, type) and callable(getattr(value, "choose_k", None))
            )
            hint = f" (policies there: {', '.join(policies)})" if policies else ""
            raise InputError(f"policy {label}: {where} defines no {class_name!r}{hint}")
    return obj


@dataclass(frozen=True)
class LoadedFactory:
    """What a user's SPEC names: the class or factory, and where its code came from."""

    factory: Any  # a class or a callable returning a policy
    label: str  # how messages name it: `FILE:Class`, `module:Class`, `NAME (module:Class)`
    argument: str | None  # `key=value,...`
    source: dict[str, Any]  # policy_source's record


def load_factory(spec: str) -> LoadedFactory:
    """The class (or factory) a user's SPEC names, checked to look like a policy."""
    parts = split_user_spec(spec)
    label = parts.text
    if parts.kind == "object":
        if parts.location not in _OBJECTS:
            raise InputError(
                f"policy {label}: no such policy object in this process (a policy object "
                "handed to the Python API cannot be rebuilt in another process; name its class "
                "by FILE.py:ClassName instead)"
            )
        obj = _OBJECTS[parts.location]
        return LoadedFactory(obj, _object_label(obj), None, _object_source(parts.location, obj))
    if parts.kind == "file":
        module, path, digest = load_file_module(parts.location, label)
        factory = _attribute(module, parts.class_name, parts.location, label)
        source = {"kind": "file", "path": str(path), "class": parts.class_name, "sha256": digest}
    else:
        module_name, class_name = parts.location, parts.class_name
        entry_point = None
        if parts.kind == "entry-point":
            entry_point = parts.location
            module_name, class_name = _entry_point(parts.location, spec)
            label = f"{parts.location} ({module_name}:{class_name})"
        module = _import_module(module_name, label)
        factory = _attribute(module, class_name, module_name, label)
        source = {
            "kind": parts.kind,
            "module": module_name,
            "class": class_name,
            **_file_record(getattr(module, "__file__", None)),
        }
        if entry_point is not None:
            source["entry_point"] = entry_point
    _check_factory(factory, label)
    return LoadedFactory(factory, label, parts.argument, source)


def _file_record(path: str | None) -> dict[str, Any]:
    if path is None:
        return {"path": None, "sha256": None}
    try:
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError:
        digest = None
    return {"path": str(Path(path).resolve()), "sha256": digest}


def _check_factory(factory: Any, label: str) -> None:
    if isinstance(factory, type):
        for method in ("choose_k", "observe"):
            if not callable(getattr(factory, method, None)):
                raise InputError(
                    f"policy {label}: {factory.__name__} is not a K policy (no {method} method)"
                )
    elif not callable(factory) or isinstance(factory, ModuleType):
        raise InputError(f"policy {label}: not a class or a factory ({type(factory).__name__})")


# --------------------------------------------------------------------------------------------
# Building it
# --------------------------------------------------------------------------------------------


def _signature(factory: Any) -> dict[str, inspect.Parameter]:
    """The named parameters of the factory (a class: its __init__'s), annotations evaluated
    where they can be (a config dataclass is found by its annotation)."""
    try:
        signature = inspect.signature(factory, eval_str=True)
    except Exception:  # an annotation naming what only type checkers import: read it as text
        try:
            signature = inspect.signature(factory)
        except (ValueError, TypeError):  # a builtin without a signature
            return {}
    return {
        name: p
        for name, p in signature.parameters.items()
        if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    }


def _config_type(factory: Any, parameters: dict[str, inspect.Parameter]) -> type[Any] | None:
    """The class's config dataclass: attribute `Config`, or the `config` parameter's type."""
    declared = getattr(factory, "Config", None)
    if isinstance(declared, type) and dataclasses.is_dataclass(declared):
        return declared
    parameter = parameters.get("config")
    annotation = None if parameter is None else parameter.annotation
    if isinstance(annotation, type) and dataclasses.is_dataclass(annotation):
        return annotation
    return None


def _keyword_type(parameters: dict[str, inspect.Parameter]) -> type[Any]:
    """A dataclass of the keyword parameters with scalar defaults (what key=value may set)."""
    fields = [
        (name, type(p.default), dataclasses.field(default=p.default))
        for name, p in parameters.items()
        if name not in INJECTED
        and p.kind is not inspect.Parameter.POSITIONAL_ONLY
        and isinstance(p.default, bool | int | float | str)
    ]
    return dataclasses.make_dataclass("Arguments", fields)


def build_user_policy(spec: str, context: Any) -> UserPolicy:
    """A fresh policy of a user's SPEC for one run (`context`: spec.PolicyContext)."""
    from dsd.policies.spec import parse_keys

    loaded = load_factory(spec)
    factory, label = loaded.factory, loaded.label
    if not isinstance(factory, type) and callable(getattr(factory, "choose_k", None)):
        # an instance from the Python API: a copy per run (policies hold state)
        try:
            fresh = copy.deepcopy(factory)
        except Exception as error:
            raise InputError(
                f"policy {label}: cannot copy it for a fresh run ({_describe(error)}); hand "
                "its class or a factory function instead"
            ) from None
        return UserPolicy(_checked_instance(fresh, label), label)
    parameters = _signature(factory)
    kwargs: dict[str, Any] = {}
    config_type = _config_type(factory, parameters)
    try:
        if config_type is not None:
            if "config" not in parameters:
                raise InputError(
                    f"policy {label}: has a Config dataclass but its __init__ takes no config"
                )
            if loaded.argument or parameters["config"].default is inspect.Parameter.empty:
                kwargs["config"] = config_type(**parse_keys(label, loaded.argument, config_type))
        elif loaded.argument:
            kwargs.update(parse_keys(label, loaded.argument, _keyword_type(parameters)))
    except TypeError as error:  # a Config field without a default
        raise InputError(f"policy {label}: cannot build its config: {error}") from None
    seed = context.seed if context.seed is not None else 0
    sequence = seed if isinstance(seed, np.random.SeedSequence) else np.random.SeedSequence(seed)
    offered = {
        "k_max": context.k_max,
        "max_num_seqs": context.max_num_seqs,
        "profile": context.profile,
        "seed": sequence,
        "rng": np.random.default_rng(sequence),
    }
    for name, parameter in parameters.items():
        if name in kwargs:
            continue
        if name in offered:
            if name == "profile" and context.profile is None:
                if parameter.default is inspect.Parameter.empty:
                    raise InputError(f"policy {label}: needs a profile (--profile)")
                continue
            kwargs[name] = offered[name]
        elif parameter.default is inspect.Parameter.empty:
            raise InputError(
                f"policy {label}: __init__ needs {name!r}; dsd passes {', '.join(INJECTED)}, "
                "config, and key=value arguments to parameters with defaults"
            )
    try:
        instance = factory(**kwargs)
    except InputError as error:
        raise InputError(f"policy {label}: {error}") from None
    except Exception as error:
        raise InputError(f"policy {label}: building it failed: {_describe(error)}") from None
    return UserPolicy(_checked_instance(instance, label), label)


def _checked_instance(instance: Any, label: str) -> Any:
    for method in ("choose_k", "observe"):
        if not callable(getattr(instance, method, None)):
            raise InputError(f"policy {label}: the object built has no {method} method")
    return instance


def checked_k(answer: object, view: StepView, label: str) -> int | IntArray:
    """`answer` if it keeps choose_k's contract at `view`, else a one-line InputError."""
    where = f"at step {view.step_index} (B={view.batch_size}, k_max={view.k_max})"
    if isinstance(answer, bool):
        raise InputError(f"policy {label}: choose_k returned {answer!r} {where}, not a K")
    if isinstance(answer, int | np.integer):
        if not 0 <= int(answer) <= view.k_max:
            raise InputError(
                f"policy {label}: choose_k returned K={int(answer)} {where}; K must be in "
                f"0..{view.k_max}"
            )
        return int(answer)
    try:
        rows = np.asarray(answer)
    except Exception:
        rows = np.asarray(None)
    if rows.ndim == 1 and rows.size == 0:  # no decode rows: `[]` reads as float64
        rows = rows.astype(np.int64)
    if rows.dtype.kind not in "iu" or rows.ndim != 1:
        raise InputError(
            f"policy {label}: choose_k returned {type(answer).__name__} {where}; expected an "
            "int or a 1-D integer array with one K per decode row"
        )
    if rows.shape != (view.num_decode_reqs,):
        raise InputError(
            f"policy {label}: choose_k returned {rows.size} K {where} for "
            f"{view.num_decode_reqs} decode rows"
        )
    bad = (rows < 0) | (rows > view.k_max)
    if bad.any():
        raise InputError(
            f"policy {label}: choose_k returned K={int(rows[bad][0])} {where}; K must be in "
            f"0..{view.k_max}"
        )
    return rows.astype(np.int64, copy=False)


class UserPolicy:
    """A user's policy with its contract checked at every call (see the module doc)."""

    def __init__(self, inner: KPolicy, label: str) -> None:
        self.inner = inner
        self.label = label
        # the engine's fast path asks the policy once per stretch of identical steps
        self.BATCH_SIZE_ONLY = batch_size_only(inner)

    def choose_k(self, view: StepView) -> int | IntArray:
        try:
            answer = self.inner.choose_k(view)
        except InputError:
            raise
        except Exception as error:
            raise InputError(
                f"policy {self.label}: choose_k raised {_describe(error)} at step {view.step_index}"
            ) from None
        return checked_k(answer, view, self.label)

    def observe(self, feedback: StepFeedback) -> None:
        try:
            self.inner.observe(feedback)
        except InputError:
            raise
        except Exception as error:
            raise InputError(
                f"policy {self.label}: observe raised {_describe(error)} after step "
                f"{feedback.step_index}"
            ) from None

    def learned_profile(self) -> Any:
        """The user's policy's own `learned_profile()`, if it has one."""
        learn = getattr(self.inner, "learned_profile", None)
        return learn() if callable(learn) else None


def export_table(policy: KPolicy, k_max: int, max_num_seqs: int, spec: str) -> RangeTable:
    """The range table an export writes for a built policy (vLLM's, and any engine's that
    takes a B -> K table): a user's policy only when it declares K depends on the batch size
    alone (`compile_batch_size_table`, one-line refusal otherwise), a built-in as
    `compile_range_table` compiles it. `spec` names the policy in the refusal."""
    if isinstance(policy, UserPolicy):
        return compile_batch_size_table(policy, k_max, max_num_seqs, spec)
    return compile_range_table(policy, k_max, max_num_seqs)


# --------------------------------------------------------------------------------------------
# The Python API's objects, and sources
# --------------------------------------------------------------------------------------------


def policy_spec(policy: object) -> str:
    """The SPEC of what the Python API was given: a SPEC string (a user's file made absolute,
    so it names the same file from any working directory), or a KPolicy instance, class or
    factory registered in this process as `object:NAME#N`."""
    if isinstance(policy, str):
        name, _sep, rest = policy.strip().partition(":")
        if name.strip().lower() == "hysteresis" and rest:  # its base may be a user's file
            from dsd.policies.spec import split_hysteresis

            base, options = split_hysteresis(rest)
            absolute = policy_spec(base)
            if absolute == base:
                return policy
            return f"{name}:{absolute}" + (f":{options}" if options else "")
        try:
            parts = split_user_spec(policy)
        except InputError:
            return policy  # parse_policy reports it
        if parts.kind == "file" and not Path(parts.location).expanduser().is_absolute():
            try:
                absolute = str(Path(parts.location).expanduser().resolve())
            except (OSError, ValueError, RuntimeError):  # parse_policy reports the bad path
                return policy
            return absolute + policy.strip()[len(parts.location) :]
        return policy
    if not callable(policy) and not callable(getattr(policy, "choose_k", None)):
        raise InputError(
            f"policy: give a SPEC string, a KPolicy instance or a factory, got "
            f"{type(policy).__name__}"
        )
    for key, known in _OBJECTS.items():
        if known is policy:
            return key
    named = policy if isinstance(policy, type) or not hasattr(policy, "choose_k") else type(policy)
    name = getattr(named, "__name__", type(policy).__name__)
    key = f"{OBJECT_PREFIX}{name}#{len(_OBJECTS) + 1}"
    _OBJECTS[key] = policy
    return key


def _object_label(obj: object) -> str:
    kind = obj if isinstance(obj, type) or not hasattr(obj, "choose_k") else type(obj)
    return f"object {getattr(kind, '__qualname__', type(obj).__name__)}"


def _object_source(key: str, obj: object) -> dict[str, Any]:
    kind = obj if isinstance(obj, type) or not hasattr(obj, "choose_k") else type(obj)
    try:
        path = inspect.getsourcefile(kind)  # type: ignore[arg-type]
    except TypeError:
        path = None
    try:
        state = hashlib.sha256(pickle.dumps(obj)).hexdigest()
    except Exception:  # closures, lambdas: no state to fingerprint
        state = None
    return {
        "kind": "object",
        "object": key,
        "class": getattr(kind, "__qualname__", None),
        **_file_record(path),
        "state_sha256": state,
    }


def policy_source(spec: str, builtin_names: Any) -> dict[str, Any] | None:
    """Where a user's SPEC's code came from (path, class, sha256 of the file); None for a
    built-in policy. A `hysteresis:BASE` reports its base's."""
    name = spec.strip().partition(":")[0].strip().lower()
    if name == "hysteresis":
        from dsd.policies.spec import split_hysteresis

        base, _options = split_hysteresis(spec.strip().partition(":")[2])
        return policy_source(base, builtin_names)
    if not is_user_spec(spec, builtin_names):
        return None
    return {"spec": spec.strip(), **load_factory(spec).source}
