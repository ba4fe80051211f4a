"""The progress callback every profiling run takes: ``progress(message, fraction)``.

The profilers never print; a command passes a callback that renders (a rich bar), a child
process one that writes its protocol lines, and a library caller :func:`no_progress`.
"""

from __future__ import annotations

from collections.abc import Callable

#: ``progress(message, fraction done in [0, 1])``
Progress = Callable[[str, float], None]


def no_progress(_msg: str, _frac: float) -> None:
    """The callback of a caller that shows nothing."""
    return None
