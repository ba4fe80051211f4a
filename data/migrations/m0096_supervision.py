"""Supervised dispatchers and a journal of every process apply starts.

A dispatcher runs beside its supervisor (the pair shares one listening socket and restarts
each other), so its row also names the supervisor's process and the pair's file, which
holds the paths both write their state to. Rows of both tables are written before their
process starts (``starting``) and kept until it is stopped (``stopping`` while an apply
retires it), so the next ``apply``, ``status`` or ``down`` can stop what an interrupted
apply left.
"""

from __future__ import annotations

from typing import Any


def up(db: Any) -> None:
    table = db.table("executor_dispatcher")
    for name, kind in (
        ("supervisor_pid", int),
        ("supervisor_pid_start", str),
        ("pair_file", str),  # JSON the supervisor and the dispatcher start from (0600)
    ):
        if name not in table.columns_dict:
            table.add_column(name, kind)
    db.table("executor_dispatcher").create_index(["state"], if_not_exists=True)
