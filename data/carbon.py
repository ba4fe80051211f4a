"""Carbon signal queries: a region's series, its value at a time, the latest value."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from greenctl.data.carbon_io import carbon_option, normalise_time, parse_time
from greenctl.data.errors import InputError, NotFoundError
from greenctl.data.records import utcnow_iso

if TYPE_CHECKING:
    from greenctl.data.store import Store

COLUMNS = ("time", "region", "carbon_g_per_kwh", "kind", "source")
_SELECT = ", ".join(COLUMNS)


def _time_arg(value: str | None, option: str) -> str | None:
    if value is None:
        return None
    try:
        return normalise_time(value)
    except ValueError as exc:
        raise InputError(
            f"{option}: {exc}", hint="use ISO 8601, e.g. 2022-09-22T13:00:00Z"
        ) from None


def regions(store: Store) -> list[dict[str, Any]]:
    """Regions with signals: ``region, kind, rows, first, last``."""
    return store.rows(
        "select region, kind, count(*) as rows, min(time) as first, max(time) as last "
        "from carbon_signals group by region, kind order by region, kind"
    )


def _require_region(store: Store, region: str, kind: str | None) -> None:
    where, params = "region = ?", [region]
    if kind:
        where += " and kind = ?"
        params.append(kind)
    if not store.rows(f"select 1 from carbon_signals where {where} limit 1", params):
        known = sorted({r["region"] for r in regions(store)})
        hint = (
            f"regions with signals: {', '.join(known)}"
            if known
            else "import one with `greenctl carbon import FILE --region R`"
        )
        what = f"{kind} carbon signal" if kind else "carbon signal"
        raise NotFoundError(f"no {what} for region '{region}'", hint=hint)


def series(
    store: Store,
    region: str,
    *,
    start: str | None = None,
    end: str | None = None,
    kind: str | None = None,
) -> list[dict[str, Any]]:
    """Rows of one region in time order (``time, region, carbon_g_per_kwh, kind, source``).

    Raises:
        NotFoundError: the region has no signal.
    """
    _require_region(store, region, kind)
    clauses, params = ["region = ?"], [region]
    s, e = _time_arg(start, "--from"), _time_arg(end, "--to")
    if s:
        clauses.append("time >= ?")
        params.append(s)
    if e:
        clauses.append("time <= ?")
        params.append(e)
    if kind:
        clauses.append("kind = ?")
        params.append(kind)
    return store.rows(
        f"select {_SELECT} from carbon_signals where {' and '.join(clauses)} order by time, kind",
        params,
    )


def value_at(store: Store, region: str, at: str, *, kind: str | None = None) -> dict[str, Any]:
    """The row in force at time ``at``: the latest with ``time <= at``.

    Raises:
        NotFoundError: no signal for the region, or ``at`` is before its first value.
    """
    _require_region(store, region, kind)
    t = _time_arg(at, "--at")
    clauses, params = ["region = ?", "time <= ?"], [region, t]
    if kind:
        clauses.append("kind = ?")
        params.append(kind)
    rows = store.rows(
        f"select {_SELECT} from carbon_signals where {' and '.join(clauses)} "
        "order by time desc, kind limit 1",
        params,
    )
    if not rows:
        first = series(store, region, kind=kind)[0]["time"]
        raise NotFoundError(
            f"no carbon signal for region '{region}' at {t}", hint=f"its first value is at {first}"
        )
    return dict(rows[0])


def latest(store: Store, region: str, *, kind: str | None = None) -> dict[str, Any]:
    """The newest row of a region (the live 'now' when signals are kept current)."""
    _require_region(store, region, kind)
    where, params = "region = ?", [region]
    if kind:
        where += " and kind = ?"
        params.append(kind)
    return store.rows(
        f"select {_SELECT} from carbon_signals where {where} order by time desc, kind limit 1",
        params,
    )[0]


def now(
    store: Store, region: str, *, at: str | None = None, kind: str | None = None
) -> dict[str, Any]:
    """The value in force now (or at ``at``); falls back to the latest stored value.

    Stored traces often lie in the past; then "now" is the newest value, marked with
    ``"stale": True`` so a user sees it is not current.
    """
    when = at or utcnow_iso()
    try:
        row = value_at(store, region, when, kind=kind)
    except NotFoundError:
        if at:
            raise
        row = latest(store, region, kind=kind)
    out = dict(row)
    if at is None:
        age_s = (datetime.now(UTC) - parse_time(row["time"])).total_seconds()
        out["stale"] = age_s > 2 * 3600
    return out


def region_names(store: Store) -> list[str]:
    """The regions with a stored signal, sorted."""
    return sorted({r["region"] for r in regions(store)})


def signal_region(store: Store, region: str | None) -> str | None:
    """The region whose carbon signal a plan follows: ``region`` when given, else the only
    region with a stored signal, else None (no region, or several and none chosen)."""
    if region is not None:
        return region
    known = region_names(store)
    return known[0] if len(known) == 1 else None


def plan_intensity(
    store: Store,
    *,
    carbon_intensity: float | None = None,
    region: str | None = None,
    at: str | None = None,
    default: float | None = None,
) -> dict[str, Any]:
    """The carbon intensity a planner uses and where it comes from (one rule for every plan).

    In order: an explicit ``carbon_intensity``; the stored signal of ``region`` in force at
    ``at`` (default now, see :func:`now`); the signal of the only region in the store; else
    ``default`` (a planner's reference intensity).

    Returns:
        ``{"carbon_g_per_kwh", "source": {"kind": "flag" | "signal" | "default", ...}, "note"}``.
    Raises:
        NotFoundError: ``region`` has no stored signal (names those that have), or none at ``at``.
        InputError: a bad value or ``at``, ``at`` with an explicit intensity, or no intensity.
    """
    if carbon_intensity is not None:
        value = carbon_option(carbon_intensity)
        if at is not None:
            raise InputError(
                "--at reads the stored signal at a time; it cannot be combined with "
                "--carbon-intensity",
                hint="pass --region R --at TIME, or --carbon-intensity G alone",
            )
        return {
            "carbon_g_per_kwh": float(value),
            "source": {"kind": "flag", "region": region, "at": None},
            "note": None,
        }
    when = _time_arg(at, "--at")
    note = None
    chosen = signal_region(store, region)
    if region is None and chosen is not None:
        note = f"carbon intensity from the signal of {chosen}, the only region in the store"
    region = chosen
    if region is None:
        known = region_names(store)
        if default is None or when is not None:
            raise InputError(
                "no carbon intensity: pass --carbon-intensity G or --region R"
                + (" (--at needs a region)" if when is not None else ""),
                hint=f"regions with signals: {', '.join(known)}"
                if known
                else "or import a signal with `greenctl carbon import FILE --region R`",
            )
        else:
            why = (
                f"{len(known)} regions in the store ({', '.join(known)}), none chosen"
                if known
                else "no carbon signal in the store"
            )
            return {
                "carbon_g_per_kwh": float(default),
                "source": {"kind": "default", "region": None, "at": None},
                "note": f"carbon intensity: the reference {default:g} gCO2/kWh ({why}); "
                "pass --region R or --carbon-intensity G",
            }
    row = now(store, region, at=when)

    stale = bool(row.get("stale"))
    if stale:
        note = (note + "; " if note else "carbon intensity: ") + (
            f"{region}'s newest stored value ({row['time']}) is not current"
        )
    return {
        "carbon_g_per_kwh": float(row["carbon_g_per_kwh"]),
        "source": {
            "kind": "signal",
            "region": region,
            "at": when or utcnow_iso(),
            "signal_time": row["time"],
            "signal_kind": row["kind"],
            "stale": stale,
        },
        "note": note,
    }


def record_intensity(plan: Any, carbon: dict[str, Any]) -> None:
    """Record on ``plan`` the carbon intensity it used and where it came from
    (:func:`plan_intensity`'s answer): ``request.carbon_intensity`` and a ``carbon_source``
    beside the deployments; a signal's region also becomes the plan's ``carbon_region``, the
    region ``replan`` follows."""
    plan.request["carbon_intensity"] = carbon["carbon_g_per_kwh"]
    plan.extra["carbon_source"] = dict(carbon["source"])
    if carbon["source"].get("region"):
        plan.extra["carbon_region"] = carbon["source"]["region"]
