"""Run an entry's examples in-process and say what is wrong with them.

Every example is ``examples.setup`` followed by the example's ``code``, executed in a fresh namespace
(prints are swallowed). The rules:

* ``trigger`` must raise exactly the entry's exception type; the message must match the entry's regex
  and no other active entry's (an identical message raised at another site is told apart by the next
  rule only); the innermost traceback frame inside the package must lie on the entry's recorded raise
  statement.
* ``fixed``, ``guard`` and ``recovery`` must run without an exception; ``recovery`` must also have
  caught this entry's error: the recorded raise statement must fire while it runs (watched with
  ``sys.settrace``).
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
        _run(entry, "trigger", entry["examples"]["trigger"]["code"])
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
    others = [e["slug"] for e in cat.match(message, catalog=catalog)
              if e["id"] != entry["id"] and e["status"] == "active"
              and e["message"]["template"] != entry["message"]["template"]]
    if others:
        problems.append(f"trigger: message {message!r} also matches {', '.join(others)}")
    source = entry["source"]
    location = cat.raise_location(exc, root)
    if location is None:
        problems.append("trigger: the exception did not come from the package")
    elif location[0] != source["path"] or not source["line"] <= location[1] <= source["end_line"]:
        problems.append(f"trigger: raised at {location[0]}:{location[1]}, expected "
                        f"{source['path']}:{source['line']}-{source['end_line']}")
    return problems


@contextlib.contextmanager
def watch_raise(entry: dict, root: Path = cat.ROOT):
    """Yield a list that gets an item each time the entry's raise statement raises inside the block."""
    source = entry["source"]
    target = os.path.realpath(root / source["path"])
    lines = range(source["line"], source["end_line"] + 1)
    hits: list = []
    same_file: dict = {}

    def in_raise_frame(frame, event, arg):
        if event == "exception" and frame.f_lineno in lines and arg[0].__name__ == entry["exception"]["type"]:
            hits.append(frame.f_lineno)
        return in_raise_frame

    def on_call(frame, event, arg):
        name = frame.f_code.co_filename
        if name not in same_file:
            same_file[name] = os.path.realpath(name) == target
        return in_raise_frame if same_file[name] else None

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
            _run(entry, kind, entry["examples"][kind]["code"])
        except Exception as exc:
            return [f"{kind}: raised {type(exc).__name__}: {exc}"]
        return []
    with watch_raise(entry, root) as hits:
        try:
            _run(entry, kind, entry["examples"][kind]["code"])
        except Exception as exc:
            return [f"{kind}: raised {type(exc).__name__}: {exc}"]
    if kind == "recovery" and not hits:
        return ["recovery: this entry's error was never raised (and recovered from) while it ran"]
    return []


def predicate_problems(entry: dict) -> list[str]:
    """What is wrong with the predicate example (empty when every case gives the recorded answer)."""
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
                    answer = eval(compile(case, f"<{entry['slug']}:predicate case>", "eval"), namespace)
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
