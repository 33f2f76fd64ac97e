"""Shared helpers for the Python package's tests (run by .ci/run after `cargo test --release`).

The CLI comparisons run the real binary: $DPAUDIT_BIN, else target/release/dpaudit (which
`cargo test --release` builds)."""

import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EVENTS = sorted((ROOT / "fixtures" / "events").glob("*.toml"))
BAD_EVENTS = sorted((ROOT / "fixtures" / "events" / "bad").glob("*.toml"))


def binary() -> Path:
    b = Path(os.environ.get("DPAUDIT_BIN", ROOT / "target" / "release" / "dpaudit"))
    if not b.is_file():
        pytest.fail(f"{b} is missing: build it with `cargo test --release` (or set DPAUDIT_BIN)")
    return b


def cli(*args: str, ok: bool = True) -> subprocess.CompletedProcess:
    """Runs dpaudit in the repository root; `ok`: exit code 0 expected."""
    p = subprocess.run([str(binary()), *args], cwd=ROOT, capture_output=True, text=True)
    if ok and p.returncode != 0:
        raise AssertionError(f"dpaudit {' '.join(args)} exited {p.returncode}: {p.stderr}")
    return p


def cli_json(*args: str) -> dict:
    return json.loads(cli(*args, "--format", "json").stdout)
