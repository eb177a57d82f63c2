"""attn-ref in a user's environment where its generic top-level names are taken.

* A user's own ``errors.py`` and ``kernels.py`` next to their script (first on ``sys.path``):
  ``import attn_ref`` works, its errors are raised with their catalog notes, the user's modules stay
  what ``import errors`` / ``import kernels`` give, and attn-ref's kernels are reached through
  :func:`attn_ref.packages.own_package` (and by ``attn_implementation="attn_ref_kernels"``).
* A stand-in for Hugging Face's ``kernels`` distribution first on ``sys.path``: what README and
  ``docs/transformers.md`` promise holds (transformers sees HF's version, attn-ref's kernels still
  run through ``own_package`` and ``attn_ref_kernels``, :func:`check_hub_kernels` passes).
* Where ``kernels`` is attn-ref's, :func:`check_hub_kernels` raises transformers' own message, and
  that message pasted into ``python -m errors explain`` finds the entry that explains the clash.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import errors
from attn_ref.packages import KernelsNameTaken, check_hub_kernels

ROOT = Path(__file__).resolve().parent.parent

CHECKS = """
import sys, torch
import attn_ref
import errors, kernels
print("user modules kept:", getattr(errors, "MINE", None), getattr(kernels, "MINE", None))
q, cache = torch.randn(1, 1, 2, 16), torch.randn(1, 4, 2, 16)
try:
    attn_ref.flash_attn_with_kvcache(q, cache, cache, softcap=None)
except TypeError as exc:
    print("error:", str(exc))
    print("note:", exc.__notes__[0].split(";")[0])
from attn_ref.packages import check_hub_kernels, own_package
ours = own_package("kernels")
out = ours.flash_attn_with_kvcache(q, cache, cache)
print("own kernels:", tuple(out.shape), ours.__name__)
check_hub_kernels()
print("hub kernels check passed")
import transformers
from transformers.utils.import_utils import is_kernels_available
print("transformers sees hub kernels:", is_kernels_available())
from attn_ref.integrations.transformers import register
register()
torch.manual_seed(0)
config = transformers.LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                  num_attention_heads=2, num_key_value_heads=1, head_dim=16)
model = transformers.LlamaForCausalLM(config).eval()
ids = torch.randint(3, 32, (1, 4))
model.set_attn_implementation("eager")
eager = model.generate(input_ids=ids, max_new_tokens=2, do_sample=False, pad_token_id=0)
model.set_attn_implementation("attn_ref_kernels")
print("attn_ref_kernels generate == eager:", bool((model.generate(input_ids=ids, max_new_tokens=2, do_sample=False, pad_token_id=0) == eager).all()))
"""


#: Enough of HF's ``kernels`` API for transformers to import it: every name is a permissive stub.
HUB_KERNELS_STAND_IN = textwrap.dedent("""
    MINE = "hf"

    class _Any(type):
        def __getattr__(cls, name):
            return Stub()

    class Stub(metaclass=_Any):
        def __init__(self, *args, **kwargs):
            pass

        def __call__(self, *args, **kwargs):
            return args[0] if len(args) == 1 and callable(args[0]) and not kwargs else Stub()

        def __getattr__(self, name):
            return Stub()

        def __or__(self, other):
            return self


    def __getattr__(name):
        return Stub
""")


def run_with_first_on_path(folder: Path) -> list[str]:
    """Run :data:`CHECKS` as a script in ``folder`` (so ``folder`` is first on ``sys.path``)."""
    script = folder / "user_script.py"
    script.write_text(CHECKS)
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


def test_user_modules_named_errors_and_kernels(tmp_path):
    (tmp_path / "errors.py").write_text("MINE = 'errors'\n")
    (tmp_path / "kernels.py").write_text("MINE = 'kernels'\n")
    out = run_with_first_on_path(tmp_path)
    softcap_none = errors.get("options/softcap-none")
    assert out[:4] == [
        "user modules kept: errors kernels",
        "error: softcap must be a real number, got None: softcap=0.0 turns softcapping off",
        f"note: attn-ref error {softcap_none['id']}: options/softcap-none",
        "own kernels: (1, 1, 2, 16) _attn_ref_own_kernels",
    ], out
    assert "attn_ref_kernels generate == eager: True" in out


def test_hugging_face_kernels_first(tmp_path):
    """A stand-in ``kernels`` distribution (package and metadata, as pip installs HF's) wins the
    name."""
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text(HUB_KERNELS_STAND_IN)
    info = tmp_path / "kernels-0.18.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: kernels\nVersion: 0.18.2\n")
    (info / "top_level.txt").write_text("kernels\n")
    (tmp_path / "errors.py").write_text("MINE = 'errors'\n")
    out = run_with_first_on_path(tmp_path)
    assert out[0] == "user modules kept: errors hf"
    assert out[3:] == [
        "own kernels: (1, 1, 2, 16) _attn_ref_own_kernels",
        "hub kernels check passed",
        "transformers sees hub kernels: True",
        "attn_ref_kernels generate == eager: True",
    ], out


def test_kernels_name_clash_is_explained():
    transformers_message = pytest.importorskip(
        "transformers.integrations.hub_kernels"
    )._MISSING_KERNELS_MESSAGE
    with pytest.raises(ImportError) as info:
        check_hub_kernels()  # here `kernels` is attn-ref's
    assert isinstance(info.value, KernelsNameTaken) and str(info.value) == transformers_message
    pasted = f"ImportError: {transformers_message}"
    explained = subprocess.run(
        [sys.executable, "-m", "errors", "explain", pasted],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert explained.returncode == 0 and "environment/kernels-name-clash" in explained.stdout
    assert errors.lookup(pasted)["slug"] == "environment/kernels-name-clash"
