#!/usr/bin/env bash
# Build one virtual environment with a given torch and this project's dependencies, for run_matrix.sh.
#   tests/compat/build_venv.sh 2.4.1        -> $VENV_ROOT/torch-2.4.1+cu   the package index's wheel (CUDA on Linux)
#   tests/compat/build_venv.sh 2.13.0+cpu   -> $VENV_ROOT/torch-2.13.0+cpu a CPU build (local wheel or PyTorch's CPU index)
# VENV_ROOT defaults to /work/venvs. The project itself is not installed: run_matrix.sh runs it from this tree
# (PYTHONPATH), so one venv serves every change to the code.
set -euo pipefail
spec=$1
root=${VENV_ROOT:-/work/venvs}
tree=$(cd "$(dirname "$0")/../.." && pwd)
version=${spec%+cpu}
if [[ $spec == *+cpu ]]; then
  venv=$root/torch-$version+cpu
  want=("torch==$version+cpu")
  pip_env=(env)
else
  venv=$root/torch-$version+cu
  want=("torch==$version")
  # the package index's wheel, not a CPU wheel a local find-links folder may offer under the same version
  pip_env=(env -u PIP_FIND_LINKS PIP_CONFIG_FILE=/dev/null)
fi
if [[ -x $venv/bin/python ]] && "$venv/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$version')" 2>/dev/null; then
  echo "$venv: torch $version already there"; exit 0
fi
rm -rf "$venv"
python3 -m venv "$venv"
"${pip_env[@]}" "$venv/bin/pip" install -q "${want[@]}" "$tree[test]"
"$venv/bin/pip" uninstall -q -y comm2perfetto
"$venv/bin/python" -c "import torch; print('$venv: torch', torch.__version__)"
