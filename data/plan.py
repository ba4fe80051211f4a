"""The plan document (``greenctl.plan/v1``) every planner emits and every later step reads."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from greenctl.data.errors import FileFormatError, InputError
from greenctl.data.records import utcnow_iso
from greenctl.data.resources import parse_resource

PLAN_SCHEMA = "greenctl.plan/v1"
PLAN_KINDS = ("mix", "mig", "glet", "geo")


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

        Raises:
            FileFormatError: naming ``source`` and the offending field.
        """
        if not isinstance(doc, dict):
            raise FileFormatError(source, "a plan must be a JSON object")
        if doc.get("schema") != PLAN_SCHEMA:
            raise FileFormatError(
                source,
                f"field 'schema' is {doc.get('schema')!r}, expected {PLAN_SCHEMA!r}",
                hint="write plans with `greenctl plan ...`",
            )
        kind = doc.get("kind")
        if kind not in PLAN_KINDS:
            raise FileFormatError(
                source, f"field 'kind' is {kind!r}, expected one of {', '.join(PLAN_KINDS)}"
            )
        deployments = []
        for i, d in enumerate(doc.get("deployments") or []):
            where = f"deployments[{i}]"
            if not isinstance(d, dict):
                raise FileFormatError(source, f"{where} must be an object")
            for key in ("model", "variant", "resource"):
                if not isinstance(d.get(key), str) or not d.get(key):
                    raise FileFormatError(source, f"{where}.{key} is missing or not a string")
            try:
                parse_resource(d["resource"])
            except InputError as exc:
                raise FileFormatError(source, f"{where}.resource: {exc.message}") from None
            for key in ("count", "batch"):
                value = d.get(key, 1)
                if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                    raise FileFormatError(
                        source, f"{where}.{key} must be a whole number >= 1, got {value!r}"
                    )
            quota = d.get("quota_rps")
            if quota is not None and (not isinstance(quota, int | float) or quota < 0):
                raise FileFormatError(source, f"{where}.quota_rps must be a number >= 0")
            deployments.append(
                Deployment(
                    model=d["model"],
                    variant=d["variant"],
                    resource=d["resource"],
                    count=d.get("count", 1),
                    batch=d.get("batch", 1),
                    quota_rps=None if quota is None else float(quota),
                    device=d.get("device"),
                    placement=d.get("placement"),
                )
            )
        known = {"schema", "kind", "created_at", "id", "request", "deployments", "predicted"}
        return cls(
            kind=kind,
            request=doc.get("request") or {},
            deployments=deployments,
            predicted=doc.get("predicted") or {},
            created_at=doc.get("created_at") or utcnow_iso(),
            extra={k: v for k, v in doc.items() if k not in known},
            id=doc.get("id"),
        )


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):  # numpy scalars
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"cannot serialise {type(obj).__name__}")


def load_plan_file(path: str | Path) -> Plan:
    """Read a plan document from a JSON file.

    Raises:
        InputError / FileFormatError: missing file, invalid JSON (with line and column) or
        a document that is not a greenctl plan.
    """
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise InputError(f"plan file {p} does not exist") from None
    except OSError as exc:
        raise InputError(f"cannot read plan file {p}: {exc.strerror}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise FileFormatError(
            str(p), f"invalid JSON: {exc.msg} (column {exc.colno})", line=exc.lineno
        ) from None
    return Plan.from_dict(doc, source=str(p))


def write_plan_file(plan: Plan, path: str | Path) -> None:
    """Write a plan document as indented JSON."""
    Path(path).write_text(plan.to_json() + "\n")
