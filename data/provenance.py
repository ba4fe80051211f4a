"""Which data set a family's profiles come from, and the rule that imports never merge data
sets silently.

A data set is named by its profiles' ``hardware`` label (``gpulet-reference``,
``infadapter-cpu``, a device model). Mixing data sets in one family changes what ``plan
mix`` optimises unasked (gpulet's GPU rows carry no energy, dropping the carbon term), so
every importer calls :func:`check_import_merge` first and refuses to add a data set to an
existing variant or family unless the caller merges on purpose. Synthetic profiles carry a
real GPU's name so ``plan mig`` finds them, yet with ``synthetic_apart`` they are one data
set of their own, :data:`SYNTHETIC_DATASET` (:func:`dataset_label`); :func:`store_synthetic`
follows the same rule.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from greenctl.data.errors import InputError
from greenctl.data.records import SYNTHETIC, Profile, Variant

if TYPE_CHECKING:
    from greenctl.data.store import Store

UNLABELLED = "(no hardware label)"
#: The data set of every synthetic profile, whichever GPU it names.
SYNTHETIC_DATASET = "synthetic (greenctl mig synth)"
_PREFIX_RE = re.compile(r"[A-Za-z][A-Za-z0-9._-]*")


def _label(hardware: str | None) -> str:
    return UNLABELLED if hardware is None else hardware


def dataset_label(hardware: str | None, source: str | None) -> str | None:
    """The data set a profile belongs to: its hardware label, or :data:`SYNTHETIC_DATASET`
    for a synthetic one."""
    return SYNTHETIC_DATASET if source == SYNTHETIC else hardware


def prefixed(prefix: str, name: str) -> str:
    """``PREFIX-NAME``: a variant or family imported beside another data set's of that name.

    Raises:
        InputError: ``prefix`` is not a name (a letter, then letters, digits, ``._-``).
    """
    stem = prefix.rstrip("-")
    if not _PREFIX_RE.fullmatch(stem):
        raise InputError(
            f"--prefix '{prefix}' is not a name",
            hint="start with a letter; letters, digits, '.', '_' and '-' only (e.g. synthetic)",
        )
    return f"{stem}-{name}"


def stored_datasets(
    store: Store,
    *,
    variants: Iterable[str] = (),
    families: Iterable[str] = (),
    synthetic_apart: bool = False,
) -> dict[str, Any]:
    """The data sets (hardware labels) already in the store.

    Returns:
        ``{"variants": {name: (family, {labels})}, "families": {family: {label: {variants}}}}``
        for the named variants (those that exist) and families (those with profiles); a
        label is a profile's hardware label, or with ``synthetic_apart``
        :func:`dataset_label` of it and the profile's source.
    """
    names = set(variants)
    out: dict[str, Any] = {"variants": {}, "families": {}}
    for r in store.rows("select name, family from variants"):
        if r["name"] in names:
            out["variants"][r["name"]] = (r["family"], set())
    fams = set(families) | {fam for fam, _ in out["variants"].values()}
    if not fams:
        return out
    rows = store.rows(
        "select distinct v.family as family, p.variant as variant, p.hardware as hardware, "
        "p.source as source from profiles p join variants v on v.name = p.variant"
    )
    for r in (r for r in rows if r["family"] in fams):
        label = dataset_label(r["hardware"], r["source"]) if synthetic_apart else r["hardware"]
        fam_sets = out["families"].setdefault(r["family"], {})
        fam_sets.setdefault(label, set()).add(r["variant"])
        if r["variant"] in out["variants"]:
            out["variants"][r["variant"]][1].add(label)
    return out


def check_import_merge(
    store: Store,
    incoming: Iterable[tuple[str, str, str | None]],
    *,
    what: str,
    hint: str,
    merge: bool = False,
    synthetic_apart: bool = False,
) -> list[str]:
    """Refuse an import that would add another data set to an existing variant or family.

    An import merges when it brings a variant or family a data set it does not hold yet.
    ``incoming`` is ``(variant, family, data set)`` per profile written (the data set is the
    hardware label, or with ``synthetic_apart`` its :func:`dataset_label`, stored synthetic
    profiles counting as :data:`SYNTHETIC_DATASET`). ``what`` and ``hint`` word the message.
    Returns one line per merge (the caller reports them when ``merge`` is set).

    Raises:
        InputError: the import would merge and ``merge`` is False (nothing is written).
    """
    rows = list(incoming)
    seen = stored_datasets(
        store,
        variants=[v for v, _, _ in rows],
        families=[f for _, f, _ in rows],
        synthetic_apart=synthetic_apart,
    )
    by_variant: dict[str, set[str | None]] = {}
    by_family: dict[str, set[str | None]] = {}
    for variant, family, hardware in rows:
        stored = seen["variants"].get(variant)
        family = stored[0] if stored is not None else family
        by_variant.setdefault(variant, set()).add(hardware)
        by_family.setdefault(family, set()).add(hardware)
    merges: list[str] = []
    subjects: list[str] = []  # the variant or family of each merge line
    reported: set[str] = set()
    for name, (family, held) in sorted(seen["variants"].items()):
        new = by_variant[name] - held
        if held and new:
            reported.add(family)
            subjects.append(name)
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
            subjects.append(family)
            merges.append(
                f"family '{family}' holds profiles of data set {desc}; the import adds "
                f"{_labels(new)}"
            )
    if merges and not merge:
        raise InputError(
            f"{what} would merge two data sets: {merges[0]}"
            + (f" (and {len(merges) - 1} more: {_names(subjects[1:])})" if len(merges) > 1 else "")
            + "; an import never merges data sets silently",
            hint=hint,
        )
    return merges


def _names(names: list[str], shown: int = 10) -> str:
    """At most ``shown`` names, comma-separated."""
    return ", ".join(names[:shown]) + (", ..." if len(names) > shown else "")


def _labels(hardware: Iterable[str | None]) -> str:
    return ", ".join(sorted(_label(h) for h in hardware))


def store_synthetic(
    store: Store,
    variants: Sequence[Variant],
    profiles: Sequence[Profile],
    *,
    what: str,
    hint: str,
    merge: bool = False,
) -> tuple[list[str], list[str]]:
    """Write synthetic variants and profiles (``greenctl mig synth``) in one transaction.

    A variant or family holding another data set's profiles is refused unless ``merge``
    (:func:`check_import_merge`), and so is a stored non-synthetic variant without profiles.
    With ``merge`` such a variant keeps its record, and the synthetic rows go beside its own,
    which the store prefers (:func:`~greenctl.data.records.source_rank`).

    Returns:
        (the merges made on purpose, the variants whose records were kept).
    Raises:
        InputError: the write would merge and ``merge`` is False (nothing is written).
    """
    family_of = {v.name: v.family for v in variants}
    with store.transaction():
        merges = check_import_merge(
            store,
            [
                (p.variant, family_of[p.variant], dataset_label(p.hardware, p.source))
                for p in profiles
            ],
            what=what,
            hint=hint,
            merge=merge,
            synthetic_apart=True,
        )
        stored = {v.name: v for v in store.variants()}
        kept = [v.name for v in variants if v.name in stored and stored[v.name].source != SYNTHETIC]
        if kept and not merge:  # records of another data set, without profiles of it yet
            raise InputError(
                f"{what} would add synthetic profiles to variants that are not synthetic: "
                + ", ".join(f"{n} ({stored[n].source})" for n in kept),
                hint=hint,
            )
        for v in variants:
            if v.name not in kept:
                store.upsert_variant(v)
        store.add_profiles(profiles)
    return merges, kept
