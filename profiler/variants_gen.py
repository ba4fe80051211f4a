"""Variant generation (INFaaS's generator) for the user's own model.

From one model (``--model-path``) :func:`generate` makes the variants of family ``NAME``:
``NAME-torch`` (eager fp32, the model as given), ``NAME-onnx`` (exported, run by ONNX
Runtime), ``NAME-int8`` (ONNX Runtime static int8, calibrated on the evaluation data) and,
with a CUDA GPU, ``NAME-fp16``/``NAME-bf16``; measures each one's accuracy on the user's
evaluation data, writes the files it made beside the store (content-addressed, atomically),
profiles each with the profiler's own harness and stores variants and profiles together. A
variant that cannot be made or run is skipped with its reason. :func:`prepare_generate`
checks everything that is the user's to get right before anything is written.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from greenctl.data.errors import GreenctlError, InputError, shown
from greenctl.data.records import Profile, Variant
from greenctl.profiler.eval_data import (
    EvalData,
    accuracy,
    check_labels,
    load_eval,
    metric_function,
    outputs_of,
)
from greenctl.profiler.models import (
    DTYPES,
    build_module,
    builtin_families,
    builtin_variants,
    load_model,
    one_line_error,
    parse_input_shape,
    user_model_source,
    with_dtype,
)
from greenctl.profiler.onnx_engine import (
    ONNX_PREFIX,
    export_onnx,
    onnxruntime_available,
    onnxruntime_cuda,
    quantize_int8,
)
from greenctl.profiler.options import ProfileOptions
from greenctl.profiler.progress import Progress, no_progress

if TYPE_CHECKING:
    from greenctl.data.store import Store
    from greenctl.profiler.hw import Inventory

#: every format, in the order they are made; the suffix of its variant's name
FORMATS = ("torch", "onnx", "int8", "fp16", "bf16")
#: formats torch runs on a CUDA GPU only (half precisions), and their torch dtype names
GPU_FORMATS = {"fp16": DTYPES[0], "bf16": DTYPES[1]}
ONNX_FORMATS = ("onnx", "int8")
#: evaluation samples the int8 quantizer calibrates activation ranges on
CALIBRATION_SAMPLES = 64
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def models_dir(store_path: Path) -> Path:
    """Where generated model files live: a folder beside the store file
    (``greenctl.db`` -> ``greenctl-models/``)."""
    return store_path.parent / f"{store_path.stem}-models"


def cuda_available() -> bool:
    """Whether torch sees a CUDA GPU (the half-precision formats need one)."""
    import torch

    return bool(torch.cuda.is_available())


def available_formats(*, gpus: bool) -> list[str]:
    """The formats this machine can make and run: torch; onnx and int8 with onnxruntime;
    fp16 and bf16 when profiling on GPUs (``gpus``) and torch sees a CUDA GPU."""
    out = ["torch"]
    if onnxruntime_available():
        out += list(ONNX_FORMATS)
    if gpus and cuda_available():
        out += list(GPU_FORMATS)
    return out


def parse_formats(text: str | None, *, gpus: bool = False) -> tuple[str, ...]:
    """``--formats torch,onnx`` -> the formats in :data:`FORMATS` order; None: every one
    this machine can run (:func:`available_formats`).

    Raises:
        InputError: an unknown format, or one this machine cannot run (names why).
    """
    can = available_formats(gpus=gpus)
    if text is None:
        return tuple(can)
    asked = [p.strip().lower() for p in text.split(",") if p.strip()]
    if not asked:
        raise InputError("--formats is empty", hint=f"for example --formats {','.join(can)}")
    for fmt in asked:
        if fmt not in FORMATS:
            raise InputError(
                f"--formats: '{shown(fmt)}' is not a format",
                hint=f"formats: {', '.join(FORMATS)} (this machine runs {', '.join(can)})",
            )
        if fmt not in can:
            why = "onnxruntime is not installed (pip install onnxruntime onnx)"
            if fmt in GPU_FORMATS:
                why = "it runs on a CUDA GPU: give --gpus" if not gpus else "torch sees no GPU"
            raise InputError(
                f"--formats {fmt}: this machine cannot run it ({why})",
                hint=f"this machine runs {', '.join(can)}",
            )
    return tuple(f for f in FORMATS if f in asked)


def check_family_name(name: str) -> str:
    """The family name of the generated variants (``--name``), checked.

    Raises:
        InputError: empty, not a plain name, or a built-in family or variant's name.
    """
    if not _NAME_RE.fullmatch(name or ""):
        raise InputError(
            f"--name {shown(name)}: use letters, digits, '.', '_' and '-' (starting with a "
            "letter or digit)",
            hint="for example --name mynet",
        )
    builtin = set(builtin_families()) | {v.name for v in builtin_variants()}
    taken = sorted({name, *(f"{name}-{f}" for f in FORMATS)} & builtin)
    if taken:
        raise InputError(
            f"--name {name}: {', '.join(taken)} is built in", hint="choose another --name"
        )
    return name


@dataclass
class GeneratePlan:
    """A generation checked by :func:`prepare_generate`: nothing written yet."""

    name: str
    source: str
    input_shape: tuple[int, ...]
    formats: tuple[str, ...]
    module: Any  # the user's torch module, fp32 on the CPU
    data: EvalData
    metric: Callable[[Any, Any], Any] | None
    metric_spec: str | None
    options: ProfileOptions
    inventory: Inventory
    params: int


@dataclass
class GeneratedVariant:
    """One variant made: its record (accuracy measured), format, file and its size."""

    variant: Variant
    format: str
    file: str | None = None
    size_bytes: int | None = None


@dataclass
class GenerateResult:
    """What :func:`generate` made and stored, and what it skipped with the reasons."""

    made: list[GeneratedVariant] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    profiles: list[Profile] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def prepare_generate(
    *,
    name: str,
    model_path: str,
    input_shape: str | None,
    eval_spec: str,
    options: ProfileOptions,
    metric: str | None = None,
    formats: str | None = None,
    weights: str | None = None,
) -> GeneratePlan:
    """Check a generation before anything is written: the name, formats, profiling options,
    the model (built once), the evaluation data and metric (scored on the model as given).

    Raises:
        InputError: any of them is the user's to fix (names which and how).
    """
    from greenctl.profiler.hw import discover
    from greenctl.profiler.run_plan import plan_runs

    family = check_family_name(name)
    shape = parse_input_shape(input_shape)
    chosen = parse_formats(formats, gpus=options.gpus)
    options.check()
    source = user_model_source(model_path, weights=weights)
    module = build_module(Variant(name=f"{family}-torch", family=family, source=source)).eval()
    data = load_eval(eval_spec, shape)
    fn = metric_function(metric)
    inventory = discover(backend=True if options.gpus else None)
    params = sum(int(p.numel()) for p in module.parameters())
    plan = GeneratePlan(
        family, source, shape, chosen, module, data, fn, metric, options, inventory, params
    )
    reference = _variant(plan, "torch", source)
    plan_runs(plan.inventory, [reference], cpus=options.cpus, gpus=options.gpus, batches=[1])
    loaded = _loaded(reference, module, shape)
    try:
        outputs = outputs_of(loaded, data)
    except Exception as exc:  # the user's model on the user's data
        raise InputError(
            f"model {model_path} failed on --eval {eval_spec}: {one_line_error(exc)}",
            hint="the evaluation inputs must be what the model takes, batch dimension first",
        ) from None
    if fn is None:
        check_labels(outputs, data)
    accuracy(outputs, data, fn)  # a metric that fails or answers junk: refused now
    return plan


def _loaded(variant: Variant, module: Any, shape: tuple[int, ...]) -> Any:
    """The already-built fp32 module as a loaded variant (not built a second time)."""
    from greenctl.profiler.models import LoadedModel

    return LoadedModel(variant, module, shape, "cpu")


def _variant(plan: GeneratePlan, fmt: str, source: str, **facts: Any) -> Variant:
    """The record of format ``fmt``'s variant (accuracy and sizes in ``facts``)."""
    return Variant(
        name=f"{plan.name}-{fmt}",
        family=plan.name,
        source=source,
        input_shape=",".join(map(str, plan.input_shape)),
        params=plan.params,
        accuracy_metric=plan.metric_spec or "top1",
        accuracy_source=f"measured on --eval {plan.data.spec} ({plan.data.samples} samples)",
        **facts,
    )


def store_file(data: bytes, folder: Path, suffix: str) -> tuple[Path, bool]:
    """Write ``data`` into ``folder`` as ``<sha256>.<suffix>``, atomically (a temporary file
    renamed into place); returns the path and whether this call created it (the same bytes
    stored before are not written again)."""
    digest = hashlib.sha256(data).hexdigest()
    path = folder / f"{digest}.{suffix}"
    if path.is_file():
        return path, False
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".partial-", suffix=f".{suffix}")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path, True


def _make(plan: GeneratePlan, fmt: str, work: Path) -> tuple[str, bytes | None]:
    """Format ``fmt``'s source, and the bytes of the file it runs (None: the user's model).

    ONNX files are made in ``work`` (a scratch folder) and only their bytes come back.
    """
    if fmt == "torch":
        return plan.source, None
    if fmt in GPU_FORMATS:
        return with_dtype(plan.source, GPU_FORMATS[fmt]), None
    fp32 = work / "model.onnx"
    if not fp32.is_file():
        export_onnx(plan.module, plan.input_shape, fp32)
    if fmt == "onnx":
        return ONNX_PREFIX, fp32.read_bytes()
    out = work / "model.int8.onnx"
    quantize_int8(fp32, out, _calibration(plan.data))
    return ONNX_PREFIX, out.read_bytes()


def _calibration(data: EvalData) -> list[Any]:
    """The first :data:`CALIBRATION_SAMPLES` evaluation inputs, in their batches."""
    out, n = [], 0
    for x in data.inputs:
        if n >= CALIBRATION_SAMPLES:
            break
        out.append(x[: CALIBRATION_SAMPLES - n])
        n += int(out[-1].shape[0])
    return out


def _device(fmt: str) -> str:
    return "cuda:0" if fmt in GPU_FORMATS else "cpu"


def make_variants(
    plan: GeneratePlan, folder: Path, result: GenerateResult, *, progress: Progress = no_progress
) -> None:
    """Make every format's variant into ``result``, write its file into ``folder`` and
    measure its accuracy; a format that fails (export, quantization, loading, running) is
    skipped with the reason. Files this call created are listed in ``result.files`` as they
    are written (the caller removes them on failure)."""
    with tempfile.TemporaryDirectory(prefix="greenctl-variants-") as scratch:
        for k, fmt in enumerate(plan.formats):
            name = f"{plan.name}-{fmt}"
            progress(f"making {name}", k / len(plan.formats))
            try:
                source, blob = _make(plan, fmt, Path(scratch))
                path = None
                if blob is not None:
                    path, created = store_file(blob, folder, "onnx")
                    if created:
                        result.files.append(str(path))
                    source = f"{ONNX_PREFIX}{path}"
                variant = _variant(plan, fmt, source)
                loaded = load_model(variant, device=_device(fmt))
                score = accuracy(outputs_of(loaded, plan.data), plan.data, plan.metric)
            except OSError as exc:  # the models folder: a fault of the machine, not the format
                raise GreenctlError(f"cannot write {folder}: {exc.strerror or exc}") from None
            except Exception as exc:  # exporter, quantizer, ORT: each raises its own types
                result.skipped.append((name, _reason(exc)))
                continue
            size = len(blob) if blob is not None else None
            mb = round((size or plan.params * (2 if fmt in GPU_FORMATS else 4)) / 2**20, 3)
            variant = replace(variant, accuracy=round(score, 6), memory_mb=mb)
            result.made.append(GeneratedVariant(variant, fmt, str(path) if path else None, size))


def _reason(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, GreenctlError) else one_line_error(exc)


def profile_variants(
    store: Store, plan: GeneratePlan, made: GenerateResult, *, progress: Progress = no_progress
) -> None:
    """Profile every made variant with the profiler's harness (the options of ``greenctl
    profile``), then store variants and profiles in one transaction. A variant whose
    measurement fails is dropped from ``made`` and listed as skipped."""
    from greenctl.profiler.harness import ProfileResult, prepare_profile, run_items, save_result

    total = ProfileResult([], [], [])
    opts = plan.options
    kept = []
    for k, item in enumerate(made.made):
        progress(f"profiling {item.variant.name}", k / max(len(made.made), 1))
        fmt_opts = _options_for(opts, item)
        if fmt_opts is None:
            made.skipped.append(
                (item.variant.name, "this onnxruntime has no CUDA, and no --cpus to measure on")
            )
            continue
        try:
            run = prepare_profile(store, fmt_opts, inventory=plan.inventory)
            got = run_items(
                run.items, duration_s=opts.duration_s, requests=opts.requests, warmup=opts.warmup
            )
        except Exception as exc:  # the harness on a new engine or precision
            made.skipped.append((item.variant.name, _reason(exc)))
            continue
        kept.append(item)
        total.variants += [item.variant]
        total.profiles += got.profiles
        made.notes += [n for n in got.notes if n not in made.notes]
    made.made = kept
    if kept:
        save_result(store, total)
        made.profiles = [p for p, _hw in total.profiles]


def _options_for(opts: ProfileOptions, item: GeneratedVariant) -> ProfileOptions | None:
    """The profiling options of one variant: half precisions on the GPUs only; ONNX variants
    on the GPUs only where onnxruntime has CUDA (None: nothing left to measure them on)."""
    out = replace(opts, user=item.variant)
    if item.format in GPU_FORMATS:
        return replace(out, cpus=())
    if item.format in ONNX_FORMATS and opts.gpus and not onnxruntime_cuda():
        return replace(out, gpus=False, emulate_mig=False) if opts.cpus else None
    return out


def generate(
    store: Store,
    plan: GeneratePlan,
    *,
    folder: Path | None = None,
    progress: Progress = no_progress,
) -> GenerateResult:
    """Make, evaluate, write, profile and store the variants of ``plan``.

    Files go into ``folder`` (default :func:`models_dir` of the store). Nothing is stored
    and every file this call created is removed again when it fails or makes no variant.

    Raises:
        InputError: no variant could be made (lists each one's reason).
        GreenctlError: the models folder or the store cannot be written.
    """
    # absolute: executors load the file from their own folder
    target = (folder if folder is not None else models_dir(store.path)).resolve()
    result = GenerateResult()
    try:
        make_variants(plan, target, result, progress=progress)
        if result.made:
            profile_variants(store, plan, result, progress=progress)
        if not result.made:
            reasons = "; ".join(f"{n}: {why}" for n, why in result.skipped)
            raise InputError(
                f"no variant of {plan.name} could be made: {reasons}",
                hint="see each reason; --formats chooses which formats to make",
            )
    except BaseException:
        for f in result.files:
            Path(f).unlink(missing_ok=True)
        raise
    used = {g.file for g in result.made}
    for f in [f for f in result.files if f not in used]:
        Path(f).unlink(missing_ok=True)  # the file of a variant skipped after it was written
    result.files = [f for f in result.files if f in used]
    progress("done", 1.0)
    return result
