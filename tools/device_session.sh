#!/usr/bin/env bash
# Issue 32's figures on the H200 in three calls of one warm machine (benchmarks/RESULTS.md, "Next H200 session").
# Here first: `python tools/device_wheels.py --with duckdb,ray`. Then call N (1, 2, 3) of the device's `run`, with
# carry [".whl-device/partN-1"] and the command `bash tools/device_session.sh N`: it installs what that part
# completes (tools/device_install.sh), runs that call's benchmarks, each under its own timeout, and writes their
# output to $OUT/callN.txt. A benchmark that fails or times out does not stop the next.
# Each call's log is also kept in out/figures/ (git-ignored, kept while the machine is warm), so that call 2 runs the
# 128K replay with the prefix kernel call 1 found faster at one chunk's shape (cuDNN only when it was).
# DRY=1 installs but only lists the benchmarks it would run.
set -uo pipefail
n=${1:?usage: bash tools/device_session.sh 1|2|3}
keep=out/figures
mkdir -p "${OUT:-$keep}" "$keep"
log="${OUT:-$keep}/call$n.txt"
bash tools/device_install.sh "$n" || exit 2
export PYTHONPATH=$PWD/out/site:$PWD PYTHONUNBUFFERED=1
bench() {  # seconds, then the command; output to the log, a line when it ends
  local s=$1
  shift
  echo "### $*" >>"$log"
  if [ -n "${DRY:-}" ]; then echo "would run: timeout $s $*" >>"$log"; else timeout "$s" "$@" >>"$log" 2>&1; fi
  echo "### rc $? after $SECONDS s" >>"$log"
}
fig() {  # the last value a kept log printed for figure $1 (empty when none did)
  grep -h "^$1: " "$keep"/call*.txt 2>/dev/null | tail -1 | cut -d' ' -f2
}
faster_prefix() {  # cudnn when call 1 timed it below flash at one chunk's shape, else flash
  local c f
  c=$(fig prefix_cudnn_ms_32k)
  f=$(fig prefix_flash_ms_32k)
  if [ -n "$c" ] && [ -n "$f" ] && python3 -c "import sys; sys.exit(float('$c') >= float('$f'))"; then
    echo cudnn
  else
    echo flash
  fi
}
x=benchmarks
case $n in
  1)  # the first call cold (compiles and tunings printed), then a returning user's new process on that cache
    export TRITON_CACHE_DIR=$PWD/out/triton-128k
    TRITON_PRINT_AUTOTUNING=1 bench 170 python3 $x/bench_extract.py --first-call --tokens 131072
    bench 150 python3 $x/bench_extract.py --first-call --tokens 131072
    unset TRITON_CACHE_DIR
    bench 220 python3 $x/bench_replay.py --quick --tokens 32768 --seqs 2 --loop-anchors 8 --prefix-attention cudnn
    ;;
  2)
    bench 380 python3 $x/bench_replay.py --quick --tokens 131072 --seqs 1 --loop-anchors 2 --steady-tokens 16384 \
      --prefix-attention "$(faster_prefix)"
    bench 200 python3 $x/bench_extract.py --tokens 32768 --seqs 2
    ;;
  3)
    bench 420 python3 $x/bench_stream.py
    ;;
esac
[ "$log" = "$keep/call$n.txt" ] || cp "$log" "$keep/"
grep -v "^#" "$log" | grep -E "^[a-z0-9_]+: " | tail -80 || true  # the figures, at the end of the output
