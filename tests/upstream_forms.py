"""Every form in which users paste an upstream message (``errors/upstream/*.json``), shared by the
lookup test (:mod:`test_errors_upstream`) and the site's search test (:mod:`test_docs`)."""

from __future__ import annotations

import re

from errors.upstream_scan import BARE

TRACEBACK_HEAD = (
    'Traceback (most recent call last):\n  File "run.py", line 3, in <module>\n    out = attn(q)\n'
)


def example(template: str, regex: str) -> str:
    """The template with each placeholder filled by a value its pattern accepts."""
    text = re.sub(r"\{[^{}]*\}", "7", template)
    if re.fullmatch(regex, text):
        return text
    for option in re.findall(r"\(\?P<\w+>\(\?:([^)]*)\)\)", regex):  # a ``cond ? "a" : "b"`` choice
        first = option.split("|")[0].replace("\\", "")
        text = re.sub(r"\{[^{}]*\}", lambda m, first=first: first, template, count=1)
        text = re.sub(r"\{[^{}]*\}", "7", text)
        if re.fullmatch(regex, text):
            return text
    raise AssertionError(f"no example for {template!r}")


def bare_assert_forms(message: dict) -> dict[str, str]:
    """A bare assert as users paste it: its code line alone (bare), the code line over the bare
    ``AssertionError`` (typed: the traceback's tail), the traceback (its file under site-packages,
    the carets Python 3.11 draws), the condition's line alone (what Python 3.11 shows of a
    multi-line assert), and the whole traceback on one line (a search box drops line breaks)."""
    code = message["template"]
    frame = (
        f'  File "/usr/lib/python3/site-packages/{message["path"]}", line 12, in '
        f"{message['function'].split('.')[-1]}\n    {code}\n           {'^' * (len(code) - 7)}\n"
    )
    condition = code.removeprefix("assert ")
    return {
        "bare": code,
        "typed": f"{code}\nAssertionError",
        "traceback": f"{TRACEBACK_HEAD}{frame}AssertionError\n",
        "condition line": f"{TRACEBACK_HEAD}{frame.replace(code, condition)}AssertionError",
        "one line": f"{TRACEBACK_HEAD}{frame}AssertionError".replace("\n", " "),
    }


def pasted_forms(message: dict) -> dict[str, str]:
    """What users paste, by name: bare, typed, a traceback, a near miss (other letter case, the
    final period added or dropped, white space doubled); for C++ checks PyTorch's context lines
    after the message, an ``AcceleratorError`` and the context run on without a line break."""
    if message["kind"] == BARE:
        return bare_assert_forms(message)
    text = example(message["template"], message["regex"])
    typed = f"{message['exception']}: {text}"
    near_miss = text[:-1] if text.endswith(".") else text + "."
    forms = {
        "bare": text,
        "typed": typed,
        "traceback": TRACEBACK_HEAD + typed,
        "near miss": f"{message['exception']}:  {near_miss.swapcase()}",
    }
    if message["path"].endswith(".cpp"):
        forms.update(
            {
                "C++ context": f"{typed}\nException raised from {message['function']} at "
                f"/src/{message['path']}:123 (most recent call first):\nframe #0: "
                "c10::Error::Error(c10::SourceLocation, std::string) + 0x9c (0x7f in libc10.so)\n"
                "frame #1: <unknown function> + 0x1234 (0x7f in flash_attn_3.so)\n",
                "accelerator": f"torch.AcceleratorError: {text}",
                "C++ context run on": f"{typed}Exception raised from {message['function']} at "
                f"/src/{message['path']}:9 (most recent call first):",
            }
        )
    return forms
