#!/usr/bin/env bash
# The checks of issue 24 that need a GPU, in one run of a few minutes, from the repository root:
#
#   bash bench/gpu_check.sh            # results in $OUT (the device tool's), else a new temp dir
#
# 1. NVML sampling: a CUDA job under phalanx; its resource samples must show the GPU busy.
# 2. phalanx doctor on the real devices: NVML counters, the bf16 matmul burn per GPU; with 2 GPUs
#    or more, the NCCL link between two local nodes (one GPU each).
# 3. NaN detection on a CUDA run (--on-nan stop, when this tree has it).
# 4. DDP throughput (NCCL) under `phalanx run -n N` against `torchrun --standalone --nproc-per-node N`,
#    interleaved, same script (bench/gpu_ddp.py); the ratio of medians.
#
# It never installs anything (the device machine reaches no network): it uses .venv/bin/python when
# that has torch, else python3, and phalanx from ./src. What it cannot do it says and skips (SKIP),
# and it goes on; a check that ran and failed says FAIL. The summary is the last lines of the output
# and $OUT/summary.txt; every command's output is in $OUT/*.log.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d /tmp/gpu_check.XXXXXX)}
mkdir -p "$OUT"
SUMMARY=$OUT/summary.txt
: > "$SUMMARY"
export PHALANX_HOME=$OUT/phx OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}

say() { echo "gpu_check: $*"; }
result() { printf '%-5s %-34s %s\n' "$1" "$2" "$3" | tee -a "$SUMMARY"; }

# -- 0. what this machine has --------------------------------------------------------------------
PY=""
for candidate in "${PYTHON:-}" .venv/bin/python python3; do
    [ -n "$candidate" ] || continue
    if "$candidate" -c "import torch" >/dev/null 2>&1; then PY=$candidate; break; fi
done
if [ -z "$PY" ]; then
    say "no Python with torch here (tried \$PYTHON, .venv/bin/python, python3): nothing can run"
    result SKIP "everything" "no Python with torch"
    exit 1
fi
say "python: $PY ($("$PY" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'))"
if ! "$PY" -c "import phalanx, typer, psutil" >/dev/null 2>&1; then
    say "phalanx's own dependencies are missing for $PY (pip install -e . where there is a network)"
    result SKIP "everything" "phalanx cannot be imported by $PY"
    exit 1
fi
PHX=("$PY" -m phalanx)
command -v nvidia-smi >/dev/null && nvidia-smi -L | tee "$OUT/nvidia-smi.log"
NGPU=$("$PY" -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)" 2>/dev/null || echo 0)
NCCL=$("$PY" -c "import torch.distributed as d; print(int(d.is_nccl_available()))" 2>/dev/null || echo 0)
NVML=$("$PY" -c "import pynvml; pynvml.nvmlInit(); print(pynvml.nvmlDeviceGetCount())" 2>/dev/null || echo none)
say "GPUs seen by torch: $NGPU; NCCL: $NCCL; NVML devices: $NVML"
if [ "$NGPU" = 0 ]; then
    say "no GPU: every GPU check is skipped (this script is for a GPU machine)"
    result SKIP "all GPU checks" "torch sees no GPU"
    exit 1
fi
[ "$NVML" = none ] && say "nvidia-ml-py is not importable: NVML counters and GPU samples will be absent (pip install 'phalanx[gpu]')"

# -- 1. NVML sampling ----------------------------------------------------------------------------
say "1. NVML sampling: a CUDA job with --sample-interval 0.5"
if [ "$NVML" = none ]; then
    result SKIP "NVML sampling" "nvidia-ml-py missing"
else
    timeout 300 "${PHX[@]}" run -n 1 --name gpu-sampling --sample-interval 0.5 bench/gpu_ddp.py --steps 200 --seconds 8 \
        > "$OUT/1-sampling.log" 2>&1
    code=$?
    verdict=$("$PY" - "$PHALANX_HOME" <<'EOF'
import glob, json, sys
files = glob.glob(f"{sys.argv[1]}/jobs/*/attempt_0/node_0/resources.jsonl")
gpus = [g for f in files for line in open(f) for g in json.loads(line).get("gpus") or []]
busy = [g for g in gpus if (g.get("util") or 0) > 0 and (g.get("mem_used") or 0) > 0]
print(f"{len(gpus)} GPU samples, {len(busy)} busy, max util {max([g.get('util') or 0 for g in gpus] or [0])}%"
      + (" PASS" if busy else " FAIL"))
EOF
)
    case "$code:$verdict" in
        0:*PASS) result PASS "NVML sampling" "${verdict% PASS}" ;;
        *) result FAIL "NVML sampling" "exit $code; ${verdict% FAIL} (see $OUT/1-sampling.log)" ;;
    esac
fi

# -- 2. doctor on the real devices ---------------------------------------------------------------
say "2. phalanx doctor: -n 1x$NGPU (burn and NVML on every GPU)"
timeout 300 "${PHX[@]}" doctor -n "1x$NGPU" --burn 3 --json > "$OUT/2-doctor.json" 2> "$OUT/2-doctor.log"
code=$?
"${PHX[@]}" doctor -n "1x$NGPU" --burn 1 > "$OUT/2-doctor.txt" 2>&1; cat "$OUT/2-doctor.txt"
line=$("$PY" - "$OUT/2-doctor.json" <<'EOF'
import json, sys
try:
    found = json.load(open(sys.argv[1]))
except ValueError:
    print("no JSON verdict"); sys.exit()
devices = [d for n in found["nodes"] for d in n["devices"]]
rates = ", ".join(f"cuda:{d['index']} {d['gflops'] / 1e3:.0f} TFLOP/s" for d in devices if d.get("gflops"))
nvml = {n["nvml"] for n in found["nodes"]}
print(f"healthy={found['healthy']} kinds={sorted({d['kind'] for d in devices})} nvml={sorted(nvml)} {rates}")
EOF
)
case "$code:$line" in
    0:*"kinds=['cuda']"*) result PASS "doctor burn + NVML" "$line" ;;
    1:*"kinds=['cuda']"*) result FAIL "doctor burn + NVML" "a GPU was judged bad: $line (see $OUT/2-doctor.txt)" ;;
    *) result FAIL "doctor burn + NVML" "exit $code; $line (see $OUT/2-doctor.log)" ;;
esac
if [ "$NGPU" -ge 2 ] && [ "$NCCL" = 1 ]; then
    say "2b. phalanx doctor -n 2x1: the NCCL link between two local nodes (GPU 0 and GPU 1)"
    timeout 300 "${PHX[@]}" doctor -n 2x1 --burn 1 --json > "$OUT/2b-links.json" 2> "$OUT/2b-links.log"
    code=$?
    line=$("$PY" -c "
import json, sys
f = json.load(open('$OUT/2b-links.json'))
l = (f['links'] or [{}])[0]
print(f\"backend={f['links_backend']} bandwidth={(l.get('bandwidth') or 0) / 1e9:.1f} GB/s latency={(l.get('latency') or 0) * 1e6:.0f} us error={l.get('error') or f['links_error']}\")" 2>&1)
    case "$code:$line" in
        0:backend=nccl*error=None) result PASS "doctor NCCL link" "$line" ;;
        *) result FAIL "doctor NCCL link" "exit $code; $line (see $OUT/2b-links.log)" ;;
    esac
else
    result SKIP "doctor NCCL link" "needs 2 GPUs (one per local node); this machine has $NGPU"
fi

# -- 3. NaN detection on a CUDA run --------------------------------------------------------------
say "3. NaN detection on a CUDA run"
if "${PHX[@]}" run --help 2>/dev/null | grep -q -- "--on-nan"; then
    started=$(date +%s.%N)
    timeout 300 "${PHX[@]}" run -n 1 --name gpu-nan --on-nan stop bench/gpu_ddp.py --nan-at 20 --steps 1000000 \
        --seconds 120 > "$OUT/3-nan.log" 2>&1
    code=$?
    ended=$(date +%s.%N)
    nan_at=$(grep -o "nan printed at [0-9.]*" "$OUT/3-nan.log" | head -1 | awk '{print $4}')
    cause=$("${PHX[@]}" status gpu-nan --json 2>/dev/null | "$PY" -c "import json,sys; print((json.load(sys.stdin).get('root_cause') or {}).get('message',''))" 2>/dev/null)
    if [ -n "$nan_at" ] && [ "$code" != 0 ] && [ "$code" != 124 ]; then
        after=$("$PY" -c "print(f'{$ended - $nan_at:.1f}')")
        result PASS "NaN stop on CUDA" "stopped ${after}s after the NaN line (goal 5 s); exit $code; $cause"
    else
        result FAIL "NaN stop on CUDA" "exit $code (124: never stopped), NaN line at '${nan_at:-none}'; see $OUT/3-nan.log"
    fi
else
    # TODO(integrator): --on-nan is another branch's (issue 24, health); once merged this step runs.
    result TODO "NaN stop on CUDA" "this tree has no --on-nan (phalanx run --help): merge the health branch, rerun"
fi

# -- 4. DDP throughput: phalanx vs torchrun (NCCL) -----------------------------------------------
say "4. DDP throughput on $NGPU GPU(s): phalanx run -n $NGPU vs torchrun --standalone, 3 rounds interleaved"
: > "$OUT/4-ddp.txt"
for round in 1 2 3; do
    for who in phalanx torchrun; do
        if [ $who = phalanx ]; then
            cmd=("${PHX[@]}" run -n "$NGPU" bench/gpu_ddp.py --steps 500 --batch 1024)
        else
            cmd=("$PY" -m torch.distributed.run --standalone --nproc-per-node "$NGPU" bench/gpu_ddp.py --steps 500 --batch 1024)
        fi
        rate=$(timeout 300 "${cmd[@]}" 2>>"$OUT/4-ddp.log" | tee -a "$OUT/4-ddp.log" | grep -o "steps_per_s=[0-9.]*" | head -1)
        echo "$who ${rate#steps_per_s=}" >> "$OUT/4-ddp.txt"
    done
done
line=$("$PY" - "$OUT/4-ddp.txt" <<'EOF'
import statistics, sys
rates = {}
for line in open(sys.argv[1]):
    who, _, rate = line.strip().partition(" ")
    if rate:
        rates.setdefault(who, []).append(float(rate))
if len(rates) < 2:
    print(f"missing runs: {rates}"); sys.exit()
p, t = statistics.median(rates["phalanx"]), statistics.median(rates["torchrun"])
print(f"phalanx {p:.2f} steps/s, torchrun {t:.2f} steps/s, ratio {p / t:.3f} (rounds: {rates})")
EOF
)
case "$line" in
    phalanx*) result PASS "DDP throughput phalanx/torchrun" "$line" ;;
    *) result FAIL "DDP throughput phalanx/torchrun" "$line (see $OUT/4-ddp.log)" ;;
esac

say "summary ($SUMMARY):"
cat "$SUMMARY"
! grep -q "^FAIL" "$SUMMARY"
