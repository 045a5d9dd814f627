#!/usr/bin/env bash
# Builds the wheelhouse of every first-party distribution: a wheel of ptrain-core and of each
# plugin under plugins/, and the core's sdist; then checks their metadata (twine check --strict).
# Usage: bash scripts/build_dists.sh [--with-examples] [OUT]   (default: dist/). Uses .venv (the
# dev extra brings build, twine and setuptools) and builds without isolation, so nothing is
# downloaded. --with-examples adds a wheel of each example plugin (examples/plugins/: not
# released; the conformance suite runs them, so scripts/gpu-check.sh --wheels wants them).
# Install from it: pip install --find-links OUT -c constraints.txt "ptrain-core[all]"
set -euo pipefail
cd "$(dirname "$0")/.."
projects=(plugins/*/*/)
if [ "${1:-}" = --with-examples ]; then
  projects+=(examples/plugins/*/)
  shift
fi
case "${1:-}" in -*)
  echo "build_dists: unknown option '$1' (usage: build_dists.sh [--with-examples] [OUT])" >&2
  exit 2 ;;
esac
out="$(mkdir -p "${1:-dist}" && cd "${1:-dist}" && pwd)"
py="${PYTHON:-.venv/bin/python}"
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
build() {  # quiet unless it fails
  if ! "$py" -m build --no-isolation --outdir "$out" "$@" >"$log" 2>&1; then
    cat "$log" >&2
    echo "build_dists: building $* failed (log above)" >&2
    exit 1
  fi
}
build --wheel --sdist .
for project in "${projects[@]}"; do
  build --wheel "$project"
done
"$py" -m twine check --strict "$out"/*.whl "$out"/*.tar.gz
echo "build_dists: $(ls "$out" | wc -l) distributions in $out"
