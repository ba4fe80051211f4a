"""The README and docs/ cannot drift from the tool.

- The README's tour (the one ``bash`` block under its "Tour" heading) runs, command by
  command, as real processes in a scratch folder with a fresh store; each line's trailing
  comment quotes text its output must show.
- Every ``greenctl ...`` command shown in a code block of the README or docs/ resolves to a
  subcommand whose ``--help`` lists each option it uses.
- Every relative link in the README and docs/ points at a file that exists.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer

from tests.conftest import free_port

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
DOC_FILES = [README, *sorted(DOCS.glob("**/*.md"))]

# The tour's dispatcher port; the test swaps in a free one so that it never collides.
TOUR_PORT = "8321"

FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
EXPECT = re.compile(r'\s+#\s*"([^"]+)"\s*$')


def tour_lines() -> list[tuple[str, str]]:
    """(command, expected text) for each line of the README's tour block."""
    text = README.read_text()
    head = re.search(r"^## Tour\b.*$", text, re.M)
    assert head, "README has no '## Tour' heading"
    section = text[head.end() :]
    section = section[: m.start()] if (m := re.search(r"^## ", section, re.M)) else section
    blocks = [body for lang, body in FENCE.findall(section) if lang == "bash"]
    assert len(blocks) == 1, "the tour is one ```bash block under '## Tour'"
    lines = []
    for raw in blocks[0].splitlines():
        if not raw.strip() or raw.lstrip().startswith("#"):
            continue
        m = EXPECT.search(raw)
        assert m, f'tour line without an expected "text" comment: {raw}'
        lines.append((raw[: m.start()].strip(), m.group(1)))
    return lines


def _greenctl() -> str:
    exe = Path(sys.executable).parent / "greenctl"
    return str(exe) if exe.exists() else "greenctl"


@pytest.mark.slow
def test_readme_tour_runs_in_order(tmp_path: Path) -> None:
    lines = tour_lines()
    names = [shlex.split(cmd)[1] for cmd, _ in lines]
    for step in ("profile", "plan", "simulate", "apply", "loadgen", "replan", "replay"):
        assert step in names, f"the tour leaves out `greenctl {step}`"
    assert names[-1] == "down", "the tour ends with `greenctl down`"
    env = dict(os.environ, GREENCTL_DB=str(tmp_path / "tour.db"), COLUMNS="80")
    env.pop("GREENCTL_STATE_DIR", None)
    port = str(free_port())
    exe = _greenctl()

    def run(cmd: str) -> str:
        argv = [arg.replace(TOUR_PORT, port) for arg in shlex.split(cmd)]
        assert argv[0] == "greenctl", f"tour line is not a greenctl command: {cmd}"
        proc = subprocess.run(
            [exe, *argv[1:]],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0, f"`{cmd}` exited {proc.returncode}:\n{out}"
        return out

    try:
        for cmd, expected in lines:
            out = run(cmd)
            flat = " ".join(out.split())
            assert expected in flat, f"`{cmd}` no longer shows {expected!r}:\n{out}"
    finally:
        subprocess.run(
            [exe, "down"], cwd=tmp_path, env=env, capture_output=True, timeout=120, check=False
        )


def test_tour_lines_are_read() -> None:
    lines = tour_lines()
    assert lines[0][0].startswith("greenctl ")
    assert all(exp for _, exp in lines)


# --- every command shown parses -------------------------------------------------------


def shown_commands() -> list[tuple[Path, str]]:
    """Each ``greenctl ...`` command in a code block, continuation lines joined."""
    found = []
    for path in DOC_FILES:
        for _lang, body in FENCE.findall(path.read_text()):
            body = re.sub(r"\\\n\s*", " ", body)
            for line in body.splitlines():
                # a command ends where two spaces or a comment start its description
                line = re.split(r"\s{2,}|\s#", line.strip())[0]
                if line.startswith("greenctl "):
                    found.append((path, line))
    return found


def _root() -> Any:
    """The click command behind the typer app (typer may vendor its own click)."""
    from greenctl.cli.main import app

    return typer.main.get_command(app)


def click_context(cmd: Any) -> Any:
    """A context for asking a group about its subcommands (the group's own click)."""
    return cmd.context_class(cmd)


def _resolve(root: Any, words: list[str]) -> tuple[Any, list[str]]:
    """The subcommand a command line names, and the option names it uses."""
    cmd, i = root, 0
    path: list[str] = []
    options: list[str] = []
    while i < len(words):
        w = words[i]
        if w == "--db" and cmd is root:  # the root's own option and its value
            i += 1
        elif w.startswith("-"):
            options.append(w.split("=")[0])
        elif getattr(cmd, "commands", None) is not None and not options:
            # get_command, not the static table: a group may make its subcommands (replay K)
            sub = cmd.get_command(click_context(cmd), w)
            if sub is None and getattr(cmd, "invoke_without_command", False):
                break
            assert sub is not None, f"unknown command `{' '.join([*path, w])}`"
            cmd, path = sub, [*path, w]
        i += 1
    options += [w.split("=")[0] for w in words[i:] if w.startswith("-")]
    return cmd, options


def test_every_shown_command_parses() -> None:
    root = _root()
    commands = shown_commands()
    assert len(commands) > 40, "the docs' commands are not being found"
    problems = []
    for path, line in commands:
        words = [w for w in shlex.split(line.replace("|", " "))[1:] if w not in "[]"]
        words = [w.strip("[]") for w in words]
        try:
            cmd, options = _resolve(root, words)
        except AssertionError as exc:
            problems.append(f"{path.name}: {line}: {exc}")
            continue
        accepted = {o for p in cmd.params for o in (*p.opts, *p.secondary_opts)}
        accepted |= {"--help", "--db"} if cmd is root else {"--help"}
        for opt in options:
            if opt == "--":  # what follows is another command's (cron install)
                break
            if not re.match(r"-\d", opt) and opt not in accepted:
                problems.append(f"{path.name}: {line}: {opt} is not an option of it")
    assert not problems, "\n".join(problems)


def test_parse_check_catches_a_wrong_option() -> None:
    cmd, options = _resolve(_root(), ["plan", "mix", "--model", "tiny", "--no-such"])
    assert cmd.name == "mix"
    assert "--no-such" in options
    assert "--no-such" not in {o for p in cmd.params for o in p.opts}


# --- links -----------------------------------------------------------------------------

LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_relative_links_resolve() -> None:
    broken = []
    for path in DOC_FILES:
        text = FENCE.sub("", path.read_text())
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            file = target.split("#")[0]
            if not (path.parent / file).exists():
                broken.append(f"{path.relative_to(REPO)} -> {target}")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_no_reference_outside_the_repository() -> None:
    for path in DOC_FILES:
        assert "../" + "shared" not in path.read_text(), f"{path.name} points outside the project"
