#!/usr/bin/env bash
# Issue 22's three GPU plans verified after the batching model and the GPU serving path:
#   bench/gpu_verify.sh [OUT_DIR]        (default ./gpu-verify-out; greenctl must be importable)
#
#  1. the card as found; greenctl profile --gpus of the built-in ResNets (batch 1, 8, 32);
#  2. the three plans of bench/gpu_check.sh planned on those profiles alone (prediction A);
#  3. greenctl profile serving --resource gpu:MODEL: the served GPU executor (its batches'
#     run time over the profile's, and the dispatcher path) for the variants the plans use;
#  4. the same three plans planned again (prediction B, serving path included) and applied
#     with --verify: measured p95 against prediction B (and A);
#  5. if time is left: the batch-1 serving bench with py-spy stacks (where the CPU goes).
# Every step writes under OUT_DIR as it goes; a failed step is reported and the next runs.
# Nothing here changes MIG mode, clocks, power limits, compute mode or persistence mode.
set -uo pipefail
out="${1:-gpu-verify-out}"
mkdir -p "$out"
db="$out/gpu.db"
here="$(cd "$(dirname "$0")" && pwd)"
start=$(date +%s)
budget="${GPU_CHECK_BUDGET_S:-420}"
left() { echo $(( budget - ($(date +%s) - start) )); }
step() { echo; echo "== [$(( $(date +%s) - start )) s] $*"; }
gc() { greenctl --db "$db" "$@"; }

step "card"
nvidia-smi --query-gpu=name,driver_version,mig.mode.current,compute_mode,persistence_mode,power.limit \
    --format=csv | tee "$out/card.csv"
gpu=$(python3 -c 'import torch; n=torch.cuda.get_device_name(0); print("H200" if "H200" in n else "H100-80GB" if "H100" in n else n)')
res="gpu:$gpu"
echo "resource $res"

step "profile --gpus: resnet18/50/152, batch 1,8,32"
gc profile --variant "${GPU_VERIFY_VARIANTS:-resnet18,resnet50,resnet152}" --gpus --cpus none --batch 1,8,32 \
    --duration 1 --json > "$out/profile_gpu.json" 2> "$out/profile_gpu.err" || tail -5 "$out/profile_gpu.err"
gc profile export -o "$out/profiles.csv" > /dev/null 2>&1 || true

specs=("300 100" "1500 30" "100 20")
only="${GPU_VERIFY_PLANS:-1 2 3}"   # which of the three to verify (and plan)
repeat="${GPU_VERIFY_REPEAT:-1}"    # verify each running plan this many times (the 2nd and later: warm)
plan_all() {  # $1: tag
    local n=0 tag="$1" rate slo
    for spec in "${specs[@]}"; do
        read -r rate slo <<< "$spec"
        n=$((n + 1))
        [[ " $only " == *" $n "* ]] || continue
        gc plan mix --model resnet --rate "$rate" --slo-ms "$slo" --budget gpu=1 --objective accuracy \
            -o "$out/plan$n$tag.json" --json > "$out/plan$n$tag.out.json" 2> "$out/plan$n$tag.err" \
            || tail -3 "$out/plan$n$tag.err"
        python3 - "$out/plan$n$tag.json" "$n$tag" <<'EOF'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as exc:
    print(sys.argv[2], "no plan:", exc); sys.exit(0)
p = d.get("predicted") or {}
ins = [(i.get("variant"), i.get("resource"), i.get("batch"), i.get("count")) for i in d.get("deployments", [])]
print(f"plan {sys.argv[2]}: {ins} predicted p50 {p.get('p50_ms')} p95 {p.get('p95_ms')} overloaded {p.get('overloaded')}; latency includes: {p.get('latency_includes')}")
EOF
    done
}
step "plans on the profiles alone (prediction A)"
plan_all A

step "profile serving on $res for the variants the plans chose (left $(left) s)"
# one run per variant on the GPU: at its largest planned batch, at each planned rate
python3 - "$out" "$res" > "$out/serving_todo.txt" <<'EOF'
import json, sys
out, res = sys.argv[1], sys.argv[2]
todo = {}
for n in (1, 2, 3):
    try:
        d = json.load(open(f"{out}/plan{n}A.json"))
    except Exception:
        continue
    for dep in d.get("deployments", []):
        if dep.get("resource") == res:
            rate = float(dep.get("quota_rps") or d["request"]["families"][0]["rate_rps"])
            b, rates = todo.get(dep["variant"], (1, set()))
            todo[dep["variant"]] = (max(b, int(dep.get("batch") or 1)), rates | {rate})
for v, (b, rates) in todo.items():
    print(v, b, " ".join(f"--rate {r:g}" for r in sorted(rates)))
EOF
[ "${GPU_VERIFY_SERVING:-1}" = 1 ] || : > "$out/serving_todo.txt"   # 0: plans on the profiles alone
while read -r variant batch rates; do
    [ "$(left)" -gt 150 ] || { echo "skipped profile serving of $variant: too little time left"; continue; }
    echo "$variant batch $batch $rates"
    gc profile serving --variant "$variant" --resource "$res" --batch "$batch" $rates \
        --path dispatcher --duration 3 < /dev/null > "$out/serving_$variant.txt" 2>&1
    tail -8 "$out/serving_$variant.txt"
done < "$out/serving_todo.txt"

step "plans with the serving path (prediction B) (left $(left) s)"
plan_all B

n=0
for spec in "${specs[@]}"; do
    n=$((n + 1))
    [[ " $only " == *" $n "* ]] || continue
    for k in $(seq 1 "$repeat"); do
    [ "$(left)" -gt 40 ] || { echo "skipped verify of plan $n: too little time left"; continue; }
    step "apply --verify plan ${n}B, run $k (left $(left) s)"
    gc apply "$out/plan${n}B.json" --verify --verify-duration "${GPU_VERIFY_S:-6}" --json > "$out/apply$n-$k.json" 2> "$out/apply$n-$k.err" \
        || tail -5 "$out/apply$n-$k.err"
    python3 - "$out/apply$n-$k.json" "$out/plan${n}A.json" <<'EOF' | tee -a "$out/plans_summary.txt"
import json, sys
try:
    doc = json.load(open(sys.argv[1]))
except Exception as exc:
    print("no apply result:", exc); sys.exit(0)
try:
    a = json.load(open(sys.argv[2]))
    a = (a.get("predicted") or {}).get("p95_ms")
except Exception:
    a = None
v = doc.get("verify") or {}
p, m = v.get("predicted") or {}, v.get("measured") or {}
r = lambda x, y: (x or 0) / y if y else float("nan")
print("instances:", [(i.get("variant"), i.get("resource"), i.get("batch")) for i in doc.get("instances", [])])
print(f"predicted p50/p95 {p.get('p50_ms')} / {p.get('p95_ms')} (profiles alone: p95 {a}); measured p50/p95 "
      f"{m.get('p50_ms')} / {m.get('p95_ms')}; measured/predicted p95 {r(m.get('p95_ms'), p.get('p95_ms')):.3f} "
      f"(vs profiles alone {r(m.get('p95_ms'), a):.3f}); served {m.get('rate_rps')} of {m.get('offered_rps')}; "
      f"client lag p95 {m.get('client_lag_p95_ms')} ms; batch rows {(m.get('models') or {}).get('resnet', {}).get('mean_batch_rows')}")
b = m.get("breakdown") or {}
print("measured p50 / p95 ms: " + ", ".join(
    f"{k.removesuffix('_ms')} {b[k]['p50']:.2f} / {b[k]['p95']:.2f}" for k in ("queue_ms", "run_ms", "outside_ms") if k in b))
EOF
    done
    gc down > /dev/null 2>&1
done

if [ "${GPU_VERIFY_SPY:-1}" = 1 ] && [ "$(left)" -gt 60 ] && command -v py-spy > /dev/null; then
    step "serving bench resnet50 batch 1 with py-spy (left $(left) s)"
    python3 "$here/bench_gpu_serving.py" --variant resnet50 --batch 1 --arms pipeline --duration 4 \
        --profile-duration 1.5 --json "$out/serving_b1.json" --py-spy "$out/spy" 2>&1 | tee "$out/serving_b1.txt" | tail -6
fi
step "done"
pgrep -af "greenctl.executor" || echo "no executor left running"
echo; echo "== summary"; cat "$out/plans_summary.txt" 2>/dev/null
