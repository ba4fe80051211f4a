"""The plan document (``greenctl.plan/v1``) every planner emits and every later step reads."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

from greenctl.data.errors import FileFormatError, InputError
from greenctl.data.records import MAX_BATCH, utcnow_iso
from greenctl.data.resources import parse_resource

PLAN_SCHEMA = "greenctl.plan/v1"
#: The entry-point group plan kinds are installed under (built-in ones and a third party's);
#: the registry of plan kinds (``greenctl.executor.kinds``) loads them, this module reads
#: only their names, so a plan document of any installed kind can be read without it.
KIND_GROUP = "greenctl.kinds"
_installed_kinds: tuple[str, ...] | None = None  # the group's names, read once
_added_kinds: list[str] = []

#: The most executor instances one plan may hold (its deployments' counts, or the slices of
#: a MIG layout, added up). The one rule for every step that expands a plan into instances:
#: ``simulate`` would hold each in memory and ``apply`` would start each as a daemon.
MAX_INSTANCES = 10_000
#: Larger plan files are refused before parsing.
MAX_PLAN_BYTES = 64 * 2**20
#: The longest model, variant or resource name.
MAX_NAME_CHARS = 200

_RESOURCE_HINT = "use cpu:N, gpu:MODEL, mig:PROFILE, mps:PCT or another kind:size label"
_WRITE_HINT = "write plans with `greenctl plan ...` (-o FILE), or fix the field"


def installed_kinds(*, refresh: bool = False) -> tuple[str, ...]:
    """The names of the plan kinds installed under :data:`KIND_GROUP` (read once; again
    with ``refresh``, after a package of kinds was added to or removed from the path)."""
    global _installed_kinds
    if _installed_kinds is None or refresh:
        _installed_kinds = tuple(ep.name for ep in entry_points(group=KIND_GROUP))
    return _installed_kinds


def add_plan_kind(name: str) -> None:
    """Let plan documents of kind ``name`` be read (a kind the registry holds), listed in the
    order the kinds are added."""
    if name not in _added_kinds:
        _added_kinds.append(name)


def discard_plan_kind(name: str) -> None:
    """Undo :func:`add_plan_kind` (an installed kind stays readable)."""
    if name in _added_kinds:
        _added_kinds.remove(name)


def plan_kinds() -> tuple[str, ...]:
    """The kinds a plan document may have: those the registry holds, in its order, then
    the installed ones it has not loaded."""
    return (*_added_kinds, *(k for k in installed_kinds() if k not in _added_kinds))


def __getattr__(name: str) -> Any:
    # PLAN_KINDS: the installed kinds, read when asked (kinds are installed, not listed here)
    if name == "PLAN_KINDS":
        return installed_kinds()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@dataclass
class Deployment:
    """``count`` instances of ``variant`` on ``resource`` with batch size ``batch``."""

    model: str
    variant: str
    resource: str
    count: int = 1
    batch: int = 1
    quota_rps: float | None = None  # the rate this deployment (all its instances) serves
    device: str | None = None  # a GPU index/UUID or MIG UUID when pinned
    placement: Any = None  # kind-specific placement (MIG start slot, site, ...)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Plan:
    """A plan document. Kind-specific parts (``gpus``, ``sites``, ...) live in ``extra``."""

    kind: str
    request: dict[str, Any] = field(default_factory=dict)
    deployments: list[Deployment] = field(default_factory=list)
    predicted: dict[str, Any] = field(default_factory=dict)
    created_at: str = field(default_factory=utcnow_iso)
    extra: dict[str, Any] = field(default_factory=dict)
    id: int | None = None  # the store id once saved

    def to_dict(self) -> dict[str, Any]:
        """The JSON document, keys in the documented order."""
        doc: dict[str, Any] = {
            "schema": PLAN_SCHEMA,
            "kind": self.kind,
            "created_at": self.created_at,
        }
        if self.id is not None:
            doc["id"] = self.id
        doc["request"] = self.request
        doc["deployments"] = [d.to_dict() for d in self.deployments]
        doc.update(self.extra)
        doc["predicted"] = self.predicted
        return doc

    def to_json(self, *, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False, default=_json_default)

    @classmethod
    def from_dict(cls, doc: Any, *, source: str = "<plan>") -> Plan:
        """Validate and load a plan document.

        Every field the later steps read is checked here for its type and range (the one
        place: ``simulate``, ``apply``, ``replan``, ``export`` and the store all load plans
        through it), so a bad document is refused naming ``source`` and the field
        (``deployments[2].count``) instead of failing deep inside a command.

        Raises:
            FileFormatError: naming ``source`` and the offending field.
        """
        return _PlanReader(source).plan(doc)


def read_deployment(
    doc: Any, where: str, *, source: str, require_model: bool = True, hint: str | None = None
) -> Deployment:
    """One deployment object checked as a plan document's are (a spec's ``current`` list).

    Raises:
        FileFormatError: naming ``source`` and the field (``current[0].count``).
    """
    reader = _PlanReader(source)
    if hint is not None:
        reader.hint = hint
    return reader.deployment(doc, where, require_model=require_model)


class _PlanReader:
    """Checks of the plan document's fields; each failure names the source and the field."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.hint: str | None = _WRITE_HINT

    def fail(self, field: str, reason: str, hint: str | None = None) -> FileFormatError:
        return FileFormatError(self.source, f"field '{field}' {reason}", hint=hint or self.hint)

    # -- values ---------------------------------------------------------------------------
    def whole(self, value: Any, field: str, *, minimum: int = 1, maximum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(field, f"must be a whole number, got {_show(value)}")
        if not minimum <= value <= maximum:
            raise self.fail(field, f"must be between {minimum} and {maximum}, got {value}")
        return value

    def number(self, value: Any, field: str, *, positive: bool = False) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(field, f"must be a number, got {_show(value)}")
        x = float(value)
        if not math.isfinite(x):
            raise self.fail(field, f"must be a finite number, got {_show(value)}")
        if x < 0 or (positive and x == 0):
            raise self.fail(field, f"must be {'> 0' if positive else '>= 0'}, got {x:g}")
        return x

    def name(self, value: Any, field: str, *, url_safe: bool = False) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(field, f"must be a non-empty string, got {_show(value)}")
        if len(value) > MAX_NAME_CHARS:
            raise self.fail(field, f"is longer than {MAX_NAME_CHARS} characters")
        if not value.isprintable():
            raise self.fail(field, f"must be printable text, got {_show(value)}")
        if url_safe and any(c in value for c in "/?#% \\"):
            raise self.fail(
                field,
                f"is {_show(value)}: a model name is part of a URL",
                hint="use letters, digits, '.', '_' or '-'",
            )
        return value

    def obj(self, value: Any, field: str) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.fail(field, f"must be a JSON object, got {_show(value)}")
        return value

    def optional_number(
        self, doc: dict[str, Any], key: str, field: str, *, positive: bool = False
    ) -> None:
        if doc.get(key) is not None:
            self.number(doc[key], f"{field}.{key}", positive=positive)

    # -- the document ---------------------------------------------------------------------
    def plan(self, doc: Any) -> Plan:
        if not isinstance(doc, dict):
            raise FileFormatError(
                self.source,
                f"a plan must be a JSON object, got {_show(doc)}",
                hint=_WRITE_HINT,
            )
        if doc.get("schema") != PLAN_SCHEMA:
            raise FileFormatError(
                self.source,
                f"field 'schema' is {_show(doc.get('schema'))}, expected {PLAN_SCHEMA!r}",
                hint="write plans with `greenctl plan ...`",
            )
        kind = doc.get("kind")
        if not isinstance(kind, str) or kind not in plan_kinds():
            raise FileFormatError(
                self.source,
                f"field 'kind' is {_show(kind)}, expected one of {', '.join(plan_kinds())}",
            )
        created_at = doc.get("created_at")
        if created_at is not None and not isinstance(created_at, str):
            raise self.fail("created_at", f"must be a time string, got {_show(created_at)}")
        plan_id = doc.get("id")
        if plan_id is not None:
            self.whole(plan_id, "id", maximum=2**63 - 1)
        request = self.obj(doc.get("request"), "request")
        self.optional_number(request, "slo_ms", "request", positive=True)
        self.optional_number(request, "rate_rps", "request")
        predicted = self.obj(doc.get("predicted"), "predicted")
        self.optional_number(predicted, "rate_rps", "predicted")
        raw_deps = doc.get("deployments")
        if raw_deps is None:
            raw_deps = []
        if not isinstance(raw_deps, list):
            raise self.fail("deployments", f"must be a list, got {_show(raw_deps)}")
        deployments = [self.deployment(d, f"deployments[{i}]") for i, d in enumerate(raw_deps)]
        total = sum(d.count for d in deployments)
        if total > MAX_INSTANCES:
            raise self.fail(
                "deployments",
                f"add up to {total} instances, more than one plan may run ({MAX_INSTANCES})",
                hint="lower the counts, or split the fleet into several plans",
            )
        known = {"schema", "kind", "created_at", "id", "request", "deployments", "predicted"}
        extra = {k: v for k, v in doc.items() if k not in known}
        self.extra(extra)
        return Plan(
            kind=kind,
            request=request,
            deployments=deployments,
            predicted=predicted,
            created_at=created_at or utcnow_iso(),
            extra=extra,
            id=plan_id,
        )

    def deployment(self, d: Any, where: str, *, require_model: bool = True) -> Deployment:
        if not isinstance(d, dict):
            raise self.fail(where, f"must be a JSON object, got {_show(d)}")
        model = ""  # (only where not required: a spec's running deployment names none)
        if require_model or d.get("model") is not None:
            model = self.name(d.get("model"), f"{where}.model", url_safe=True)
        variant = self.name(d.get("variant"), f"{where}.variant")
        resource = self.name(d.get("resource"), f"{where}.resource")
        try:
            parse_resource(resource)
        except InputError as exc:
            raise self.fail(
                f"{where}.resource", f"is invalid: {exc.message}", exc.hint or _RESOURCE_HINT
            ) from None
        count = self.whole(d.get("count", 1), f"{where}.count", maximum=MAX_INSTANCES)
        batch = self.whole(d.get("batch", 1), f"{where}.batch", maximum=MAX_BATCH)
        quota = d.get("quota_rps")
        if quota is not None:
            quota = self.number(quota, f"{where}.quota_rps")
        device = d.get("device")
        if device is not None:
            if isinstance(device, int) and not isinstance(device, bool):
                self.whole(device, f"{where}.device", minimum=0, maximum=2**31)
            else:
                self.name(device, f"{where}.device")
        placement = d.get("placement")
        self.placement(placement, f"{where}.placement")
        return Deployment(
            model=model,
            variant=variant,
            resource=resource,
            count=count,
            batch=batch,
            quota_rps=quota,
            device=device,
            placement=placement,
        )

    def placement(self, value: Any, field: str) -> None:
        """The placement fields later steps read: ``start`` and ``gpu`` (MIG slot and GPU),
        ``gpus`` (one GPU per instance), ``duty_cycle_ms``; or a list of MIG starts."""
        if value is None:
            return
        if isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, dict):
                    self.whole(item.get("start"), f"{field}[{i}].start", minimum=0, maximum=255)
                else:
                    self.whole(item, f"{field}[{i}]", minimum=0, maximum=255)
            return
        if not isinstance(value, dict):
            raise self.fail(field, f"must be a JSON object, a list or null, got {_show(value)}")
        if "start" in value:
            self.whole(value["start"], f"{field}.start", minimum=0, maximum=255)
        if value.get("gpu") is not None:
            self.whole(value["gpu"], f"{field}.gpu", minimum=0, maximum=2**31)
        gpus = value.get("gpus")
        if gpus is not None:
            if not isinstance(gpus, list):
                raise self.fail(
                    f"{field}.gpus", f"must be a list of GPU indices, got {_show(gpus)}"
                )
            for i, g in enumerate(gpus):
                self.whole(g, f"{field}.gpus[{i}]", minimum=0, maximum=2**31)
        self.optional_number(value, "duty_cycle_ms", field, positive=True)

    def extra(self, extra: dict[str, Any]) -> None:
        """Kind-specific parts later steps read: ``gpus`` (MIG layouts), ``dispatcher``."""
        gpus = extra.get("gpus")
        if gpus is not None:
            if not isinstance(gpus, list):
                raise self.fail("gpus", f"must be a list, got {_show(gpus)}")
            slots = 0
            for i, g in enumerate(gpus):
                where = f"gpus[{i}]"
                if not isinstance(g, dict):
                    raise self.fail(where, f"must be a JSON object, got {_show(g)}")
                if "index" in g:
                    self.whole(g["index"], f"{where}.index", minimum=0, maximum=2**31)
                layout = g.get("layout")
                if layout is None:
                    continue
                if not isinstance(layout, list):
                    raise self.fail(f"{where}.layout", f"must be a list, got {_show(layout)}")
                for j, slot in enumerate(layout):
                    at = f"{where}.layout[{j}]"
                    if not isinstance(slot, dict):
                        raise self.fail(at, f"must be a JSON object, got {_show(slot)}")
                    self.name(slot.get("profile"), f"{at}.profile")
                    self.whole(slot.get("start", 0), f"{at}.start", minimum=0, maximum=255)
                    if slot.get("variant") is not None:
                        self.name(slot["variant"], f"{at}.variant")
                    slots += 1
            if slots > MAX_INSTANCES:
                raise self.fail(
                    "gpus",
                    f"lay out {slots} GPU instances, more than one plan may run ({MAX_INSTANCES})",
                )
        dispatcher = self.obj(extra.get("dispatcher"), "dispatcher")
        if dispatcher.get("port") is not None:
            self.whole(dispatcher["port"], "dispatcher.port", minimum=0, maximum=65535)
        policy = extra.get("policy")
        if policy is not None and not isinstance(policy, str):
            raise self.fail("policy", f"must be a string, got {_show(policy)}")


def check_families(deployments: Sequence[Deployment], families: Mapping[str, str]) -> None:
    """Refuse a deployment whose ``model`` is not the family of its variant.

    Args:
        deployments: the plan's deployments.
        families: the family of each known variant (from the store or the built-in
            catalog); variants not in it are not checked.

    Raises:
        InputError: naming the deployment's index and the family to write.
    """
    for i, d in enumerate(deployments):
        family = families.get(d.variant)
        if family and family != d.model:
            raise InputError(
                f"deployments[{i}].model is '{d.model}', but variant '{d.variant}' belongs to "
                f"family '{family}'",
                hint=f"set deployments[{i}].model to '{family}' (or deploy a {d.model} variant)",
            )


def _show(value: Any, limit: int = 60) -> str:
    """A short repr of a JSON value for messages (long strings and lists are cut)."""
    text = repr(value) if not isinstance(value, dict | list) else json.dumps(value)[: limit + 1]
    if isinstance(value, dict | list):
        text = ("object " if isinstance(value, dict) else "list ") + text
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"cannot serialise {type(obj).__name__}")


def load_plan_file(path: str | Path) -> Plan:
    """Read a plan document from a JSON file.

    Raises:
        InputError / FileFormatError: a missing file or one that is not a regular file, a
        file that is not UTF-8 text (binary, gzip), invalid JSON (with line and column),
        JSON nested too deeply, or a document that is not a greenctl plan (naming the field).
    """
    p = Path(path)
    try:
        if not p.exists():
            raise InputError(
                f"plan file {p} does not exist",
                hint="check the path, or write a plan with `greenctl plan ... -o FILE`",
            )
        if not p.is_file():
            what = "a directory" if p.is_dir() else "not a regular file"
            raise InputError(f"plan file {p} is {what}", hint="pass the plan's JSON file")
        size = p.stat().st_size
        if size > MAX_PLAN_BYTES:
            raise FileFormatError(
                str(p),
                f"{size} bytes is too large for a plan document (at most {MAX_PLAN_BYTES})",
                hint=_WRITE_HINT,
            )
        raw = p.read_bytes()
    except OSError as exc:
        raise InputError(f"cannot read plan file {p}: {exc.strerror or exc}") from None
    if raw.startswith(b"\x1f\x8b"):
        raise FileFormatError(
            str(p), "is gzip-compressed, not a JSON plan", hint=f"decompress it first: gunzip {p}"
        )
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise FileFormatError(
            str(p),
            f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}): a plan is a "
            "JSON document",
            line=line,
            hint=_WRITE_HINT,
        ) from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FileFormatError(
            str(p),
            f"invalid JSON: {exc.msg} (column {exc.colno})",
            line=exc.lineno,
            hint=_WRITE_HINT,
        ) from None
    except RecursionError:
        raise FileFormatError(
            str(p), "the JSON is nested too deeply to be a plan document", hint=_WRITE_HINT
        ) from None
    except ValueError as exc:  # e.g. an integer longer than Python's digit limit
        raise FileFormatError(
            str(p), f"invalid JSON: {str(exc).splitlines()[0]}", hint=_WRITE_HINT
        ) from None
    return Plan.from_dict(doc, source=str(p))


def write_plan_file(plan: Plan, path: str | Path) -> None:
    """Write a plan document as indented JSON."""
    Path(path).write_text(plan.to_json() + "\n")
