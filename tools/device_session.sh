#!/usr/bin/env bash
# Figures still to take (issue 32's; issue 42's live loop in call 3), in calls of one warm machine (benchmarks/RESULTS.md, "Still to run").
# Here first: `python tools/device_wheels.py --with duckdb`. Then call N (1, 2) of the device's `run`, with
# carry [".whl-device/partN-1"] and the command `bash tools/device_session.sh N`: it installs what that part
# completes (tools/device_install.sh), runs that call's benchmarks, each under its own timeout, and writes their
# output to $OUT/callN.txt. A benchmark that fails or times out does not stop the next; each is sent SIGINT at its
# timeout, so it prints the figures it has.
# Without $OUT (DRY=1 here) the log goes to out/figures/ (git-ignored).
# DRY=1 installs but only lists the benchmarks as they would run.
set -uo pipefail
n=${1:?usage: bash tools/device_session.sh 1|2|3}
dir=${OUT:-out/figures}
mkdir -p "$dir"
log="$dir/call$n.txt"
if [ "$n" -le 2 ]; then bash tools/device_install.sh "$n" || exit 2; fi  # call 3: what calls 1-2 installed (out/ kept warm)
export PYTHONPATH=$PWD/out/site:$PWD PYTHONUNBUFFERED=1
bench() {  # seconds, then the command; output to the log, a line when it ends
  local s=$1
  shift
  echo "### $*" >>"$log"
  if [ -n "${DRY:-}" ]; then echo "would run: timeout -s INT $s $*" >>"$log"; else timeout -s INT "$s" "$@" >>"$log" 2>&1; fi
  echo "### rc $? after $SECONDS s" >>"$log"
}
x=benchmarks
case $n in
  1)  # the 32K extraction against a plain forward (4 sequences: the last one's write, not overlapped, is a quarter),
    # then the 32K replay on this card with the product's default prefix kernel (cuDNN), then the feature audit
    bench 260 python3 $x/bench_extract.py --tokens 32768 --seqs 4
    bench 220 python3 $x/bench_replay.py --quick --tokens 32768 --seqs 2 --loop-anchors 8
    bench 100 python3 $x/bench_audit.py --samples 2  # issue 45: audit time per 1,000 positions at 27B shapes
    ;;
  2)  # streaming against extract-then-sweep on 200 x 2,560 (needs duckdb: the extras join in this call)
    bench 480 python3 $x/bench_stream.py
    ;;
  3)  # issue 42: the live loop's measured speedup at 27B shapes against costs.speedup's prediction, T = 0 and 0.7
    bench 540 python3 $x/bench_live.py
    ;;
esac
grep -v "^#" "$log" | grep -E "^[a-z0-9_]+: " | tail -80 || true  # the figures, at the end of the output
