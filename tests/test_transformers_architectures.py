"""Identical or refused, never silently different: every decoder-only architecture of the pinned
transformers that routes attention through its attention interface
(:mod:`tests.transformers_architectures` finds them in transformers' own auto mappings and builds
each tiny), through ``"attn_ref"``.

Each model type gives eager's greedy tokens and logits, or a catalogued error of this package. The
sweep takes about 1 s of CPU per type, so one run checks one of :data:`SHARDS` shards (which one
changes each UTC day; every type is checked within :data:`SHARDS` days):
``ATTN_REF_ARCHITECTURES=all`` checks every type, ``ATTN_REF_ARCHITECTURES=llama,gpt2`` those.
``"attn_ref_kernels"`` runs on the same shard of :data:`KERNELS_SAMPLE` (the Triton interpreter is
slow). The page
``docs/transformers-architectures.md`` (``scripts/transformers_architectures.py``) must list the
types found, and agree with what the checked ones give.
"""

from __future__ import annotations

import datetime
import os
import re
from functools import lru_cache
from pathlib import Path

import pytest

from tests import transformers_architectures as sweep

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "transformers-architectures.md"
SHARDS = 3
KERNELS_SAMPLE = sweep.KERNELS_SAMPLE


def checked_types(types: list[str]) -> list[str]:
    """Those of ``types`` this run checks (see the module docstring)."""
    chosen = os.environ.get("ATTN_REF_ARCHITECTURES", "")
    if chosen == "all":
        return list(types)
    if chosen:
        return [t for t in chosen.split(",") if t in types]
    shard = datetime.datetime.now(datetime.timezone.utc).toordinal() % SHARDS
    return list(types)[shard::SHARDS]


@lru_cache(maxsize=None)
def result(model_type: str, implementation: str) -> sweep.Result:
    return sweep.check(model_type, implementation)


def test_the_sweep_is_transformers_own_list():
    types = sweep.decoder_types()
    assert {"llama", "gpt2", "deepseek_v3", "gemma3_text"} <= set(types)
    # encoders, and models with attention of their own
    assert not {"bert", "roberta", "falcon", "bloom", "mamba"} & set(types)
    assert set(sweep.NOT_TINY) <= set(types)
    assert set(KERNELS_SAMPLE) <= set(sweep.swept_types())


@pytest.mark.parametrize("model_type", sorted(sweep.NOT_TINY))
def test_not_tiny_stays_true(model_type):
    """Each listed type still cannot be built tiny (else it belongs in the sweep)."""
    try:
        sweep.tiny_model(model_type)
    except Exception:  # NotTiny, or transformers' own error
        return
    pytest.fail(f"{model_type} builds tiny now: take it out of NOT_TINY")


@pytest.mark.parametrize("model_type", checked_types(sweep.swept_types()))
def test_identical_or_refused(model_type):
    found = result(model_type, "attn_ref")
    assert found.outcome in ("identical", "refused"), found


@pytest.mark.parametrize("model_type", checked_types(KERNELS_SAMPLE))
def test_kernels_identical_or_refused(model_type):
    found = result(model_type, "attn_ref_kernels")
    assert found.outcome in ("identical", "refused"), found


def test_a_model_that_indexes_the_mask_itself_is_refused():
    """Doge builds a 4-D dynamic mask from the attention mask: refused, not crashed."""
    found = result("doge", "attn_ref")
    assert (found.outcome, found.detail) == ("refused", "transformers/no-flash-attention-support")


def page_rows() -> dict[str, list[str]]:
    """The page's table rows: model type -> its cells after the first."""
    rows = {}
    for line in PAGE.read_text().splitlines():
        cells = re.fullmatch(r"\| `([\w.-]+)` \|(.*)\|", line)
        if cells:
            rows[cells.group(1)] = [c.strip() for c in cells.group(2).split(" | ")]
    return rows


def test_the_page_lists_every_type_and_agrees():
    rows = page_rows()
    assert set(rows) == set(sweep.decoder_types()), "rerun scripts/transformers_architectures.py"
    for model_type, why in sweep.NOT_TINY.items():
        assert rows[model_type] == [why]
    for model_type in checked_types(sweep.swept_types()):
        assert rows[model_type][0] == result(model_type, "attn_ref").label(), model_type
