"""The one place greenctl builds solver objects (HiGHS, pulp's HiGHS, CBC) and reads them.

Three rules live here and nowhere else:

- **Construction.** highspy prints a two-line banner on file descriptor 1 (from C++) when a
  process constructs its first ``Highs``, before any option can silence it; ``--json`` must
  be one JSON document on stdout. :func:`new_highs` builds every HiGHS object of greenctl
  with fd 1 pointed at ``/dev/null`` around the first construction, ``output_flag`` off,
  and the process's thread count.
- **Threads.** HiGHS runs its solves on one process-wide thread pool that cannot be resized
  once started: an object asking for another thread count than the running pool's returns
  model status ``kNotset`` without solving. greenctl decides the count once
  (:data:`HIGHS_THREADS`) and every object asks for exactly that.
- **Statuses.** :func:`highs_outcome` maps HiGHS model statuses to what the planners do:
  optimal, infeasible (the caller raises its own :class:`InfeasiblePlan`), stopped at a
  limit (callers that support it keep the incumbent and its gap), and everything else a
  solver failure (exit 1), never "infeasible". :func:`pulp_outcome` does the same for
  CBC's statuses as pulp reports them.

Planners stay pure: nothing here touches the store, files or the network; CBC runs as a
child process reading a temporary model file, as pulp does it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from collections.abc import Iterator, Mapping
from typing import Any

from greenctl.data.errors import InputError, SolverError

#: HiGHS threads of every solve in this process. One: greenctl's LPs and MIPs are small
#: (simplex is serial anyway), one thread keeps MIP runs reproducible, and a pool of one
#: never competes with the executors on a shared control-plane machine.
HIGHS_THREADS = 1

#: Options :func:`new_highs` owns; callers may not pass them.
_OWNED_OPTIONS = frozenset({"threads", "output_flag", "log_to_console"})

_banner_silenced = False

OPTIMAL = "optimal"
INFEASIBLE = "infeasible"
LIMIT = "limit"

CBC_INSTALL_HINT = (
    "install CBC with `pip install 'greenctl[cbc]'` (cbcbox, what pulp's cbc extra installs) "
    "or put a cbc executable on PATH, or use --solver highs"
)


@contextlib.contextmanager
def stdout_fd_silenced() -> Iterator[None]:
    """Point file descriptor 1 at ``/dev/null`` for the block, restoring it even on error.

    For output written by C/C++ libraries straight to fd 1 (``sys.stdout`` redirection does
    not reach it). Python's and C's buffers are flushed first and last so nothing written
    before the block is lost or lands inside it.
    """
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    try:
        saved = os.dup(1)
    except OSError:  # no fd 1 at all: nothing to protect
        yield
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        _flush_c_stdio()
        os.dup2(null, 1)
        yield
    finally:
        _flush_c_stdio()
        os.dup2(saved, 1)
        os.close(saved)
        os.close(null)


def _flush_c_stdio() -> None:
    """``fflush(NULL)``: C's stdout buffer (full buffering on a pipe) goes out now."""
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except Exception:  # no C library to reach (some platforms): the dup2 still holds
        pass


def new_highs(options: Mapping[str, object] | None = None) -> Any:  # -> highspy.Highs
    """A ``highspy.Highs`` for greenctl: silent, on the process's thread count.

    Every HiGHS object of greenctl is built here (pulp's too, see :func:`pulp_highs`).

    Args:
        options: HiGHS options for this object (``presolve``, ``time_limit``, ...); the
            thread count and output options are this module's.

    Raises:
        ValueError: an option that is not HiGHS's, or one this module owns (a bug).
    """
    import highspy

    global _banner_silenced
    if _banner_silenced:
        h = highspy.Highs()
    else:
        # the banner comes once per process, at the first construction
        with stdout_fd_silenced():
            h = highspy.Highs()
        _banner_silenced = True
    _set(h, "output_flag", False)
    _set(h, "threads", HIGHS_THREADS)
    for key, value in (options or {}).items():
        if key in _OWNED_OPTIONS:
            raise ValueError(f"HiGHS option {key!r} is set by greenctl.planner.core.solvers")
        _set(h, key, value)
    return h


def _set(h: Any, key: str, value: object) -> None:
    import highspy

    if h.setOptionValue(key, value) == highspy.HighsStatus.kError:
        raise ValueError(f"HiGHS refused option {key}={value!r}")


def highs_outcome(h: Any, *, what: str, limits: bool = False) -> str:
    """What a HiGHS run came to, from its model status.

    Args:
        h: a ``highspy.Highs`` after ``run()``.
        what: the problem, for the error message ("the geo LP", ...).
        limits: True where the caller keeps an incumbent found before a time or iteration
            limit (with its gap); otherwise stopping at a limit is a failure.

    Returns:
        :data:`OPTIMAL`; :data:`INFEASIBLE` (the caller raises its own ``InfeasiblePlan``
        naming the binding constraint); with ``limits``, :data:`LIMIT` (time or iteration
        limit, or an interrupt: look at the primal solution status for an incumbent).

    Raises:
        GreenctlError: any other status (not set, solve error, unbounded, unknown ...):
            the solver failed, exit code 1.
    """
    import highspy

    ms = highspy.HighsModelStatus
    st = h.getModelStatus()
    if st == ms.kOptimal:
        return OPTIMAL
    # greenctl's models are bounded (every column that improves the objective has a finite
    # bound or is tied to one by its rows), so "infeasible or unbounded" is infeasible
    if st in (ms.kInfeasible, ms.kUnboundedOrInfeasible):
        return INFEASIBLE
    if limits and st in (ms.kTimeLimit, ms.kIterationLimit, ms.kInterrupt):
        return LIMIT
    raise solver_failed(what, f"HiGHS model status '{h.modelStatusToString(st)}'", st == ms.kNotset)


def solver_failed(what: str, status: str, not_run: bool = False) -> SolverError:
    """The error of a solver that stopped without an answer (exit 1, not an infeasible plan)."""
    hint = "this is a solver failure, not an infeasible plan; please report it with the command"
    if not_run:
        hint = (
            "HiGHS did not solve (in a process that embeds greenctl, another HiGHS user may "
            f"have started HiGHS's thread pool with a size other than {HIGHS_THREADS}); " + hint
        )
    return SolverError(f"the solver failed on {what}: {status}", hint=hint)


def pulp_highs(options: Mapping[str, object] | None = None) -> Any:  # -> pulp.HiGHS
    """pulp's HiGHS interface (highspy in this process) on an object from :func:`new_highs`.

    After ``prob.solve(solver)``, ``prob.solverModel`` is that ``Highs``: read its status
    with :func:`highs_outcome`.
    """
    import pulp

    class GreenctlHiGHS(pulp.HiGHS):  # type: ignore[misc, valid-type]
        def createAndConfigureSolver(self, lp: Any) -> None:
            lp.solverModel = new_highs(options)

    return GreenctlHiGHS(msg=False)


def find_cbc() -> str | None:
    """A CBC executable: the ``cbcbox`` package (``pulp[cbc]``), else ``cbc`` on PATH, else
    the copy PuLP 3 bundles (PuLP 4 drops it); None when there is none."""
    try:
        import cbcbox

        with stdout_fd_silenced():  # cbcbox prints the build it picked when asked to
            path = str(cbcbox.cbc_bin_path())
        if os.access(path, os.X_OK):
            return path
    except Exception:  # not installed, or no build for this machine
        pass
    on_path = shutil.which("cbc")
    if on_path:
        return on_path
    try:
        from pulp.apis import coin_api
    except ImportError:
        return None
    bundled = getattr(coin_api, "pulp_cbc_path", None)
    if bundled:
        bundled = coin_api.COIN_CMD.executableExtension(bundled)
        if os.path.isfile(bundled) and os.access(bundled, os.X_OK):
            return str(bundled)
    return None


def require_cbc() -> str:
    """The CBC executable's path.

    Raises:
        InputError: no CBC is installed (``--solver cbc`` cannot run here).
    """
    path = find_cbc()
    if path is None:
        raise InputError("--solver cbc: no CBC solver is installed", hint=CBC_INSTALL_HINT)
    return path


def cbc_solver(
    *, time_limit_s: float | None, gap_rel: float, gap_abs: float
) -> Any:  # -> pulp.COIN_CMD
    """pulp's CBC command (a child process, its output discarded), one thread.

    Raises:
        InputError: no CBC is installed.
    """
    import pulp

    return pulp.COIN_CMD(
        path=require_cbc(),
        msg=False,
        timeLimit=time_limit_s,
        gapRel=gap_rel,
        gapAbs=gap_abs,
        threads=1,
    )


def pulp_solve(prob: Any, solver: Any, *, what: str) -> None:
    """``prob.solve(solver)`` with pulp's failures (CBC crashed, not runnable) as greenctl's."""
    import pulp

    try:
        prob.solve(solver)
    except pulp.PulpSolverError as exc:
        raise solver_failed(what, f"{solver.name}: {exc}") from None


def pulp_outcome(prob: Any, *, what: str, time_limit_s: float | None) -> str:
    """What a pulp solve (CBC) came to: :data:`OPTIMAL`, :data:`INFEASIBLE` or
    :data:`LIMIT` (stopped at the time limit; ``prob.sol_status`` says whether with an
    incumbent).

    Raises:
        GreenctlError: unbounded, undefined, or not solved without a time limit to blame.
    """
    import pulp

    sol = prob.sol_status
    if prob.status == pulp.LpStatusInfeasible or sol == pulp.LpSolutionInfeasible:
        return INFEASIBLE
    if sol == pulp.LpSolutionOptimal:
        return OPTIMAL
    if sol == pulp.LpSolutionIntegerFeasible:
        return LIMIT
    if prob.status == pulp.LpStatusNotSolved and time_limit_s is not None:
        return LIMIT
    raise solver_failed(what, f"pulp status '{pulp.LpStatus.get(prob.status, prob.status)}'")
