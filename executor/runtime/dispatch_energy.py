"""The dispatcher's energy and carbon accounting, off the request path.

Every ``$GREENCTL_ENERGY_SCRAPE_S`` seconds (default 2; ``0`` turns it off, as the Kubernetes
export does: Prometheus scrapes the pods and sums itself) it reads its executors' ``/metrics``
and sums ``greenctl_energy_joules_total`` and ``greenctl_carbon_grams_total`` per model and
source over each executor process's counter increase (a restarted executor's reset counted as
Prometheus's ``increase()`` counts it). It tells each executor process the running plan's grid
intensity and PUE once (``POST /admin/carbon``, with its state file's token), so executors
kept by ``replan --apply`` or restarted with the old command line count at the new intensity.
aiohttp is imported where used: commands that never serve import this module for its
settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
from typing import Any

from greenctl.executor.runtime import httpserver as hs
from greenctl.executor.runtime.dispatch_admin import RoutingTable
from greenctl.executor.runtime.dispatch_routes import Backend
from greenctl.executor.runtime.metrics import (
    CARBON_TOTAL,
    ENERGY_TOTAL,
    GRID_INTENSITY,
    IncreaseSum,
    label_value,
    parse_prometheus,
)
from greenctl.executor.runtime.procs import proc_start_ticks, read_json

#: seconds between reads of the executors' energy counters (``$GREENCTL_ENERGY_SCRAPE_S``)
ENERGY_SCRAPE_ENV = "GREENCTL_ENERGY_SCRAPE_S"
ENERGY_SCRAPE_S = 2.0


def energy_scrape_s() -> float:
    """Seconds between reads of the executors' energy counters: ``$GREENCTL_ENERGY_SCRAPE_S``
    when it is a number > 0, 0 when it is 0 (no reads), else :data:`ENERGY_SCRAPE_S`."""
    with contextlib.suppress(ValueError):
        value = float(os.environ.get(ENERGY_SCRAPE_ENV, ""))
        if math.isfinite(value) and value >= 0:
            return value
    return ENERGY_SCRAPE_S


class EnergyAccounting(RoutingTable):
    """Reads the executors' energy and carbon counters and tells them the plan's carbon."""

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        #: executors' energy and carbon counters summed per model (see :meth:`scrape_energy`)
        self.energy = IncreaseSum()
        #: per instance, the process and ``carbon`` it was last told (``/admin/carbon``)
        self.carbon_told: dict[str, tuple[Any, dict[str, float]]] = {}
        self.started_ticks = proc_start_ticks(os.getpid())
        #: whether this dispatcher replaced one (restarted on its predecessor's table): only
        #: then did someone else count the energy its executors reported before it started
        self.succeeds = False
        self.energy_interval_s = energy_scrape_s()

    async def energy_loop(self) -> None:
        """Read the executors' energy counters every :attr:`energy_interval_s` seconds (0:
        never)."""
        while self.energy_interval_s > 0:
            await asyncio.sleep(self.energy_interval_s)
            try:
                await self.scrape_energy()
            except Exception as exc:  # a bad round must not end the loop
                print(f"dispatcher: reading executors' energy failed: {exc!r}", flush=True)

    @staticmethod
    def _process(b: Backend) -> tuple[Any, ...]:
        """What tells one process of an instance from the next (a restart changes it)."""
        return (b.pid, b.pid_start, b.url)

    def _predates(self, b: Backend) -> bool:
        """Whether ``b``'s process started before this dispatcher replaced another: the
        dispatcher it replaced counted that process's energy until now. A first dispatcher
        counts its executors from zero (their counters predate it, but nobody summed them)."""
        if not self.succeeds:
            return False
        ticks = b.pid_start or (proc_start_ticks(b.pid) if b.pid else None)
        try:
            return int(ticks or "") < int(self.started_ticks or "")
        except ValueError:
            return False

    async def scrape_energy(self) -> None:
        """One round: each instance's energy and carbon counters added (by increase) to its
        model's totals, and each process that exports energy told the plan's ``carbon``."""
        import aiohttp

        if self.session is None:
            return
        # each process as it was when read (a restart may replace it while we wait)
        members = [
            (route.name, b, self._process(b))
            for route in self.routes.values()
            for b in route.backends
            if b.up and not b.restarting and b.llm is None  # an LLM engine's: from its tokens
        ]
        timeout = aiohttp.ClientTimeout(total=max(1.0, self.energy_interval_s))

        async def get(b: Backend) -> str | None:
            try:
                async with self.session.get(b.url + "/metrics", timeout=timeout) as resp:
                    return (await resp.text()) if resp.status == 200 else None
            except Exception:
                return None

        texts = await asyncio.gather(*(get(b) for _, b, _ in members))
        tell = [
            (b, proc, self.carbon)
            for (model, b, proc), text in zip(members, texts, strict=True)
            if text and proc == self._process(b) and self._observe(model, b, proc, text)
        ]
        current = {(b.id, self._process(b)) for r in self.routes.values() for b in r.backends}
        self.energy.keep(lambda series: isinstance(series, tuple) and series[:2] in current)
        if tell:
            await asyncio.gather(*(self._tell_carbon(b, proc, c) for b, proc, c in tell if c))

    def _observe(self, model: str, b: Backend, proc: Any, text: str) -> bool:
        """Add one process's energy and carbon counters (its ``/metrics`` page) to its
        model's totals; True when it counts energy but does not count carbon at the plan's
        intensity yet (it is to be told)."""
        baseline = self._predates(b)
        counts_energy = False
        intensity = None
        for key, value in parse_prometheus(text).items():
            name = key.partition("{")[0]
            if name == GRID_INTENSITY:
                intensity = value
            if name not in (ENERGY_TOTAL, CARBON_TOTAL):
                continue
            counts_energy = True
            source = label_value(key, "source") or "unknown"
            self.energy.observe((b.id, proc, key), value, (name, model, source), baseline=baseline)
        carbon = self.carbon
        told = self.carbon_told.get(b.id) == (proc, carbon)
        if carbon is not None and intensity != carbon["carbon_g_per_kwh"]:
            told = False  # a process started with an older command line, or told by hand
        return counts_energy and carbon is not None and not told

    async def _tell_carbon(self, b: Backend, proc: Any, carbon: dict[str, float]) -> None:
        """Hand an executor process the grid intensity and PUE to count carbon with (its
        admin token from its state file: a restarted process writes its own there)."""
        import aiohttp

        state_file = (b.spawn or {}).get("state_file")
        state = await asyncio.to_thread(read_json, state_file) if state_file else None
        token = str((state or {}).get("token") or "")
        try:
            async with self.session.post(
                b.url + "/admin/carbon",
                json=carbon,
                headers={hs.TOKEN_HEADER: token},
                timeout=aiohttp.ClientTimeout(total=max(1.0, self.energy_interval_s)),
            ) as resp:
                # 404/405: an executor without this endpoint; 409: it counts no energy
                if resp.status in (200, 404, 405, 409):
                    self.carbon_told[b.id] = (proc, carbon)
        except Exception:
            pass  # told in the next round
