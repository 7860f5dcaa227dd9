"""What the Python tests (helm.py, status_page.py) do when an outside program is missing: the
same rule as the Rust tests' `support::missing` (integration/support.rs).

Under the test command (scripts/test.sh exports SLUICE_REQUIRE_TOOLS=1) and under CI (CI=true)
a missing program fails the test, naming it and how to install it; elsewhere the test is skipped,
said on stdout and recorded in target/skipped.txt, which scripts/test.sh prints at its end."""

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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
