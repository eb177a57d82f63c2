"""Run an entry's examples in-process and say what is wrong with them.

Every example is ``examples.setup`` followed by the example's ``code``, executed in a fresh
namespace (prints are swallowed). The rules:

* ``trigger`` must raise exactly the entry's exception type; the message must match the entry's
  regex and no other active entry's (an identical message raised at another site is told apart by
  the next rule only); the innermost traceback frame inside the package must lie on the entry's
  recorded raise statement.
* ``fixed``, ``guard`` and ``recovery`` must run without an exception; ``recovery`` must also have
  caught this entry's error: the recorded raise statement must fire while it runs (watched with
  ``sys.settrace``). The ``guard`` decides with the predicate: it runs after the ``predicate`` code,
  so it can call the predicate's function.
* An error raised in a rank of :func:`attn_ref.sequence_parallel.launch` reaches the caller
  re-raised by ``launch``, with each failing rank's traceback as a note (``--- rank R of N ---``).
  For such an exception the raise location is the innermost package frame of the first rank's
  traceback (the cause), so the rules above hold for it as for a local raise.
* ``predicate``: after its ``code`` runs, every expression of ``true_cases`` must evaluate to
  ``True`` and every one of ``false_cases`` to ``False`` (real bools).

An upstream-only entry (``status: upstream_only``: a condition only upstream raises) has no trigger,
guard or recovery: its ``fixed`` example (the same computation done with this package) must run
without an exception, and its ``predicate`` (True exactly when upstream raises) must give the
recorded answer on every case.

An entry whose ``examples.requires`` names ``"cuda"`` is skipped, not passed, without a CUDA device.
Without one, Triton kernels in examples run through Triton's interpreter: ``TRITON_INTERPRET=1`` is
set (as ``tests/conftest.py`` does) before the first example runs, unless it is set already.
"""

from __future__ import annotations

import ast
import contextlib
import io
import os
import re
import sys
import warnings
from pathlib import Path
from typing import Optional

from . import catalog as cat

#: The examples that must run without an exception.
CLEAN_KINDS = ("fixed", "guard", "recovery")
#: Where :func:`attn_ref.sequence_parallel.launch` re-raises the exception of a failing rank.
RELAY_PATH = "attn_ref/sequence_parallel/launch.py"
#: The header of the note that holds a failing rank's traceback (launch adds one per failing rank).
RANK_NOTE = re.compile(r"--- rank \d+ of \d+ ---\n")
#: A frame line of a formatted traceback.
TRACE_FRAME = re.compile(r'^  File "(.+)", line (\d+), in ', re.MULTILINE)


def predicate_name(examples: dict) -> str:
    """The name of the function the predicate example defines (its last top-level ``def``)."""
    defs = [
        node.name
        for node in ast.parse(examples["predicate"]["code"]).body
        if isinstance(node, ast.FunctionDef)
    ]
    return defs[-1] if defs else ""


def example_code(entry: dict, kind: str) -> str:
    """The code an example runs after the setup: its own, the guard's after the predicate's def."""
    examples = entry["examples"]
    if kind == "guard":
        return examples["predicate"]["code"] + "\n" + examples["guard"]["code"]
    return examples[kind]["code"]


def _use_triton_interpreter_without_cuda() -> None:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")


def _run(entry: dict, kind: str, code: str) -> dict:
    _use_triton_interpreter_without_cuda()
    namespace = {"__name__": f"errors_example_{kind}"}
    setup = entry["examples"].get("setup", "")
    label = f"<{entry['slug']}:{kind}>"
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        exec(compile(setup + "\n" + code, label, "exec"), namespace)
    return namespace


def skip_reason(entry: dict) -> Optional[str]:
    """Why the entry's examples cannot run on this machine, or None."""
    if "cuda" in entry["examples"].get("requires", []):
        import torch

        if not torch.cuda.is_available():
            return "needs a CUDA device"
    return None


def trigger_problems(entry: dict, catalog: dict, root: Path = cat.ROOT) -> list[str]:
    """What is wrong with the trigger example (empty when it raises this entry's error)."""
    try:
        _run(entry, "trigger", example_code(entry, "trigger"))
    except Exception as exc:  # the example is supposed to raise; anything else is reported
        return _raised_problems(entry, catalog, exc, root)
    return ["trigger: ran without raising"]


def _raised_problems(entry: dict, catalog: dict, exc: Exception, root: Path) -> list[str]:
    expected = entry["exception"]["type"]
    problems = []
    if type(exc).__name__ != expected:
        problems.append(f"trigger: raised {type(exc).__name__} ({exc}), expected {expected}")
        return problems
    message = str(exc)
    if not re.fullmatch(entry["message"]["regex"], message):
        problems.append(f"trigger: message {message!r} does not match the entry's regex")
    others = [
        e["slug"]
        for e in cat.match(message, catalog=catalog)
        if e["id"] != entry["id"]
        and e["status"] == "active"
        and e["message"]["template"] != entry["message"]["template"]
    ]
    if others:
        problems.append(f"trigger: message {message!r} also matches {', '.join(others)}")
    source = entry["source"]
    location = raise_location(exc, root)
    if location is None:
        problems.append("trigger: the exception did not come from the package")
    elif location[0] != source["path"] or not source["line"] <= location[1] <= source["end_line"]:
        problems.append(
            f"trigger: raised at {location[0]}:{location[1]}, expected "
            f"{source['path']}:{source['line']}-{source['end_line']}"
        )
    return problems


def raise_location(exc: BaseException, root: Path = cat.ROOT) -> Optional[tuple[str, int]]:
    """``(path, line)`` of the package frame that raised ``exc``; for an exception relayed by
    ``launch``, where the first failing rank raised it (module docstring)."""
    location = cat.raise_location(exc, root)
    if location is None or location[0] != RELAY_PATH:
        return location
    return rank_location(exc, root) or location  # no rank note: launch's own error (a timeout...)


def rank_location(exc: BaseException, root: Path = cat.ROOT) -> Optional[tuple[str, int]]:
    """The innermost package frame of the first failing rank's traceback note on ``exc``, or
    None."""
    traces = [
        RANK_NOTE.split(str(note), 1)[1]
        for note in getattr(exc, "__notes__", [])
        if RANK_NOTE.match(str(note))
    ]
    location = None
    for path, line in TRACE_FRAME.findall(traces[0] if traces else ""):
        try:
            rel = Path(path).resolve().relative_to(root).as_posix()
        except ValueError:
            continue
        if rel.split("/", 1)[0] in cat.PACKAGE_DIRS:
            location = (rel, int(line))
    return location


@contextlib.contextmanager
def watch_raise(entry: dict, root: Path = cat.ROOT):
    """Yield a list that gets an item each time the entry's raise statement raises inside the block
    (in this process, or in a rank whose exception ``launch`` relays)."""
    source = entry["source"]
    target = os.path.realpath(root / source["path"])
    relay = os.path.realpath(root / RELAY_PATH)
    lines = range(source["line"], source["end_line"] + 1)
    hits: list = []
    kind_of_file: dict = {}

    def in_raise_frame(frame, event, arg):
        if (
            event == "exception"
            and frame.f_lineno in lines
            and arg[0].__name__ == entry["exception"]["type"]
        ):
            hits.append(frame.f_lineno)
        return in_raise_frame

    def in_relay_frame(frame, event, arg):
        if event == "exception" and arg[0].__name__ == entry["exception"]["type"]:
            location = rank_location(arg[1], root)  # arg[1].__traceback__ is not set yet
            if location is not None and location[0] == source["path"] and location[1] in lines:
                hits.append(location[1])
        return in_relay_frame

    def on_call(frame, event, arg):
        name = frame.f_code.co_filename
        if name not in kind_of_file:
            path = os.path.realpath(name)
            kind_of_file[name] = (
                in_raise_frame if path == target else in_relay_frame if path == relay else None
            )
        return kind_of_file[name]

    previous = sys.gettrace()
    sys.settrace(on_call)
    try:
        yield hits
    finally:
        sys.settrace(previous)


def clean_problems(entry: dict, kind: str, root: Path = cat.ROOT) -> list[str]:
    """What is wrong with a fixed, guard or recovery example (empty when it runs cleanly)."""
    if entry["source"] is None:  # an upstream-only entry: nothing of the package raises it
        try:
            _run(entry, kind, example_code(entry, kind))
        except Exception as exc:
            return [f"{kind}: raised {type(exc).__name__}: {exc}"]
        return []
    with watch_raise(entry, root) as hits:
        try:
            _run(entry, kind, example_code(entry, kind))
        except Exception as exc:
            return [f"{kind}: raised {type(exc).__name__}: {exc}"]
    if kind == "recovery" and not hits:
        return ["recovery: this entry's error was never raised (and recovered from) while it ran"]
    return []


def predicate_problems(entry: dict) -> list[str]:
    """What is wrong with the predicate example (empty when every case gives the recorded
    answer)."""
    predicate = entry["examples"]["predicate"]
    try:
        namespace = _run(entry, "predicate", predicate["code"])
    except Exception as exc:
        return [f"predicate: raised {type(exc).__name__}: {exc}"]
    problems = []
    for expected, cases in ((True, predicate["true_cases"]), (False, predicate["false_cases"])):
        for case in cases:
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    answer = eval(
                        compile(case, f"<{entry['slug']}:predicate case>", "eval"), namespace
                    )
            except Exception as exc:
                problems.append(f"predicate: {case} raised {type(exc).__name__}: {exc}")
                continue
            if answer is not expected:
                problems.append(f"predicate: {case} gave {answer!r}, expected {expected}")
    return problems


def example_problems(entry: dict, catalog: dict, root: Path = cat.ROOT) -> list[str]:
    """Every problem with the entry's examples (removed entries: only that they still compile)."""
    if entry["status"] == "upstream_only":
        return [*clean_problems(entry, "fixed", root), *predicate_problems(entry)]
    if entry["status"] != "active":
        return _compile_problems(entry)
    return [
        *trigger_problems(entry, catalog, root),
        *(p for kind in CLEAN_KINDS for p in clean_problems(entry, kind, root)),
        *predicate_problems(entry),
    ]


def _compile_problems(entry: dict) -> list[str]:
    problems = []
    examples = entry["examples"]
    for kind in ("trigger", *CLEAN_KINDS, "predicate"):
        try:
            compile(examples.get("setup", "") + "\n" + examples[kind]["code"], kind, "exec")
        except SyntaxError as exc:
            problems.append(f"{kind}: does not compile: {exc}")
    return problems
