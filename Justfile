# greenctl developer recipes

default:
    @just --list

# run the whole test suite
test *ARGS:
    python -m pytest -q {{ARGS}}

# lint (ruff) and type-check the library (mypy) as the package greenctl: .mypy_pkg/greenctl/<folder>
# links to each code folder (the view [tool.mypy] reads); one package: `mypy -p greenctl.data`
lint:
    ruff check .
    ruff format --check .
    mkdir -p .mypy_pkg/greenctl
    for d in cli data planner profiler executor; do ln -sfn "../../$d" ".mypy_pkg/greenctl/$d"; done
    mypy

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

# the fuzzers, deeper: HYPOTHESIS_PROFILE=deep runs 20 times the examples of a CI run
fuzz *ARGS:
    HYPOTHESIS_PROFILE=deep GREENCTL_FUZZ_SCALE=20 python -m pytest -q -n 2 -p no:cacheprovider tests/cli/test_cli_fuzz.py tests/data/test_carbon_fuzz.py tests/data/test_geo_fuzz.py tests/data/test_import_fuzz.py tests/data/test_plan_fuzz.py tests/data/test_profile_fuzz.py {{ARGS}}

# the five papers' headline figures (docs/reproductions.md): its benches, about 5 minutes on 2 cores
reproduce *ARGS:
    python bench/reproduce.py {{ARGS}}
