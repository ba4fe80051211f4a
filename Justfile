# greenctl developer recipes

default:
    @just --list

# run the whole test suite
test *ARGS:
    python -m pytest -q {{ARGS}}

# lint (ruff) and type-check the library (mypy)
lint:
    ruff check .
    ruff format --check .
    mypy cli data planner profiler executor

# format the code
fmt:
    ruff format .
    ruff check --fix .

# the whole loop on embedded defaults
demo:
    greenctl demo

# benchmarks: each prints figures and ratios against a baseline measured in the same run
bench:
    for f in bench/bench_*.py; do echo "== $f"; python "$f" || exit 1; done

# build the documentation site strictly (a broken link fails) into site/; `mkdocs serve` to browse
docs:
    mkdocs build --strict
