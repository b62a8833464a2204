#!/usr/bin/env bash
# Run tests with CPU hogs beside them (the loaded machine of issue 23): HOGS busy loops (default 2)
# that ignore Ctrl-C, started before pytest and killed, by their own ids, when it ends.
#   scripts/stress.sh tests/distributed/test_layouts.py -k four          # any pytest arguments
#   HOGS=2 REPEAT=3 scripts/stress.sh tests/unit/test_interrupts.py      # the same tests 3 times
#   TRAINPERF_INTERRUPT_SEEDS=1,2,3 scripts/stress.sh tests/unit/test_interrupts.py   # more moments
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PY:-.venv/bin/python}"
HOGS="${HOGS:-2}"
REPEAT="${REPEAT:-1}"
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; }
trap cleanup EXIT
for _ in $(seq "$HOGS"); do
  "$PY" -c 'import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)
while True: pass' &
  pids+=("$!")
done
echo "stress: $HOGS CPU hog(s) (pids ${pids[*]}) beside pytest $*; $(uptime)"
rc=0
for i in $(seq "$REPEAT"); do
  "$PY" -m pytest -q -p no:cacheprovider "$@" || rc=$?
  echo "stress: round $i of $REPEAT done (rc so far $rc); $(uptime)"
done
exit "$rc"
