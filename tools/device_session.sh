#!/usr/bin/env bash
# Issues 45, 43 and 42's GPU figures at the 27B reference shapes (SPEC 8), in two calls (benchmarks/RESULTS.md).
# Here first: `python tools/device_wheels.py` (fla and transformers in .whl-device/part0; no benchmark here needs
# duckdb). Then call N (1, 2) of the device's `run`, each with carry [".whl-device/part0"] and the command
# `bash tools/device_session.sh N`: it installs fla and transformers into out/site (tools/device_install.sh 1;
# skipped when a warm machine's earlier call left them there, so either call also runs on a fresh machine), runs
# that call's benchmarks, each under its own timeout, and writes their output to $OUT/callN.txt. A benchmark that
# fails or times out does not stop the next; each is sent SIGINT at its timeout, so it prints the figures it has
# (KILL 10 s later if it still runs). Call 1 (530 s of timeouts): the audit, the baselines against the 27B drafter's
# replay, the cost table; call 2 (520 s): the expected-acceptance overhead, the live loop against its prediction.
# Without $OUT (DRY=1 here) the log goes to out/figures/ (git-ignored).
# DRY=1 installs but only lists the benchmarks as they would run.
set -uo pipefail
n=${1:?usage: bash tools/device_session.sh 1|2}
dir=${OUT:-out/figures}
mkdir -p "$dir"
log="$dir/call$n.txt"
if [ -d out/site/fla ]; then echo "fla and transformers: in out/site from an earlier call"; else
  bash tools/device_install.sh 1 || exit 2
fi
export PYTHONPATH=$PWD/out/site:$PWD PYTHONUNBUFFERED=1
bench() {  # seconds, then the command; output to the log, a line when it ends
  local s=$1
  shift
  echo "### $*" >>"$log"
  if [ -n "${DRY:-}" ]; then echo "would run: timeout -s INT -k 10 $s $*" >>"$log"
  else timeout -s INT -k 10 "$s" "$@" >>"$log" 2>&1; fi
  echo "### rc $? after $SECONDS s" >>"$log"
}
x=benchmarks
case $n in
  1)  # audit time per 1,000 positions (4 x 2,560 captured positions; the 27B target built on the GPU)
    bench 150 python3 $x/bench_audit.py
    # the 27B DFlash drafter's replay (every-anchor, chain) from cache files of 8 x 1,064 tokens, beside
    # the baselines' CPU time on the same completions (figures _27b_cuda)
    bench 150 python3 $x/bench_baselines.py --shape 27b
    # profile of the 27B target (q = 1..16, 32, 64 after 512, 2,048, 8,192 tokens) and drafter
    bench 230 python3 $x/bench_profile.py
    ;;
  2)  # the expected-acceptance pass against the plain replay (10 x 2,560, every-anchor and chain, T 0.7)
    bench 200 python3 $x/bench_expected.py
    # the live loop's measured speedup against costs.speedup's prediction at T = 0 and 0.7 (3 prompts of
    # 2,048 tokens, 256 new each; oracle drafts at alpha 0.85 after the drafter's real block)
    bench 320 python3 $x/bench_live.py
    ;;
esac
grep -v "^#" "$log" | grep -E "^[a-z0-9_]+: " | tail -80 || true  # the figures, at the end of the output
