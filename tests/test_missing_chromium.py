"""Suite policy: a missing Chromium is said loudly, and under CI=true a skipped browser test fails the run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_security_tests(ci: str) -> subprocess.CompletedProcess:
    env = os.environ | {"DFLASH_CHROMIUM": "/nonexistent/chromium", "CI": ci}
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/browser/test_e2e_security.py"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_missing_chromium_is_loud_and_fails_under_ci():
    local = run_security_tests("false")
    assert local.returncode == 0, local.stdout[-2000:]
    assert "BROWSER TESTS SKIPPED" in local.stdout and "apt-get install -y chromium" in local.stdout
    ci = run_security_tests("true")
    assert ci.returncode == 1, ci.stdout[-2000:]
    assert "BROWSER TESTS SKIPPED" in ci.stdout
