"""Read ``plan mix --spec`` files: a request document in TOML, or JSON (``.json`` or ``{``).

Every field's type and range is checked here, so a bad spec is refused naming the file and
the field (``families[1].rate_rps``) instead of failing deep in the planner; the planner's
``normalize_request`` then checks how fields combine. Fields (all optional here) mirror
``plan mix``'s options: ``model``/``rate_rps`` or ``[[families]]``, ``slo_ms``,
``percentile``, ``objective``, ``min_accuracy``, the weights, ``strategy``, ``solver``,
``time_limit_s``, ``[budgets]`` and the running deployments ``[[current]]``.
See docs/formats.md.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

from greenctl.data.errors import FileFormatError, InputError
from greenctl.data.plan import Deployment, read_deployment

#: Larger spec files are refused before parsing (a spec is a few lines).
MAX_SPEC_BYTES = 1_000_000

_Check = Callable[[Any, str], Any]

#: The fields of a ``plan mix`` request and of one of its families: the one list the spec
#: reader and the planner's ``normalize_request`` both refuse unknown fields with.
MIX_REQUEST_FIELDS = (
    "model",
    "rate_rps",
    "families",
    "slo_ms",
    "percentile",
    "budgets",
    "objective",
    "min_accuracy",
    "alpha",
    "beta",
    "gamma",
    "carbon_intensity",
    "reference_carbon_intensity",
    "pue",
    "headroom",
    "current",
    "strategy",
    "solver",
    "time_limit_s",
)
MIX_FAMILY_FIELDS = ("model", "rate_rps", "slo_ms", "min_accuracy")


class _Spec:
    """Field checks that fail naming the spec file and the field."""

    def __init__(self, path: str, choices: Mapping[str, Sequence[str]]) -> None:
        self.path, self.choices = path, choices

    def fail(self, field: str, reason: str, hint: str | None = None) -> FileFormatError:
        return FileFormatError(self.path, f"field '{field}' {reason}", hint=hint)

    def number(
        self, value: Any, field: str, *, minimum: float = 0.0, strict: bool = False
    ) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(field, f"must be a number, got {_show(value)}")
        x = float(value)
        if not math.isfinite(x):
            raise self.fail(field, f"must be a finite number, got {_show(value)}")
        if x < minimum or (strict and x == minimum):
            raise self.fail(field, f"must be {'>' if strict else '>='} {minimum:g}, got {x:g}")
        return value if isinstance(value, int) else x

    def fraction(self, value: Any, field: str) -> float:
        x = self.number(value, field)
        if x > 1:
            raise self.fail(field, f"must be a fraction between 0 and 1, got {x:g}")
        return x

    def text(self, value: Any, field: str) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self.fail(field, f"must be a non-empty string, got {_show(value)}")
        if any(ord(c) < 32 for c in value):
            raise self.fail(field, "must not hold control characters")
        return value

    def choice(self, value: Any, field: str) -> str:
        text = self.text(value, field)
        allowed = self.choices.get(field.rsplit(".", 1)[-1])
        if allowed and text not in allowed:
            raise self.fail(field, f"is {text!r}", hint=f"use one of {', '.join(allowed)}")
        return text

    def percentile(self, value: Any, field: str) -> Any:
        if isinstance(value, str):
            return self.choice(value, field)
        x = self.number(value, field, strict=True)
        if x >= 100:
            raise self.fail(field, f"must be p95 or p99 (or 0.95 / 95), got {x:g}")
        return value

    def table(
        self, value: Any, field: str, fields: Mapping[str, _Check], required: Sequence[str] = ()
    ) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(field, f"must be a table/object, got {_show(value)}")
        unknown = sorted(str(k) for k in value if k not in fields)
        if unknown:
            raise self.fail(
                f"{field}.{unknown[0]}" if field else unknown[0],
                "is not a known field",
                hint=f"known fields{' of ' + field if field else ''}: {', '.join(fields)}",
            )
        for key in required:
            if value.get(key) is None:
                raise self.fail(f"{field}.{key}" if field else key, "is missing")
        # null (JSON) means absent: the planner's default applies
        return {
            k: fields[k](v, f"{field}.{k}" if field else k)
            for k, v in value.items()
            if v is not None
        }

    def rows(self, value: Any, field: str, check: _Check, *, empty: bool = True) -> list[Any]:
        if not isinstance(value, list):
            raise self.fail(field, f"must be a list, got {_show(value)}")
        if not value and not empty:
            raise self.fail(field, "must not be empty")
        return [check(item, f"{field}[{i}]") for i, item in enumerate(value)]

    def budgets(self, value: Any, field: str) -> dict[str, float]:
        if not isinstance(value, dict):
            raise self.fail(
                field, f"must be a table of KIND = AMOUNT (cpu = 14), got {_show(value)}"
            )
        return {
            self.text(k, f"{field} key"): self.number(v, f"{field}.{k}") for k, v in value.items()
        }

    def family(self, value: Any, field: str) -> dict[str, Any]:
        return self.table(value, field, self.family_checks(), required=("model",))

    def family_checks(self) -> dict[str, _Check]:
        checks: dict[str, _Check] = {
            "model": self.text,
            "rate_rps": self.number,
            "slo_ms": lambda v, f: self.number(v, f, strict=True),
            "min_accuracy": self.fraction,
        }
        return checks

    def deployment(self, value: Any, field: str) -> dict[str, Any]:
        """A running deployment, checked as a plan document's are (``data.plan``)."""
        if isinstance(value, dict):
            unknown = sorted(str(k) for k in value if k not in _DEPLOYMENT_FIELDS)
            if unknown:
                raise self.fail(
                    f"{field}.{unknown[0]}",
                    "is not a known field",
                    hint=f"known fields of {field}: {', '.join(_DEPLOYMENT_FIELDS)}",
                )
        d = read_deployment(value, field, source=self.path, require_model=False, hint=_CURRENT_HINT)
        # the fields given, as checked (null means absent, as everywhere in a spec)
        return {k: v for k, v in d.to_dict().items() if value.get(k) is not None}

    def request(self, doc: Any) -> dict[str, Any]:
        return self.table(doc, "", self.request_checks())

    def request_checks(self) -> dict[str, _Check]:
        strict: _Check = lambda v, f: self.number(v, f, strict=True)  # noqa: E731
        checks: dict[str, _Check] = {
            "model": self.text,
            "rate_rps": self.number,
            "families": lambda v, f: self.rows(v, f, self.family, empty=False),
            "slo_ms": strict,
            "percentile": self.percentile,
            "budgets": self.budgets,
            "objective": self.choice,
            "min_accuracy": self.fraction,
            "alpha": self.number,
            "beta": self.number,
            "gamma": self.number,
            "carbon_intensity": self.number,
            "reference_carbon_intensity": strict,
            "pue": lambda v, f: self.number(v, f, minimum=1.0),
            "headroom": self.number,
            "current": lambda v, f: self.rows(v, f, self.deployment),
            "strategy": self.choice,
            "solver": self.choice,
            "time_limit_s": strict,
        }
        return checks


_DEPLOYMENT_FIELDS = tuple(f.name for f in fields(Deployment))


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "a table"
    if isinstance(value, list):
        return "a list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def read_mix_spec(
    path: str | Path, *, choices: Mapping[str, Sequence[str]] | None = None
) -> dict[str, Any]:
    """Read and check a ``plan mix --spec`` file (TOML or JSON) at ``path``.

    ``choices`` are the allowed values of the enumerated fields (``objective``, ``strategy``,
    ``solver``, ``percentile``), from the planner that owns them.

    Returns:
        The request fields (``budget`` renamed ``budgets``; ``None`` values dropped).
    Raises:
        InputError: the file is missing or unreadable.
        FileFormatError: not UTF-8, invalid TOML/JSON, nested too deeply, or a field of the
            wrong type or out of range (naming the file, line where known, and field).
    """
    p = Path(path)
    try:
        size = p.stat().st_size
        if p.is_dir():
            raise InputError(f"spec file {p} is a folder", hint="name a TOML or JSON file")
        if size > MAX_SPEC_BYTES:
            raise FileFormatError(
                str(p), f"{size} bytes is too large for a spec (at most {MAX_SPEC_BYTES})"
            )
        raw = p.read_bytes()
    except FileNotFoundError:
        raise InputError(f"spec file {p} does not exist") from None
    except (OSError, ValueError) as exc:
        raise InputError(
            f"cannot read spec file {p}: {getattr(exc, 'strerror', None) or exc}"
        ) from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise FileFormatError(
            str(p),
            f"not a UTF-8 text file (byte {exc.start})",
            hint="a spec is a TOML or JSON text file",
        ) from None
    if "\x00" in text:
        raise FileFormatError(
            str(p), "not a text file (NUL bytes)", hint="a spec is a TOML or JSON text file"
        )
    doc = _parse(p, text)
    if isinstance(doc, dict) and "budget" in doc:
        if "budgets" in doc:
            raise FileFormatError(str(p), "give 'budget' or 'budgets', not both")
        doc = dict(doc)
        doc["budgets"] = doc.pop("budget")
    return _Spec(str(p), choices or {}).request(doc)


def _parse(p: Path, text: str) -> Any:

    try:
        if p.suffix.lower() == ".json" or text.lstrip().startswith("{"):
            try:
                doc = json.loads(text, parse_constant=_no_constant)
            except json.JSONDecodeError as exc:
                raise FileFormatError(
                    str(p), f"invalid JSON: {exc.msg} (column {exc.colno})", line=exc.lineno
                ) from None
            except ValueError as exc:  # NaN / Infinity, or an integer too long to convert
                raise FileFormatError(str(p), f"invalid JSON: {exc}") from None
        else:
            try:
                doc = tomllib.loads(text)
            except tomllib.TOMLDecodeError as exc:
                raise FileFormatError(str(p), f"invalid TOML: {exc}") from None
            except ValueError as exc:  # an integer too long to convert
                raise FileFormatError(str(p), f"invalid TOML: {exc}") from None
    except RecursionError:
        raise FileFormatError(
            str(p), "nested too deeply", hint="a spec nests at most a few tables"
        ) from None
    if not isinstance(doc, dict):
        raise FileFormatError(
            str(p), "a spec must be a table/object of request fields", hint=_FIELDS_HINT
        )
    return doc


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a spec may hold")


_CURRENT_HINT = 'for example: [[current]] variant = "resnet50", resource = "cpu:4", count = 2'
_FIELDS_HINT = 'for example: model = "resnet", rate_rps = 40, slo_ms = 500'
