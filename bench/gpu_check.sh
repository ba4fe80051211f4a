#!/usr/bin/env bash
# The GPU checks of issue 22 in one run, for a machine with an NVIDIA GPU (H100/H200):
#   bench/gpu_check.sh [OUT_DIR]        (default ./gpu-check-out; GREENCTL must be importable)
#
#  1. the card as found (nvidia-smi), and greenctl hw;
#  2. greenctl profile --gpus of the built-in ResNets (batch 1, 8, 32): the GPU runner's
#     profiles, the settled idle power, the warm-up;
#  3. bench/bench_gpu_serving.py: served vs profiled throughput, CPU per request and batch
#     time, greenctl's GPU runner against the eager executor, resnet50 at batch 8 and 1;
#  4. three GPU plans (plan mix on the profiles of 2) applied with --verify: measured p95
#     against the prediction;
#  5. greenctl profile --gpus --emulate-mig for resnet50 and EfficientNet-B0..B7 (batch 1), in
#     two runs: MIG slices emulated with MPS thread percentages (a private MPS daemon, stopped
#     after); the comparison of emulated slices with the whole GPU; plan mig on them.
# Every step writes under OUT_DIR as it goes; a step that fails is reported and the next runs.
# It never changes MIG mode, clocks, power limits, compute mode or persistence mode.
set -uo pipefail
out="${1:-gpu-check-out}"
mkdir -p "$out"
db="$out/gpu.db"
here="$(cd "$(dirname "$0")" && pwd)"
start=$(date +%s)
budget="${GPU_CHECK_BUDGET_S:-500}"   # skip steps that would not finish inside this
left() { echo $(( budget - ($(date +%s) - start) )); }
step() { echo; echo "== [$(( $(date +%s) - start )) s] $*"; }
gc() { greenctl --db "$db" "$@"; }

step "card"
command -v nvidia-cuda-mps-control || echo "no nvidia-cuda-mps-control on PATH"
nvidia-smi --query-gpu=name,driver_version,memory.total,mig.mode.current,compute_mode,persistence_mode,power.limit,clocks.sm,clocks.max.sm \
    --format=csv | tee "$out/card.csv"
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'
gc hw --json > "$out/hw.json" 2> "$out/hw.err" || cat "$out/hw.err"

step "profile --gpus: resnet18/50/152, batch 1,8,32 (left $(left) s)"
gc profile --variant resnet18,resnet50,resnet152 --gpus --cpus none --batch 1,8,32 \
    --duration 1 --json > "$out/profile_gpu.json" 2> "$out/profile_gpu.err" || tail -5 "$out/profile_gpu.err"
gc profile list --json > "$out/profiles.json" 2>/dev/null
python3 - "$out/profiles.json" <<'EOF'
import json, sys
rows = json.load(open(sys.argv[1]))
rows = rows.get("profiles", rows) if isinstance(rows, dict) else rows
for r in rows:
    if str(r.get("resource", "")).startswith("gpu:"):
        print(f"{r['variant']:<10} b{r['batch']:<3} p50 {r.get('latency_p50_ms') or 0:8.3f} ms  "
              f"{r.get('throughput_rps') or 0:9.0f} req/s  {r.get('power_w') or 0:6.1f} W  "
              f"idle {r.get('idle_power_w') or 0:6.1f} W  {r.get('energy_j') or 0:.4f} J/req")
EOF

step "bench_gpu_serving (left $(left) s)"
python3 "$here/bench_gpu_serving.py" --variant resnet50 --batch 8 --batch 1 --duration 4 \
    --profile-duration 1.5 --json "$out/serving.json" 2>&1 | tee "$out/serving.txt" | tail -12

n=0
for spec in "300 100" "1500 30" "100 20"; do
    set -- $spec
    [ "$(left)" -gt 45 ] || { echo "skipped plan at $1 req/s: too little time left"; continue; }
    n=$((n + 1))
    step "plan $n: resnet at $1 req/s, p95 SLO $2 ms, one GPU (left $(left) s)"
    gc plan mix --model resnet --rate "$1" --slo-ms "$2" --budget gpu=1 \
        --objective accuracy -o "$out/plan$n.json" --json > "$out/plan$n.out.json" 2> "$out/plan$n.err" \
        || { tail -3 "$out/plan$n.err"; continue; }
    gc apply "$out/plan$n.json" --verify --verify-duration 6 --json > "$out/apply$n.json" 2> "$out/apply$n.err" \
        || tail -5 "$out/apply$n.err"
    python3 - "$out/apply$n.json" <<'EOF' | tee -a "$out/plans_summary.txt"
import json, sys
try:
    doc = json.load(open(sys.argv[1]))
except Exception as exc:
    print("no apply result:", exc); sys.exit(0)
v = doc.get("verify") or {}
p, m = v.get("predicted") or {}, v.get("measured") or {}
print("instances:", [(i.get("variant"), i.get("resource"), i.get("batch")) for i in doc.get("instances", [])])
print("predicted p50/p95:", p.get("p50_ms"), p.get("p95_ms"), " measured p50/p95:", m.get("p50_ms"), m.get("p95_ms"),
      " ratio p95:", (m.get("p95_ms") or 0) / (p.get("p95_ms") or float("nan")), " served", m.get("rate_rps"), "of", m.get("offered_rps"))
EOF
    gc down > /dev/null 2>&1
done
emulate() {  # $1: minimum seconds left to start, $2: variants
    if [ "$(left)" -gt "$1" ]; then
        step "profile --gpus --emulate-mig: $2, batch 1 (left $(left) s)"
        gc profile --variant "$2" --gpus --emulate-mig --cpus none --batch 1 --duration 0.5 --json \
            >> "$out/profile_emulated.json" 2>> "$out/profile_emulated.err" || tail -5 "$out/profile_emulated.err"
        pgrep -a nvidia-cuda-mps || echo "no MPS daemon left running"
    else
        echo "skipped emulation of $2: too little time left ($(left) s)"
    fi
}
emulate 150 resnet50,efficientnet-b0,efficientnet-b1,efficientnet-b2,efficientnet-b3
emulate 110 efficientnet-b4,efficientnet-b5,efficientnet-b6,efficientnet-b7
gc profile compare-emulated > "$out/compare_emulated.txt" 2>&1; tail -40 "$out/compare_emulated.txt"
gc profile compare-emulated --json > "$out/compare_emulated.json" 2>/dev/null
if [ -s "$out/profile_emulated.json" ]; then
    step "plan mig on the emulated EfficientNet slices (left $(left) s)"
    gpu=$(python3 -c 'import torch; n=torch.cuda.get_device_name(0); print("H200" if "H200" in n else "H100-80GB")')
    gc plan mig --gpu "$gpu" --gpus 1 --model efficientnet --rate 100 --carbon-intensity 250 \
        > "$out/plan_mig.txt" 2>&1; tail -25 "$out/plan_mig.txt"
fi
step "done"
pgrep -af "greenctl.executor" || true
echo; echo "== summary"; tail -7 "$out/serving.txt" 2>/dev/null; cat "$out/plans_summary.txt" 2>/dev/null
