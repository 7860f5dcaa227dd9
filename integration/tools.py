"""What the Python tests (helm.py, status_page.py) do when an outside program is missing: the
same rule as the Rust tests' `process::missing` (tests/support/src/process.rs).

Under the test command (scripts/test.sh exports SLUICE_REQUIRE_TOOLS=1) and under CI (CI=true)
a missing program fails the test, naming it and how to install it; elsewhere the test is skipped,
said on stdout and recorded in target/skipped.txt, which scripts/test.sh prints at its end."""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENV_PYTHON = ROOT / "target" / "venv" / "bin" / "python"


def use_venv():
    """Runs this script again under target/venv's Python (where scripts/test.sh installs
    kubernetes-validate, selenium and the rest) when it exists and this is another Python, so
    `python3 integration/helm.py` finds them instead of skipping."""
    if VENV_PYTHON.exists() and Path(sys.prefix).resolve() != VENV_PYTHON.parent.parent.resolve():
        os.execv(str(VENV_PYTHON), [str(VENV_PYTHON), *sys.argv])


def env_flag(name):
    """Whether `name` is set to a true value: `1` or `true` (any case); the one reading of CI."""
    value = os.environ.get(name, "")
    return value == "1" or value.lower() == "true"


def tools_required():
    return env_flag("SLUICE_REQUIRE_TOOLS") or env_flag("CI")


def missing(test, whats):
    """`test` cannot run: it needs each of `whats` (a program and how to install it). Prints a
    FAIL or SKIPPED line per missing program and returns whether the test failed."""
    required = tools_required()
    for what in whats:
        print(f"{'FAIL' if required else 'SKIPPED'}: {test} needs {what}")
    if required:
        print("(SLUICE_REQUIRE_TOOLS=1, set by scripts/test.sh, or CI=true makes a missing program a failure)")
    else:
        record = Path(os.environ.get("SLUICE_SKIPPED_FILE") or ROOT / "target/skipped.txt")
        record.parent.mkdir(parents=True, exist_ok=True)
        with open(record, "a") as f:
            for what in whats:
                f.write(f"{test}: needs {what}\n")
    return required
