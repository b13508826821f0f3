#!/usr/bin/env bash
# The one GPU run of issue 26: real NCCL recordings and their checks, the costs, tests/gpu, and what comes back.
#
#   bash tests/gpu/device_check.sh            # on the device machine (carry: [".gpu-wheels"]); OUT is set there
#   PYTHON=.venv/bin/python bash tests/gpu/device_check.sh   # here, without a GPU: a dry run on gloo
#
# Needs: a Python with torch (first of $PYTHON, /opt/torch/.venv/bin/python3, python3 that imports it); orjson,
# nvtx and perfetto importable or as wheels in .gpu-wheels/ (bash tests/gpu/wheels.sh fetches them, and protobuf,
# where PyPI is reachable).
# The package runs from src/ (PYTHONPATH), so nothing is built. Without CUDA+NCCL it runs the same jobs on gloo
# (C2P_GPU_CHECK_CPU=1) and GPU-only checks SKIP: the plumbing is exercised, not the hardware.
#
# Steps, each under `timeout` and inside one overall budget (C2P_BUDGET seconds, default 400, with time kept for
# packing), each logged to $WORK/logs/<step>.log and teed here; a failing step does not stop the next:
#   setup      nvidia-smi, torch/NCCL versions, the dump functions' signatures, wheels installed
#   record     tests/gpu/device_check.py record-all: healthy DDP (--profile-steps, NVTX domains), held async
#              all_reduce + batch isend/irecv (--stall-after 2), CUDA graph capture (--sync, small ring), --sync,
#              --no-gpu-timing; diagnose/report/merge on each; PASS/FAIL lines
#   costs      tests/gpu/jobs/costs.py: per-call overhead, dump wall time and GIL hold, NCCL timing on/off
#   pytest     python -m pytest tests/gpu -v (COMM2PERFETTO_SAVE_FIXTURES keeps its jobs' folders)
#   pack       $OUT/fixtures.tgz (small real artefacts), $OUT/summary.txt (printed last), $OUT/results.json
# $OUT/logs.tgz is refreshed after every step, so a run cut short still brings its logs back.
set -u
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.." || exit 2
REPO=$PWD
START=$(date +%s)
BUDGET=${C2P_BUDGET:-400}
PACK_RESERVE=40
export OUT=${OUT:-$REPO/.device-out}
export C2P_WORK=${C2P_WORK:-$(mktemp -d /tmp/c2p-gpu.XXXXXX)}
WORK=$C2P_WORK
LOGS=$WORK/logs
mkdir -p "$OUT" "$LOGS"
STEPS_FILE=$WORK/steps.tsv
: > "$STEPS_FILE"

elapsed() { echo $(( $(date +%s) - START )); }
say() { echo "[$(date +%H:%M:%S) +$(elapsed)s] $*"; }
save_logs() { tar czf "$OUT/logs.tgz" -C "$WORK" logs steps.tsv $( [ -f "$WORK/results.json" ] && echo results.json ) 2>/dev/null; }

# step NAME CAP_SECONDS CMD...: run under timeout (the cap, or what the budget has left), tee to logs/NAME.log
step() {
  local name=$1 cap=$2; shift 2
  local left=$(( BUDGET - PACK_RESERVE - $(elapsed) ))
  [ "$name" = pack ] && left=$(( BUDGET + 60 - $(elapsed) ))
  local limit=$(( cap < left ? cap : left ))
  if [ "$limit" -lt 10 ]; then
    say "step $name: SKIPPED, no time left in the budget"
    printf '%s\tskipped\t0\n' "$name" >> "$STEPS_FILE"
    return
  fi
  say "step $name (limit ${limit}s)"
  local t0=$(date +%s)
  timeout -k 10 "$limit" "$@" 2>&1 | tee "$LOGS/$name.log"
  local rc=${PIPESTATUS[0]}
  local took=$(( $(date +%s) - t0 ))
  [ "$rc" = 124 ] && say "step $name: TIMED OUT after ${took}s" || say "step $name: exit $rc after ${took}s"
  printf '%s\t%s\t%s\n' "$name" "$rc" "$took" >> "$STEPS_FILE"
  save_logs
}

# --- the Python with torch -------------------------------------------------------------------------------------
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  for candidate in /opt/torch/.venv/bin/python3 python3 python; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c "import torch" >/dev/null 2>&1; then
      PY=$(command -v "$candidate"); break
    fi
  done
fi
if [ -z "$PY" ]; then say "no Python with torch found (set PYTHON)"; exit 2; fi
export PYTHON=$PY

# --- orjson, nvtx, perfetto: importable, or installed from the carried wheels -------------------------------
SITE=$WORK/site
export PYTHONPATH=$REPO/src:$SITE${PYTHONPATH:+:$PYTHONPATH}
WHEELS=${C2P_WHEELS:-$REPO/.gpu-wheels}
# install_wheels: orjson, nvtx and perfetto where the Python cannot import them, from the carried wheels; protobuf
# too where perfetto's generated protos refuse the machine's own (older than the protoc that generated them).
wheel_install() {  # wheel files -> $SITE
  mkdir -p "$SITE"
  if "$PY" -m pip --version >/dev/null 2>&1 \
     && "$PY" -m pip install --quiet --no-index --no-deps --upgrade --target "$SITE" "$@"; then
    echo "installed with pip into $SITE: $(basename -a "$@" | tr '\n' ' ')"
  else
    echo "pip unavailable or failed: unpacking into $SITE"
    "$PY" - "$SITE" "$@" <<'EOF'
import sys, zipfile
for wheel in sys.argv[2:]:
    zipfile.ZipFile(wheel).extractall(sys.argv[1])
    print("unpacked", wheel)
EOF
  fi
}
protos_ok() { "$PY" -c "from perfetto.protos.perfetto.trace import perfetto_trace_pb2" >/dev/null 2>&1; }
install_wheels() {
  local missing=() pkg wheel
  for pkg in orjson nvtx perfetto; do
    "$PY" -c "import $pkg" 2>/dev/null && continue
    wheel=$(ls "$WHEELS"/"$pkg"-*.whl 2>/dev/null | head -1)
    if [ -z "$wheel" ]; then echo "no $pkg wheel in $WHEELS (run tests/gpu/wheels.sh)"; continue; fi
    missing+=("$wheel")
  done
  [ ${#missing[@]} -gt 0 ] && wheel_install "${missing[@]}"
  if ! protos_ok; then
    wheel=$(ls "$WHEELS"/protobuf-*.whl 2>/dev/null | head -1)
    echo "perfetto's protos do not import with this protobuf: ${wheel:-no protobuf wheel in $WHEELS}"
    [ -n "$wheel" ] && wheel_install "$wheel"
  fi
  "$PY" -c "import google.protobuf as p, importlib.metadata as m; print('perfetto', m.version('perfetto'), 'protobuf', p.__version__)" 2>&1 | tail -1
  protos_ok && echo "perfetto protos: ok" || echo "WARNING: perfetto's protos do not import: the trace checks will FAIL"
  "$PY" -c "import orjson, nvtx; print('orjson', orjson.__version__, 'nvtx', getattr(nvtx, '__version__', '?'))"
}

setup() {
  echo "repo $REPO, work $WORK, out $OUT, python $PY"
  nvidia-smi -L 2>&1 || echo "nvidia-smi: not available"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | head -3 || true
  install_wheels || echo "WARNING: orjson/nvtx missing: the recorder and readers will fail"
  "$PY" - <<'EOF'
import os, sys, torch
import torch.distributed as dist
print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)
cuda = torch.cuda.is_available()
nccl = dist.is_available() and dist.is_nccl_available()
print("cuda available", cuda, "devices", torch.cuda.device_count() if cuda else 0, "nccl", nccl)
if cuda:
    print("device", torch.cuda.get_device_name(0), "capability", torch.cuda.get_device_capability(0))
if nccl:
    print("nccl version", torch.cuda.nccl.version())
import torch._C._distributed_c10d as C
for name in ("_dump_nccl_trace", "_dump_nccl_trace_json", "_dump_fr_trace", "_dump_fr_trace_json"):
    fn = getattr(C, name, None)
    print(name, (fn.__doc__ or "").strip().splitlines()[0] if fn else "MISSING")
print("_make_nccl_premul_sum", hasattr(dist, "_make_nccl_premul_sum"), "cuda _sleep", hasattr(torch.cuda, "_sleep"))
import comm2perfetto, orjson
print("comm2perfetto", comm2perfetto.__version__, "from", os.path.dirname(comm2perfetto.__file__))
EOF
  "$PY" -m comm2perfetto record --help >/dev/null && echo "comm2perfetto CLI: ok"
}
export PY WHEELS SITE REPO WORK OUT
export -f setup install_wheels wheel_install protos_ok
step setup 90 bash -c setup

if [ -z "${C2P_GPU_CHECK_CPU:-}" ]; then
  if "$PY" -c "import sys, torch, torch.distributed as d; sys.exit(0 if torch.cuda.is_available() and d.is_nccl_available() else 1)" 2>/dev/null; then
    export C2P_GPU_CHECK_CPU=0
  else
    export C2P_GPU_CHECK_CPU=1
  fi
fi
[ "$C2P_GPU_CHECK_CPU" = 1 ] && say "no CUDA/NCCL: CPU dry run (gloo), GPU-only checks SKIP" || say "CUDA and NCCL: GPU run"

step record 240 "$PY" tests/gpu/device_check.py record-all
step costs 150 "$PY" tests/gpu/device_check.py costs
mkdir -p "$WORK/fixtures"
step pytest 170 env COMM2PERFETTO_SAVE_FIXTURES="$WORK/fixtures" "$PY" -m pytest tests/gpu -v -p no:cacheprovider
"$PY" tests/gpu/device_check.py pytest-figures "$LOGS/pytest.log" > "$LOGS/pytest-figures.log" 2>&1
step pack 60 "$PY" tests/gpu/device_check.py pack
save_logs
echo "--- pytest figures"; cat "$LOGS/pytest-figures.log"
say "done: $(ls "$OUT" | tr '\n' ' ')"
echo "steps (name, exit, seconds):"; cat "$STEPS_FILE"
# the summary last, for the output's tail
[ -f "$OUT/summary.txt" ] && cat "$OUT/summary.txt"
