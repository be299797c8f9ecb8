#!/usr/bin/env bash
# The smoke subset (python -m pytest -m compat) on the oldest and the newest torch rlexp supports, each in a
# clean venv of its own (no system site-packages) with the marl extra: what a researcher's environment with its
# own torch and numpy meets. CI runs it (.ci/run). On Linux the package index serves CUDA builds: a venv takes
# ~5 GB and minutes to fill, so a venv of the script's own making is removed as soon as its subset has run
# (docs/architecture.md, "Torch and NumPy versions", has the measured cost and results).
#
#   scripts/compat.sh                  both, oldest first
#   scripts/compat.sh oldest           torch 2.2.2 with numpy 1.26.4 (torch 2.2's wheels need numpy < 2)
#   scripts/compat.sh newest           torch 2.14.1 with the newest numpy the range allows
#   COMPAT_VENVS=/tmp/compat scripts/compat.sh   keep the venvs there and reuse them (default: each removed after its run)
set -euo pipefail
cd "$(dirname "$0")/.."
export PIP_DISABLE_PIP_VERSION_CHECK=1 WANDB_MODE=offline WANDB_SILENT=true
declare -A PINS=([oldest]="torch==2.2.2 numpy==1.26.4" [newest]="torch==2.14.1")
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(oldest newest)
root="${COMPAT_VENVS:-}"
keep=1
if [ -z "$root" ]; then
    root="$(mktemp -d)"
    keep=0
    trap 'rm -rf "$root"' EXIT
fi
for target in "${targets[@]}"; do
    [ -n "${PINS[$target]:-}" ] || { echo "scripts/compat.sh: unknown target '$target' (oldest, newest)" >&2; exit 2; }
    read -r -a pins <<< "${PINS[$target]}"
    venv="$root/$target"
    [ -x "$venv/bin/python" ] || python -m venv "$venv"
    # the pins with the extras: a dependency may otherwise move torch (stable-baselines3 would take a newer one)
    "$venv/bin/python" -m pip install --quiet -e ".[marl]" pytest pytest-xdist pytest-cov "${pins[@]}"
    "$venv/bin/python" -c "import numpy, torch; print('$target: torch', torch.__version__, 'numpy', numpy.__version__)"
    "$venv/bin/python" -m pytest -q -m compat
    [ "$keep" = 1 ] || rm -rf "$venv"
done
