"""Child-process entry of the harness: ``python -m greenctl.profiler.child < spec.json``.

The parent starts it with the device environment of one run item (``CUDA_VISIBLE_DEVICES=
MIG-<uuid>``, ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=PCT``), writes the item's JSON spec to
stdin, and reads one JSON line of measurements from stdout. Errors go to stderr with a
non-zero exit status.
"""

from __future__ import annotations

import sys

from greenctl.data.errors import GreenctlError
from greenctl.profiler.harness import PROGRESS_PREFIX, child_main


def main() -> int:
    """Measure the spec read from stdin; print the result as one JSON line."""

    def progress(message: str, fraction: float) -> None:
        sys.stderr.write(f"{PROGRESS_PREFIX}{fraction:.4f} {message}\n")
        sys.stderr.flush()

    try:
        out = child_main(sys.stdin.read(), progress=progress)
    except GreenctlError as exc:
        sys.stderr.write(f"Error: {exc}\n")
        return exc.exit_code
    sys.stdout.write(out + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
