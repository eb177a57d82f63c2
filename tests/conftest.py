"""Test configuration: Triton kernels run through the interpreter when there is no CUDA device.

``TRITON_INTERPRET`` must be set before any ``@triton.jit`` function is decorated, so it is set
here, before the tests import :mod:`kernels`.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from filelock import FileLock

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


#: The path of the published site (``site_url``'s path): pages refer to their assets through it.
SITE_PATH = "attn-ref"


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    """The docs site built by ``mkdocs build --strict`` from this tree, in a folder named as the
    path of ``site_url`` (``attn-ref``), as it is published. Built once per run: pytest-xdist's
    workers share it through their common temporary folder, under a file lock.
    ``ATTN_REF_SITE`` may name a site already built from this tree."""
    if os.environ.get("ATTN_REF_SITE"):
        return Path(os.environ["ATTN_REF_SITE"])
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent  # the run's folder, above each worker's own
    site_dir = shared / "built-site" / SITE_PATH
    with FileLock(str(shared / "built-site.lock")):
        if not (site_dir / "index.html").exists():
            result = subprocess.run(
                [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site_dir)],
                cwd=Path(__file__).resolve().parent.parent,
                env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
                capture_output=True,
                text=True,
                timeout=600,
            )
            assert result.returncode == 0, f"mkdocs build --strict failed:\n{result.stderr[-6000:]}"
    return site_dir
