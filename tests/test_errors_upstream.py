"""Upstream messages (``errors/upstream/*.json``): the scanner on small C++ and Python inputs, the
data files' mapping to the catalog, and lookup of every committed message in every pasted form."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys

import pytest

import errors
from errors import catalog as cat, upstream
from errors.check import check
from errors.upstream_scan import scan_cpp, scan_python, scan_upstream

CPP = r"""
#define CHECK_DEVICE(x) TORCH_CHECK(x.is_cuda(), #x " must be on CUDA")
#define CHECK_SHAPE(x, ...) TORCH_CHECK(x.sizes() == torch::IntArrayRef({__VA_ARGS__}), #x " must have shape (" #__VA_ARGS__ ")")

namespace flash {
// TORCH_CHECK(false, "in a comment");
std::vector<at::Tensor>
mha_fwd(at::Tensor q,   // (b, s, h, d)
        std::optional<at::Tensor> seqused_k_) {
    TORCH_CHECK(dprops->major >= 8, "FlashAttention only supports "
                                    "Ampere GPUs or newer.");
    CHECK_DEVICE(q);
    CHECK_SHAPE(q, batch_size,  seqlen_q, num_heads,
                head_size);
    TORCH_CHECK(head_size <= max_headdim, "at most " + std::to_string(max_headdim));
    TORCH_CHECK(n <= cap, "max(seqlens_k)", knew > 0 ? " + knew" : "", " (= ", n, ") exceeds ", cap, ".");
    if (x) { TORCH_CHECK(y); }
    /* TORCH_CHECK(false, "in a block comment"); */
}
}  // namespace flash

void mha_combine(at::Tensor out) { TORCH_CHECK(out.stride(-1) == 1, "Output tensor must have contiguous last dimension"); }
"""

PY = """
class Layer:
    def forward(self, q, seq_lens=None):
        assert q.dim() == 4, "Expected 4D tensors"
        assert seq_lens is None
        if seq_lens:
            raise NotImplementedError(f"seq_lens must have length {len(seq_lens)}")
        raise RuntimeError


def helper(x):
    msg = f"x must have 4 dimensions, got {x.ndim}"
    raise ValueError(msg)
"""


def test_cpp_checks_as_pytorch_prints_them():
    found = scan_cpp(CPP, "flash_api.cpp")
    assert [(m.function, m.kind, m.exception) for m in found] == [
        ("mha_fwd", "TORCH_CHECK", "RuntimeError"),
        ("mha_fwd", "CHECK_DEVICE", "RuntimeError"),
        ("mha_fwd", "CHECK_SHAPE", "RuntimeError"),
        ("mha_fwd", "TORCH_CHECK", "RuntimeError"),
        ("mha_fwd", "TORCH_CHECK", "RuntimeError"),
        ("mha_combine", "TORCH_CHECK", "RuntimeError"),
    ]
    templates = [m.message.template for m in found]
    assert templates[:3] == [
        "FlashAttention only supports Ampere GPUs or newer.",
        "q must be on CUDA",
        "q must have shape (batch_size, seqlen_q, num_heads, head_size)",
    ]
    assert templates[3] == "at most {max_headdim}"
    assert re.fullmatch(found[3].message.regex, "at most 256")
    assert templates[4] == "max(seqlens_k){knew_0} (= {n}) exceeds {cap}."
    regex = found[4].message.regex
    assert re.fullmatch(regex, "max(seqlens_k) + knew (= 300) exceeds 256.")
    assert re.fullmatch(regex, "max(seqlens_k) (= 300) exceeds 256.")
    assert not re.fullmatch(regex, "max(seqlens_k) + other (= 300) exceeds 256.")


def test_python_raises_and_asserts_with_messages():
    found = scan_python(PY, "layer.py")
    assert [(m.function, m.kind, m.exception, m.message.template) for m in found] == [
        ("Layer.forward", "assert", "AssertionError", "Expected 4D tensors"),
        (
            "Layer.forward",
            "raise",
            "NotImplementedError",
            "seq_lens must have length {len_seq_lens}",
        ),
        ("helper", "raise", "ValueError", "x must have 4 dimensions, got {x_ndim}"),
    ]
    assert re.fullmatch(found[2].message.regex, "x must have 4 dimensions, got 3")
    assert not re.fullmatch(found[2].message.regex, "x must have 4 dimensions, got ")


def test_refresh_keeps_entries_and_filters_functions(tmp_path):
    (tmp_path / "csrc").mkdir()
    (tmp_path / "csrc" / "api.cpp").write_text(CPP)
    data = {
        "source": "demo",
        "title": "Demo",
        "repository": "o/r",
        "files": [{"path": "csrc", "commit": "0" * 40, "functions": ["mha_combine"]}],
        "messages": [
            {
                "template": "Output tensor must have contiguous last dimension",
                "entry": "2727100854b7d496",
            }
        ],
    }
    fresh = upstream.refresh(data, tmp_path)
    assert [(m["function"], m["entry"], m["commit"]) for m in fresh["messages"]] == [
        ("mha_combine", "2727100854b7d496", "0" * 40)
    ]
    assert len(scan_upstream(tmp_path, ["csrc"])) == 6


def test_every_upstream_message_maps_to_an_existing_entry():
    catalog = errors.load()
    assert upstream.problems(catalog) == []
    sources = [data["source"] for data in upstream.load_all()]
    assert sources == list(upstream.SOURCE_ORDER)
    for data in upstream.load_all():
        assert data["messages"], data["source"]
        for message in data["messages"]:
            assert message.get("commit") or message.get("unpinned")
            assert message["path"] and message["function"]


def test_check_fails_for_an_unmapped_or_dangling_message(tmp_path):
    for name in upstream.SOURCE_ORDER:
        (tmp_path / f"{name}.json").write_text((upstream.UPSTREAM_DIR / f"{name}.json").read_text())
    data = json.loads((tmp_path / "fa2.json").read_text())
    data["messages"][0]["entry"] = None
    data["messages"][1]["entry"] = "0123456789abcdef"
    (tmp_path / "fa2.json").write_text(json.dumps(data))
    report = check(run_examples=False, base=None, upstream_dir=tmp_path)
    rules = [(rule, detail) for rule, _, detail in report.problems]
    assert len(rules) == 2 and all(rule == "upstream-messages" for rule, _ in rules)
    assert "without a catalog entry" in rules[0][1] and "0123456789abcdef" in rules[1][1]


def _example(template: str, regex: str) -> str:
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


def pasted_forms(message: dict) -> list[str]:
    """What users paste: bare, typed, a traceback tail, PyTorch's C++ context lines."""
    text = _example(message["template"], message["regex"])
    typed = f"{message['exception']}: {text}"
    forms = [
        text,
        typed,
        'Traceback (most recent call last):\n  File "run.py", line 3, in <module>\n    out = '
        "attn(q)\n" + typed,
    ]
    if message["path"].endswith(".cpp"):
        forms += [
            f"{typed}\nException raised from {message['function']} at /src/{message['path']}:123 "
            "(most recent call first):\nframe #0: c10::Error::Error(c10::SourceLocation, "
            "std::string) + 0x9c (0x7f in libc10.so)\nframe #1: <unknown function> + 0x1234 (0x7f "
            "in flash_attn_3.so)\n",
            f"torch.AcceleratorError: {text}",
            f"{typed}Exception raised from {message['function']} at /src/{message['path']}:9 (most "
            "recent call first):",
        ]
    return forms


ALL = [(data["source"], message) for data, message in upstream.messages()]


@pytest.mark.parametrize(
    "source,message", ALL, ids=[f"{s}:{m['function']}:{m['template'][:40]}" for s, m in ALL]
)
def test_each_upstream_message_finds_its_entry(source, message):
    catalog = errors.load()
    for form in pasted_forms(message):
        found = errors.lookup(form, catalog)
        assert found is not None and found["id"] == message["entry"], (
            form,
            found and found["slug"],
        )


def test_broad_templates_stay_on_their_subject():
    catalog = errors.load()
    k_cache_page = errors.lookup("k_cache must have contiguous last dimension", catalog)["id"]
    for name in ("block_table", "ALiBi slopes tensor", "page_table", "Key tensor"):
        assert (
            errors.lookup(f"{name} must have contiguous last dimension", catalog)["id"]
            != k_cache_page
        )
    # a name nobody raises this for finds nothing, rather than the k_cache page
    assert errors.lookup("my_tensor must have contiguous last dimension", catalog) is None


def test_explain_cli_with_a_cpp_traceback():
    message = next(
        m for _, m in upstream.messages() if m["template"] == "seqused_k must have dtype int32"
    )
    paste = pasted_forms(message)[3]
    result = subprocess.run(
        [sys.executable, "-m", "errors", "explain", "-"],
        input=paste,
        capture_output=True,
        text=True,
        cwd=cat.ROOT,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    entry = errors.get(message["entry"])
    assert result.stdout.startswith(f"# {entry['slug']}:")
    assert (
        "## Also raised upstream as" in result.stdout
        and "seqused_k must have dtype int32" in result.stdout
    )


def test_upstream_only_entries_are_mapped_and_never_raised():
    catalog = errors.load()
    mapped = upstream.by_entry()
    for entry in catalog["errors"]:
        if entry["status"] == "upstream_only":
            assert entry["source"] is None and entry["id"] in mapped, entry["slug"]
    broken = copy.deepcopy(catalog)
    only = next(e for e in broken["errors"] if e["status"] == "upstream_only")
    only["examples"]["trigger"] = {"code": "pass"}
    assert cat.schema_problems(broken)


def test_a_reason_returned_by_a_helper_and_raised_by_its_caller():
    found = scan_python(
        "def _reason(mask):\n    if mask:\n        return 'masks are not supported.'\n    return "
        "None\n\n\nclass USP:\n    def forward(self, mask):\n        why = _reason(mask)\n        "
        "if why:\n            raise NotImplementedError(why)\n",
        "layer.py",
    )
    assert [(m.function, m.exception, m.message.template) for m in found] == [
        ("USP.forward", "NotImplementedError", "masks are not supported.")
    ]
