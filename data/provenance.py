"""Which data set a family's profiles come from, and the rule that imports never merge data
sets silently.

A data set is named by the ``hardware`` label of its profiles: ``gpulet-reference`` for the
gpulet import, ``infadapter-cpu`` for the InfAdapter CSV, the device model for a measurement.
A family whose variants were profiled on one data set and then receive another data set's
figures changes what ``plan mix`` optimises without anyone asking (the gpulet GPU rows carry
no energy, so the carbon term drops out of the InfAdapter CPU family's objective). Every
importer therefore calls :func:`check_import_merge` before it writes: an import that would add
a data set to an existing variant or family is refused unless the caller merges on purpose.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from greenctl.data.errors import InputError

UNLABELLED = "(no hardware label)"


def _label(hardware: str | None) -> str:
    return UNLABELLED if hardware is None else hardware


def stored_datasets(
    store: Any, *, variants: Iterable[str] = (), families: Iterable[str] = ()
) -> dict[str, Any]:
    """The data sets (hardware labels) already in the store.

    Returns:
        ``{"variants": {name: (family, {labels})}, "families": {family: {label: {variants}}}}``
        for the named variants (those that exist) and families (those with profiles).
    """
    names = set(variants)
    out: dict[str, Any] = {"variants": {}, "families": {}}
    for r in store.db.query("select name, family from variants"):
        if r["name"] in names:
            out["variants"][r["name"]] = (r["family"], set())
    fams = set(families) | {fam for fam, _ in out["variants"].values()}
    if not fams:
        return out
    rows = store.db.query(
        "select distinct v.family as family, p.variant as variant, p.hardware as hardware "
        "from profiles p join variants v on v.name = p.variant"
    )
    for r in (r for r in rows if r["family"] in fams):
        fam_sets = out["families"].setdefault(r["family"], {})
        fam_sets.setdefault(r["hardware"], set()).add(r["variant"])
        if r["variant"] in out["variants"]:
            out["variants"][r["variant"]][1].add(r["hardware"])
    return out


def check_import_merge(
    store: Any,
    incoming: Iterable[tuple[str, str, str | None]],
    *,
    what: str,
    hint: str,
    merge: bool = False,
) -> list[str]:
    """Refuse an import that would add another data set to an existing variant or family.

    A variant or family that holds profiles of data sets H merges when the import brings it
    a data set not in H; re-importing a data set it holds, or adding new variants to a new
    family, is no merge.

    Args:
        store: the store the import writes to (only read here).
        incoming: ``(variant, family, hardware label)`` of every profile the import writes
            (a new variant's family as the import would register it; an existing variant
            keeps its stored family).
        what: the import, for the message (for example ``gpulet import of DIR``).
        hint: how to import under other names, or merge on purpose.
        merge: merge on purpose: nothing is refused.

    Returns:
        One line per merge the import makes (empty when it merges nothing); with ``merge``
        the caller reports them.

    Raises:
        InputError: the import would merge and ``merge`` is False (nothing is written).
    """
    rows = list(incoming)
    seen = stored_datasets(
        store, variants=[v for v, _, _ in rows], families=[f for _, f, _ in rows]
    )
    by_variant: dict[str, set[str | None]] = {}
    by_family: dict[str, set[str | None]] = {}
    for variant, family, hardware in rows:
        stored = seen["variants"].get(variant)
        family = stored[0] if stored is not None else family
        by_variant.setdefault(variant, set()).add(hardware)
        by_family.setdefault(family, set()).add(hardware)
    merges: list[str] = []
    reported: set[str] = set()
    for name, (family, held) in sorted(seen["variants"].items()):
        new = by_variant[name] - held
        if held and new:
            reported.add(family)
            merges.append(
                f"variant '{name}' (family '{family}') holds profiles of data set "
                f"{_labels(held)}; the import adds {_labels(new)}"
            )
    for family, labels in sorted(by_family.items()):
        held_by: dict[str | None, set[str]] = seen["families"].get(family, {})
        new = labels - set(held_by)
        if held_by and new and family not in reported:
            desc = "; ".join(
                f"{_label(h)} ({', '.join(sorted(vs))})"
                for h, vs in sorted(held_by.items(), key=lambda kv: _label(kv[0]))
            )
            merges.append(
                f"family '{family}' holds profiles of data set {desc}; the import adds "
                f"{_labels(new)}"
            )
    if merges and not merge:
        raise InputError(
            f"{what} would merge two data sets: {merges[0]}"
            + (f" (and {len(merges) - 1} more)" if len(merges) > 1 else "")
            + "; an import never merges data sets silently",
            hint=hint,
        )
    return merges


def _labels(hardware: Iterable[str | None]) -> str:
    return ", ".join(sorted(_label(h) for h in hardware))
