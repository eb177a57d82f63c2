"""What a user sees when an error catalog entry's trigger runs: captured at build time, cached.

For each entry, :func:`outputs` gives the last lines Python prints for the exception that the
entry's ``examples.setup`` + ``examples.trigger`` code raises: the ``Type: message`` line and the
attn-ref note under it (``traceback.format_exception_only``). The error pages show it as the real
output.

The triggers run in one child process (this file run as a script, ``TRITON_INTERPRET=1`` so kernel
examples run on a CPU), from the project root. Results are cached in ``.cache/error-outputs.json``
under a key made of the example code, the contents of every ``.py`` file of the packages and the
``ATTN_REF_*`` environment variables (they change the notes) and this file, so a rebuild reruns only
what changed; editing any package file reruns all (about 5 s). An entry whose examples need a CUDA
device is not run where none is, and gets no output.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

PACKAGES = ("attn_ref", "kernels", "errors")
CACHE = Path(".cache") / "error-outputs.json"
TIMEOUT_S = 300


def package_fingerprint(root: Path) -> str:
    """A hash of every ``.py`` file of :data:`PACKAGES` (path and contents) and of this runner."""
    digest = hashlib.sha256(Path(__file__).read_bytes())
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(
                path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0"
            )
    return digest.hexdigest()


def _key(entry: dict, fingerprint: str) -> str:
    examples = entry["examples"]
    # notes on/off, docs URL
    settings = sorted((k, v) for k, v in os.environ.items() if k.startswith("ATTN_REF_"))
    code = json.dumps(
        [examples.get("setup", ""), examples["trigger"]["code"], fingerprint, settings]
    )
    return hashlib.sha256(code.encode()).hexdigest()


def _runnable(entry: dict) -> bool:
    if "cuda" not in entry["examples"].get("requires", []):
        return True
    import torch

    return torch.cuda.is_available()


def outputs(catalog: dict, root: Path) -> dict[str, str]:
    """``{entry id: output}`` for every entry whose trigger ran (from the cache where it is
    current)."""
    cache_path = root / CACHE
    cache = json.loads(cache_path.read_text(encoding="utf-8")) if cache_path.is_file() else {}
    fingerprint = package_fingerprint(root)
    keys = {
        e["id"]: _key(e, fingerprint)
        for e in catalog["errors"]
        if e["status"] == "active" and _runnable(e)
    }
    stale = [
        e
        for e in catalog["errors"]
        if e["id"] in keys and cache.get(e["id"], {}).get("key") != keys[e["id"]]
    ]
    if stale:
        jobs = [
            {
                "id": e["id"],
                "code": e["examples"].get("setup", "") + "\n" + e["examples"]["trigger"]["code"],
            }
            for e in stale
        ]
        result = subprocess.run(
            [sys.executable, __file__],
            input=json.dumps(jobs),
            capture_output=True,
            text=True,
            cwd=root,
            timeout=TIMEOUT_S,
            env={**os.environ, "TRITON_INTERPRET": "1"},
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"error outputs: the trigger runner failed:\n{result.stderr[-3000:]}"
            )
        for entry_id, output in json.loads(result.stdout.splitlines()[-1]).items():
            cache[entry_id] = {"key": keys[entry_id], "output": output}
        cache_path.parent.mkdir(parents=True, exist_ok=True)
        cache_path.write_text(json.dumps(cache, indent=1, sort_keys=True), encoding="utf-8")
    return {entry_id: cache[entry_id]["output"] for entry_id in keys if entry_id in cache}


def _run_jobs(jobs: list[dict]) -> dict[str, str]:
    """In the child process: run each job's code; the exception's last lines, or a line saying none.
    Paths under the project root (in a rank's relayed traceback) are shown relative to it, as a page
    should not show the machine that built it."""
    import contextlib
    import io
    import warnings

    found = {}
    for job in jobs:
        try:
            with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                exec(
                    compile(job["code"], f"<trigger {job['id']}>", "exec"),
                    {"__name__": "__trigger__"},
                )
        except Exception as exc:  # what the user would see: any exception the trigger raises
            printed = "".join(traceback.format_exception_only(exc)).rstrip("\n")
            found[job["id"]] = printed.replace(os.getcwd() + os.sep, "")
        else:
            found[job["id"]] = "(the trigger ran without raising)"
    return found


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    print(json.dumps(_run_jobs(json.loads(sys.stdin.read()))))
