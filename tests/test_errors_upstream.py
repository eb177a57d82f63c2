"""Upstream messages (``errors/upstream/*.json``): the scanner on small C++ and Python inputs, the
data files' mapping to the catalog, and lookup of every committed message in every pasted form."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
import traceback

import pytest

import errors
from errors import catalog as cat, upstream
from errors.check import check
from errors.upstream_scan import BARE, bare_assert_regex, scan_cpp, scan_python, scan_upstream
from upstream_forms import pasted_forms

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


def test_bare_asserts_are_read_by_their_source_where_asked():
    text = PY + "\n\ndef split(total, world):\n    assert (\n        total % world == 0\n    )\n"
    found = [m for m in scan_python(text, "layer.py", bare_asserts=True) if m.kind == BARE]
    assert [(m.function, m.exception, m.message.template) for m in found] == [
        ("Layer.forward", "AssertionError", "assert seq_lens is None"),
        ("split", "AssertionError", "assert total % world == 0"),
    ]
    regex = found[1].message.regex
    for code in (
        "assert total % world == 0",
        "total % world == 0",  # Python 3.11 shows the condition's line of a multi-line assert
        "assert (\n    total % world == 0\n)",  # Python 3.13: the whole statement
        "assert total%world==0",
    ):
        assert re.fullmatch(regex, code), code
    assert not re.fullmatch(regex, "assert total % world == 1")
    assert not [m for m in scan_python(text, "layer.py") if m.kind == BARE]


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


ALL = [(data["source"], message) for data, message in upstream.messages()]


@pytest.mark.parametrize(
    "source,message", ALL, ids=[f"{s}:{m['function']}:{m['template'][:40]}" for s, m in ALL]
)
def test_each_upstream_message_finds_its_entry(source, message):
    catalog = errors.load()
    for name, form in pasted_forms(message).items():
        found = errors.lookup(form, catalog)
        assert found is not None and found["id"] == message["entry"], (
            name,
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
    paste = pasted_forms(message)["C++ context"]
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
    # the answer leads with the translation of upstream's name, then the wording it matched
    lead = result.stdout.splitlines()[2:4]
    assert lead[0].startswith("> **`seqused_k` is `cache_seqlens`**")
    assert lead[1].startswith(
        "> Matched upstream's `RuntimeError: seqused_k must have dtype int32`"
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


def test_a_fork_keeps_only_the_wordings_its_origin_lacks(tmp_path):
    (tmp_path / "hopper").mkdir()
    (tmp_path / "hopper" / "flash_api.cpp").write_text(
        CPP.replace("CHECK_DEVICE(q);", "CHECK_DEVICE(q); CHECK_CONTIGUOUS(sinks);")
    )
    origin = {"messages": [{"template": m.message.template} for m in scan_cpp(CPP, "x.cpp")]}
    (tmp_path / "origin.json").write_text(json.dumps(origin))
    fork = {
        "source": "fork",
        "title": "Fork",
        "repository": "o/fork",
        "files": [{"path": "hopper", "commit": "1" * 40, "fork_of": "origin"}],
        "messages": [],
    }
    fresh = upstream.refresh(fork, tmp_path, tmp_path)
    assert [m["template"] for m in fresh["messages"]] == ["sinks must be contiguous"]


def _bare_source(tmp_path, name: str, path: str, entry: str) -> None:
    regex = bare_assert_regex("x")
    (tmp_path / f"{name}.json").write_text(
        json.dumps(
            {
                "source": name,
                "title": name,
                "repository": f"o/{name}",
                "files": [{"path": path, "commit": "2" * 40, "bare_asserts": True}],
                "messages": [
                    {
                        "path": path,
                        "commit": "2" * 40,
                        "function": "f",
                        "kind": BARE,
                        "exception": "AssertionError",
                        "template": "assert x",
                        "regex": regex,
                        "occurrences": 1,
                        "entry": entry,
                    }
                ],
            }
        )
    )


def test_a_bare_assert_is_told_apart_by_the_tracebacks_file(tmp_path):
    _bare_source(tmp_path, "one", "pkg_one/mod.py", "1111111111111111")
    _bare_source(tmp_path, "two", "pkg_two/mod.py", "2222222222222222")
    for path, entry in (("pkg_one/mod.py", "1111111111111111"), ("pkg_two/mod.py", "2" * 16)):
        found = upstream.match_code("assert x", f"/venv/site-packages/{path}", tmp_path)
        assert [m["entry"] for m in found][0] == entry
    assert len(upstream.match_code("(x)", None, tmp_path)) == 2
    assert upstream.match_code("assert y", None, tmp_path) == []


def test_a_real_bare_assert_traceback_finds_its_entry(tmp_path):
    """Python's own traceback (carets and all) of ring-flash-attention's bare assert, raised from
    a file at the path it has in the package."""
    module = tmp_path / "ring_flash_attn" / "zigzag_ring_flash_attn.py"
    module.parent.mkdir()
    module.write_text("def forward(alibi_slopes):\n    assert alibi_slopes is None\n")
    namespace: dict = {}
    exec(compile(module.read_text(), str(module), "exec"), namespace)
    try:
        namespace["forward"](alibi_slopes=[1.0])
    except AssertionError:
        pasted = traceback.format_exc()
    assert pasted.rstrip().endswith("AssertionError")
    found = errors.lookup(pasted)
    assert found["slug"] == "sequence-parallel/alibi-not-supported"
    text = errors.explain(pasted)
    assert "Matched upstream's `assert alibi_slopes is None` (a bare assert" in text


#: Messages users pasted and found nothing for (and the entry each now opens); every form of each
#: (bare, typed, traceback...) must find it, and each must be in the data.
REPORTED = {
    "sinks must have dtype bfloat16": "upstream/sinks-not-bfloat16",
    "sinks must be on CUDA": "upstream/not-on-cuda",
    "sinks must have shape (num_heads)": "arguments/wrong-shape",
    "sinks must be contiguous": "upstream/not-contiguous",
    "This flash attention build does not support dropout.": "upstream/build-without-feature",
    "This flash attention build does not support softcap.": "upstream/build-without-feature",
    "This flash attention build does not support headdim not being a multiple of 32.": (
        "upstream/build-without-feature"
    ),
    "num_splits > 128 not supported": "upstream/flash-attention-call-limits",
    "flash_attn at sgl-kernel is only supported on sm90 and cu123 above": (
        "upstream/sgl-kernel-fa3-unsupported-gpu"
    ),
    "Can not import sgl_kernel. Please check your installation.": "upstream/dependency-missing",
    "assert alibi_slopes is None": "sequence-parallel/alibi-not-supported",
    # the package's llama3 schedule raises these conditions itself (its own entries)
    "assert total_length % world_size == 0": "sequence-parallel/llama3-total-length-not-divisible",
    "assert nheads_k % heads_k_stride == 0": "sequence-parallel/llama3-heads-k-stride",
    "llama3_flash_attn_varlen_func does not support softcap yet.": (
        "sequence-parallel/hf-adapter-softcap"
    ),
    "USPAttention masked SP path currently expects a [B, S_local] key mask.": (
        "sequence-parallel/usp-attn-mask"
    ),
    "K/V-gather SP supports boolean or integer padding masks.": "sequence-parallel/usp-attn-mask",
    "K/V-gather SP masked attention expects a [B, S_local] mask.": (
        "sequence-parallel/usp-attn-mask"
    ),
    "Replicated prefix and suffix cannot be used at the same time.": (
        "sequence-parallel/several-replicated-modes"
    ),
    # the package has no varlen USPAttention: sglang's own refusal keeps its upstream page
    "Varlen USPAttention does not support masks or replicated tokens": (
        "upstream/sglang-sp-unsupported"
    ),
}


@pytest.mark.parametrize("template", REPORTED)
def test_messages_users_found_nothing_for_now_find_their_entry(template):
    catalog = errors.load()
    rows = [m for _, m in upstream.messages() if m["template"] == template]
    assert rows, f"{template!r} is not in errors/upstream/"
    for row in rows:
        assert errors.get(row["entry"], catalog)["slug"] == REPORTED[template]
        for name, form in pasted_forms(row).items():
            assert errors.lookup(form, catalog)["slug"] == REPORTED[template], (name, form)
