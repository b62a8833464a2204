#!/bin/sh
# trainperf diagnose against HTA 0.5.0 on the three small committed real traces, as whole processes
# (docs/benchmarks/traces.md, "One rank"): per trace, `trainperf bench traces` (HTA's load + temporal + idle
# breakdown) and farm-bench's paired runs against HTA's critical path (benchmarks/hta_critical_path.py).
#
#   HTA_PYTHON=PEERS_VENV/bin/python PANDAS2=DIR_WITH_PANDAS_2 sh benchmarks/hta_speed.sh
#
# HTA_PYTHON: an interpreter with HolisticTraceAnalysis 0.5.0; PANDAS2: a directory holding pandas 2.x, put
# first on HTA's PYTHONPATH for its critical path (it fails under pandas 3). farm-bench is the tool library's.
set -eu
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
: "${HTA_PYTHON:?set HTA_PYTHON to an interpreter with HolisticTraceAnalysis 0.5.0}"
: "${PANDAS2:?set PANDAS2 to a directory holding pandas 2.x (pip install --target DIR 'pandas<3')}"
# byte-compiled as an installed package is (a module compiled from source at every start costs ~0.05 s)
PYTHONDONTWRITEBYTECODE= "$PY" -m compileall -q trainperf >/dev/null
D=tests/data/real
for f in $D/hta-data/tests/data/nccl_parser_config/nccl_data.json.gz \
         $D/hta-data/tests/data/ns_resolution_trace/rank-0.Apr_03_18_51_38.1102.pt.trace.json.gz \
         $D/tb-data/resnet50_num_workers_0/worker0.1623143089861.pt.trace.json.gz; do
  echo "=== $f"; date -u; uptime
  "$PY" -m trainperf bench traces "$f" --hta-python "$HTA_PYTHON" --repeat 3
  farm-bench -n 5 --timeout 900 \
    --vs "sh -c 'PYTHONPATH=$PANDAS2 exec $HTA_PYTHON benchmarks/hta_critical_path.py $f >/dev/null 2>&1'" \
    -- sh -c "exec $PY -m trainperf diagnose $f --json >/dev/null"
done
# HTA's own critical-path test traces, with the annotation and instance its tests use (as the oracle file has them)
CP=$D/hta-data/tests/data/critical_path
for spec in "alexnet/benchmark_result_2869224_1695835535_trace.json.gz|[param|pytorch.model.alex_net|0|0|0|measure|forward]|1" \
            "simple_add/benchmark_result_493459_1694039959_trace.json.gz|[param|pytorch.model.alex_net|0|0|0|measure|forward]|1" \
            "cuda_event_sync/event_sync_trace.json.gz|ProfilerStep|0" \
            "cuda_event_sync_multi_stream/event_sync_trace.json.gz||none"; do
  f=$CP/${spec%%|*}; rest=${spec#*|}; inst=${rest##*|}; ann=${rest%|*}
  echo "=== $f ($ann, $inst)"; date -u; uptime
  "$PY" -m trainperf bench traces "$f" --hta-python "$HTA_PYTHON" --repeat 3
  farm-bench -n 5 --timeout 900 \
    --vs "sh -c 'PYTHONPATH=$PANDAS2 exec $HTA_PYTHON benchmarks/hta_critical_path.py $f --annotation \"$ann\" --instances $inst >/dev/null 2>&1'" \
    -- sh -c "exec $PY -m trainperf diagnose $f --json >/dev/null"
done
date -u; uptime
