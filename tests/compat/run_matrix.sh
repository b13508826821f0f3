#!/usr/bin/env bash
# Run comm2perfetto on several torch versions and print a table.
#
#   tests/compat/run_matrix.sh [--delete] [--no-suite] [--full-suite] VERSION...
#     VERSION       2.4.1 (the package index's wheel: CUDA on Linux, runs gloo jobs without a GPU)
#                   or 2.13.0+cpu (a CPU build); see build_venv.sh
#     --delete      remove each venv once its row is done (about 5 GB each for the CUDA wheels): with it, one
#                   venv at a time is on disk
#     --no-suite    only the three example jobs
#     --full-suite  the whole test suite instead of the recorder's tests
#
# Per version: builds the venv if missing (VENV_ROOT, default /work/venvs), then runs this tree's code
# (PYTHONPATH) on
#   demo      `comm2perfetto demo`: expects 48 collectives merged and diagnose's OK
#   hang      examples/hang_missing_rank.py recorded with --stall-after 3: expects missing_ranks on
#             all_reduce #4, culprit 1
#   mismatch  examples/shape_mismatch.py: expects size_mismatch on all_reduce #4
#   suite     python -m pytest on the recorder's tests (tests/integration, tests/unit/test_record_*.py: those that
#             run torch; the readers' own tests need none): its summary line
# The demo's first lines say which mechanism records DDP's collectives on that torch (the dispatcher fallback on
# gloo before torch 2.8): the "C++ on gloo" column. A torch that `comm2perfetto record` refuses (older than
# pyproject.toml's range) gets one "refused" row.
# Logs of every step go to MATRIX_OUT (default /tmp/comm2perfetto-matrix/<version>/).
set -uo pipefail
tree=$(cd "$(dirname "$0")/../.." && pwd)
# expanded in the tree, unquoted: word-split and globbed there
delete=0; suite=1; suite_paths="tests/integration tests/unit/test_record_*.py"; versions=()
for arg in "$@"; do
  case $arg in
    --delete) delete=1 ;;
    --no-suite) suite=0 ;;
    --full-suite) suite_paths="" ;;
    -*) echo "run_matrix.sh: unknown option $arg" >&2; exit 2 ;;
    *) versions+=("$arg") ;;
  esac
done
if [[ ${#versions[@]} -eq 0 ]]; then
  echo "usage: tests/compat/run_matrix.sh [--delete] [--no-suite] [--full-suite] VERSION..." >&2; exit 2
fi
root=${VENV_ROOT:-/work/venvs}
out_root=${MATRIX_OUT:-/tmp/comm2perfetto-matrix}

# expect NAME LOGFILE PATTERN...: "ok" when every pattern is in the log, else what is missing
expect() {
  local log=$1; shift
  local missing=()
  for pattern in "$@"; do grep -qF -- "$pattern" "$log" || missing+=("$pattern"); done
  if [[ ${#missing[@]} -eq 0 ]]; then echo ok; else echo "FAIL (no '${missing[0]}')"; fi
}

rows=()
for spec in "${versions[@]}"; do
  if [[ $spec == *+cpu ]]; then venv=$root/torch-$spec; else venv=$root/torch-$spec+cu; fi
  "$tree/tests/compat/build_venv.sh" "$spec" >/dev/null || { rows+=("$spec|venv build failed||||"); continue; }
  out=$out_root/$spec
  rm -rf "$out"; mkdir -p "$out"
  py() { (cd "$out" && PYTHONPATH="$tree/src" timeout 900 "$venv/bin/python" "$@"); }
  torch_version=$("$venv/bin/python" -c "import torch; print(torch.__version__)")

  py -m comm2perfetto demo -o "$out/demo" > "$out/demo.log" 2>&1
  if grep -q "comm2perfetto record needs torch >=" "$out/demo.log"; then  # refused, as it must be: nothing to run
    rows+=("$torch_version|-|refused: $(grep -o 'needs torch >= [0-9.]*' "$out/demo.log" | head -1)|-|-|-")
    printf '%s\n' "${rows[-1]}" >> "$out_root/rows.txt"
    [[ $delete -eq 1 ]] && rm -rf "$venv"
    continue
  fi
  demo=$(expect "$out/demo.log" "collectives: 48;" "OK: every collective matched on all ranks")
  if grep -q "by the dispatcher fallback on gloo" "$out/demo.log"; then cpp="dispatcher fallback"
  elif grep -q "by Flight Recorder on gloo" "$out/demo.log"; then cpp="Flight Recorder"; else cpp="?"; fi

  py -m comm2perfetto record -o "$out/hang" --stall-after 3 -- "$venv/bin/python" -m torch.distributed.run \
    --standalone --nproc_per_node 2 "$tree/examples/hang_missing_rank.py" --hang-seconds 8 > "$out/hang.log" 2>&1
  py -m comm2perfetto diagnose "$out/hang" >> "$out/hang.log" 2>&1
  hang=$(expect "$out/hang.log" "missing_ranks on default_pg: all_reduce #4" "culprit: 1")

  py -m comm2perfetto record -o "$out/mismatch" -- "$venv/bin/python" -m torch.distributed.run \
    --standalone --nproc_per_node 2 "$tree/examples/shape_mismatch.py" > "$out/mismatch.log" 2>&1
  py -m comm2perfetto diagnose "$out/mismatch" >> "$out/mismatch.log" 2>&1
  mismatch=$(expect "$out/mismatch.log" "size_mismatch on default_pg: all_reduce #4")

  result="not run"
  if [[ $suite -eq 1 ]]; then
    (cd "$tree" && PYTHONPATH="$tree/src" timeout 3600 "$venv/bin/python" -m pytest -q -p no:cacheprovider -rfs \
      $suite_paths > "$out/suite.log" 2>&1)
    result=$(grep -E "^(=+ )?[0-9]+ (passed|failed)|^=+ .*(passed|failed|error)" "$out/suite.log" | tail -1 \
             | sed -E 's/^=+ //; s/ =+$//')
    [[ -n $result ]] || result="no summary (see $out/suite.log)"
  fi
  rows+=("$torch_version|$cpp|$demo|$hang|$mismatch|$result")
  printf '%s\n' "${rows[-1]}" >> "$out_root/rows.txt"
  [[ $delete -eq 1 ]] && rm -rf "$venv"
done

printf '\n| torch | C++ on gloo | demo | hang | mismatch | suite |\n| --- | --- | --- | --- | --- | --- |\n'
for row in "${rows[@]}"; do printf '| %s |\n' "${row//|/ | }"; done
echo "logs: $out_root/<version>/"
