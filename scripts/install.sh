#!/usr/bin/env bash
# Creates ./.venv (if missing) and installs, editable, the core and every plugin distribution in this
# repository, with torch pinned by constraints.txt so that no CUDA build is ever pulled.
# Usage: bash scripts/install.sh   (the dev extra brings Lightning 2.6.6, the peer that tests
# and benchmarks compare with)
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv
py=.venv/bin/python
$py -m pip install -q --upgrade pip >/dev/null
$py -m pip install -q torch==2.13.0
dists=(-e ".[dev]")
for project in plugins/*/*/pyproject.toml examples/plugins/*/pyproject.toml; do
  [ -f "$project" ] || continue
  # a distribution's `test` extra (e.g. ptrain-mlflow's: the full mlflow, for a real server)
  if grep -q '^test = ' "$project"; then
    dists+=(-e "$(dirname "$project")[test]")
  else
    dists+=(-e "$(dirname "$project")")
  fi
done
# setuptools says "Editable installation" once per distribution: nothing to act on
PYTHONWARNINGS="ignore:Editable installation" \
  $py -m pip install -q -c constraints.txt "${dists[@]}"
