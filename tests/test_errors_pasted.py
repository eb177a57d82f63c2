"""What users paste: ``errors.lookup`` and ``python -m errors explain`` read the same inputs.

A traceback (the last exception counts), a ``Type: message`` line, an attn-ref note, a docs URL,
an id, slug or external alias id (the sglang error-explanation pages), or a bare message.
"""

import io
import time

import pytest

import errors
from errors.__main__ import main
from errors.pasted import read

Q_NONE = "q can only be None when only_qv=True"
CAPACITY = (
    "batch entry 0: cache_seqlens (8) + new tokens (1) exceeds the cache capacity "
    "(8 tokens per sequence)"
)
Q_NONE_ID = errors.get("only-qv/q-none-without-only-qv")["id"]
SP_NOT_A_TENSOR_ID = errors.get("sequence-parallel/not-a-tensor")["id"]

CHAINED_TRACEBACK = f"""\
Traceback (most recent call last):
  File "model.py", line 12, in step
    out = attend(q, k, v)
  File "model.py", line 3, in attend
    raise RuntimeError("Expected 4D tensors")
RuntimeError: Expected 4D tensors

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "model.py", line 14, in step
    out = flash_attn_with_kvcache(None, kc, vc)
  File "/site-packages/attn_ref/kvcache.py", line 88, in flash_attn_with_kvcache
    check_kvcache_args(...)
ValueError: {Q_NONE}
"""
# Two sites raise this exact text; only the note (attached at the raise) tells them apart.
NOTED_TRACEBACK = f"""\
Traceback (most recent call last):
  File "train.py", line 5, in <module>
    ring_attention([1.0], k, v)
TypeError: q must be a torch.Tensor, got list
attn-ref error {SP_NOT_A_TENSOR_ID}: sequence-parallel/not-a-tensor; run `python -m errors explain
{SP_NOT_A_TENSOR_ID}`
"""

PASTES = [
    (f"ValueError: {Q_NONE}", "only-qv/q-none-without-only-qv"),
    (f"builtins.ValueError: {Q_NONE}", "only-qv/q-none-without-only-qv"),
    (f"E       ValueError: {CAPACITY}", "kv-cache/capacity-exceeded"),
    (f"ValueError('{Q_NONE}')", "only-qv/q-none-without-only-qv"),
    (CHAINED_TRACEBACK, "only-qv/q-none-without-only-qv"),
    (NOTED_TRACEBACK, "sequence-parallel/not-a-tensor"),
    (
        f"attn-ref error {Q_NONE_ID}: only-qv/q-none-without-only-qv, see https://example.org/",
        "only-qv/q-none-without-only-qv",
    ),
    (f"https://attn-ref.github.io/attn-ref/errors/{Q_NONE_ID}/", "only-qv/q-none-without-only-qv"),
    (
        f"https://attn-ref.github.io/attn-ref/api/errors/{Q_NONE_ID}.json",
        "only-qv/q-none-without-only-qv",
    ),
    (
        "https://attn-ref.github.io/attn-ref/errors/only-qv/q-none-without-only-qv/",
        "only-qv/q-none-without-only-qv",
    ),
    (
        "http://localhost:8000/errors/kvcache/q-none-without-only-qv/#solutions",
        "only-qv/q-none-without-only-qv",
    ),
    ("f0e8c28e3c1dd042", "only-qv/q-none-without-only-qv"),
    ("7da82cf0c0998327", "sequence-parallel/replicated-qkv-together"),
    (
        "AssertionError: v_cache must have contiguous last dimension",
        "arguments/non-contiguous-last-dim",
    ),
    (f"  {CAPACITY}\n", "kv-cache/capacity-exceeded"),
]


@pytest.mark.parametrize("text, slug", PASTES, ids=[f"paste{i}" for i in range(len(PASTES))])
def test_lookup_and_explain_read_what_users_paste(capsys, monkeypatch, text, slug):
    assert errors.lookup(text)["slug"] == slug
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    assert main(["explain", "-"]) == 0
    assert capsys.readouterr().out.startswith(f"# {slug}:")


def test_external_aliases_are_recorded_and_shown():
    entry = errors.get("f0e8c28e3c1dd042")
    assert entry["external_aliases"] == [
        {"id": "f0e8c28e3c1dd042", "source": "sglang error-explanation page"}
    ]
    assert entry["message"]["template"] == Q_NONE
    replicated = errors.get("7da82cf0c0998327")
    assert replicated["message"]["template"] == "Replicated Q, K, and V must be provided together."
    assert "Also known as `7da82cf0c0998327` (sglang error-explanation page)." in errors.explain(
        "7da82cf0c0998327"
    )


def test_the_last_exception_line_counts_and_unknown_notes_are_ignored():
    said = read(CHAINED_TRACEBACK)
    assert (said.id, said.exception_type, said.messages) == (None, "ValueError", [Q_NONE])
    # a multi-line message, then a note from someone else: every prefix is a candidate, longest
    # first
    said = read("ValueError: first line\nsecond line\nsome other library's note\n")
    assert said.messages == [
        "first line\nsecond line\nsome other library's note",
        "first line\nsecond line",
        "first line",
    ]
    # a note that belongs to an earlier exception of a chain does not count for the last one
    earlier_note = (
        NOTED_TRACEBACK
        + "\nDuring handling of the above exception, another exception occurred:\n\n"
        + f"ValueError: {Q_NONE}\n"
    )
    assert (
        read(earlier_note).id is None
        and errors.lookup(earlier_note)["slug"] == "only-qv/q-none-without-only-qv"
    )


@pytest.mark.parametrize(
    "text",
    [
        "ValueError: a message nobody raises",
        "Traceback (most recent call last):\n",
        "ValueError",
        "https://example.org/errors/0123456789abcdef/",
    ],
)
def test_pastes_that_fit_nothing(capsys, text):
    assert errors.lookup(text) is None
    assert main(["explain", text]) == 1
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == "" and lines[0].startswith("error: no catalog entry matches")
    # then the three closest entries and a search to try
    assert lines[1] == "closest entries:" and len(lines) == 6 and lines[5].startswith("try: ")


#: Near misses: other letter case, trailing punctuation, white space, quote style.
NEAR_MISSES = [
    ("Q CAN ONLY BE NONE WHEN ONLY_QV=TRUE.", "only-qv/q-none-without-only-qv"),
    (f"ValueError:   {Q_NONE.replace(' ', '   ')}  ", "only-qv/q-none-without-only-qv"),
    ("RuntimeError: FlashAttention only supports Ampere GPUs or newer", "upstream/gpu-too-old"),
    ("flashattention only supports ampere gpus or newer!", "upstream/gpu-too-old"),
    (
        'ValueError: backend must be "gloo" or "nccl", got \u2018mpi\u2019',
        "sequence-parallel/bad-launch-backend",
    ),
    (
        "ValueError: `backend` must be 'gloo' or 'nccl', got 'mpi'",
        None,
    ),  # quotes that are not there
]


@pytest.mark.parametrize("text, slug", NEAR_MISSES)
def test_near_misses_find_their_entry_and_say_so(text, slug):
    found = errors.lookup(text)
    assert (found and found["slug"]) == slug
    if slug is not None:
        assert errors.lookup(text.swapcase())["slug"] == slug
        assert "> Matched loosely" in errors.explain(text)


def test_a_miss_names_the_closest_entries_and_a_search_that_finds_them(capsys):
    assert main(["explain", "flash attention only suports Ampere"]) == 1
    lines = capsys.readouterr().err.splitlines()
    near = [line.split()[1] for line in lines[2:5]]
    assert near[0] == "upstream/gpu-too-old", lines
    words = lines[5].removeprefix("try: python -m errors search ").split()
    assert words and main(["search", *words]) == 0
    assert "upstream/gpu-too-old" in capsys.readouterr().out


@pytest.mark.parametrize(
    "data, reason",
    [
        (b"\x7fELF\x02\x01\x01\x00\x00\x00" + bytes(range(256)), "NUL bytes"),
        (b"ValueError: q can only be \xff\xfe None", "is not UTF-8"),
    ],
)
def test_binary_input_is_reported_not_echoed(capsys, monkeypatch, data, reason):
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert main(["explain", "-"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("error: the input is not text") and reason in err
    assert err.count("\n") == 1 and "\ufffd" not in err and "ELF" not in err


def test_control_characters_in_a_query_are_reported(capsys):
    assert main(["explain", "q can only\x07 be None\x1b\x00"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: the query is not text (it holds NUL bytes") and "only" not in err
    with pytest.raises(KeyError, match="not text"):
        errors.explain("\x01\x02 binary")


def test_a_coloured_traceback_is_read_without_its_colour_codes():
    coloured = f"\x1b[35mValueError\x1b[0m: \x1b[35m{Q_NONE}\x1b[0m\n"
    assert errors.lookup(coloured)["slug"] == "only-qv/q-none-without-only-qv"
    assert errors.explain(coloured).startswith("# only-qv/q-none-without-only-qv:")


def test_empty_stdin_is_an_empty_query(capsys, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"\n")))
    assert main(["explain", "-"]) == 1
    assert capsys.readouterr().err.startswith("error: the query is empty")


def test_a_huge_paste_is_answered_quickly():
    started = time.perf_counter()
    # 150,000 characters
    assert errors.lookup("ValueError: " + "batch entry 0: cache_seqlens (" * 5000) is None
    assert time.perf_counter() - started < 5  # about 20 s when the whole line went to the regexes
