#!/usr/bin/env bash
# How the shipped tuning databases (device_profiles/tuning/<class>/) are made: each
# model tuned for a while on this machine kind, the best records merged in (--ship).
# Runs niced in the background on a shared machine; each run's log says how long it took.
#   benchmarks/tune_shipped.sh cpu      # mobilenet1.0, squeezenet1.0, resnet50_v1 for `cpu`
#   benchmarks/tune_shipped.sh deeplens # mobilenet1.0 on Intel's OpenCL runtime
#   benchmarks/tune_shipped.sh aisage   # mobilenet1.0 on PoCL
#   benchmarks/tune_shipped.sh rules deeplens [MODEL ...]
#       the tile variants of edgecv's rules for every workload of the seven zoo models
#       (or those named), no MetaSchedule search (--rules-only), raced and shipped
#   benchmarks/tune_shipped.sh verdicts cpu|deeplens device_profiles/tuning/<class>
#       after a rule edit: no search; the default of every workload of the seven zoo
#       models timed under today's rules, and records that beat it timed beside it
#       again (a verdict of other rules is void), in a copy of the shipped folder
set -u
here="$(cd "$(dirname "$0")/.." && pwd)"
python="${PYTHON:-$here/.venv/bin/python}"
logs="${LOGS:-/tmp/edgecv-tune-logs}"
mkdir -p "$logs"
# Trials per workload and workloads (the heaviest) per model: sized for a 2-core machine
# shared with other work (a niced search there gets a small share of the CPU).
trials="${TRIALS:-16}"
tasks="${TASKS:-6}"
tune() {  # model device [--on DEVICE]
  local model=$1 device=$2; shift 2
  echo "$(date -u +%FT%TZ) start $model $device ${trials} trials x ${tasks}" >> "$logs/times.txt"
  local start=$SECONDS
  EDGECV_PROGRESS=0 PYTHONPATH="$here" nice -n 10 "$python" -m edgecv.cli tune "$model" \
    --device "$device" --random-weights --trials "$trials" --tasks "$tasks" --resume --ship \
    "$@" >> "$logs/$model-$device.log" 2>&1
  echo "$(date -u +%FT%TZ) done $model $device exit $? $((SECONDS - start)) s" >> "$logs/times.txt"
}
case "${1:-cpu}" in
  cpu)
    tune mobilenet1.0 cpu
    tune squeezenet1.0 cpu
    tune resnet50_v1 cpu ;;
  deeplens) tune mobilenet1.0 deeplens --on intel ;;
  aisage) tune mobilenet1.0 aisage --on pocl ;;
  rules)
    trials=48 tasks=100000
    device=$2; shift 2
    models=("$@")
    [ ${#models[@]} -gt 0 ] || models=(mobilenet1.0 resnet50_v1 squeezenet1.0
      ssd_512_mobilenet1.0_voc ssd_512_resnet50_v1_voc yolo3_mobilenet1.0_coco yolo3_darknet53_voc)
    on=(); [ "$device" = aisage ] && on=(--on pocl)  # PoCL stands in for the Mali
    for model in "${models[@]}"; do
      tune "$model" "$device" --rules-only "${on[@]}"
    done ;;
  verdicts)
    trials=0
    work="$(mktemp -d)/db"
    cp -r "$3" "$work"
    for model in mobilenet1.0 resnet50_v1 squeezenet1.0 ssd_512_mobilenet1.0_voc \
        ssd_512_resnet50_v1_voc yolo3_mobilenet1.0_coco yolo3_darknet53_voc; do
      tune "$model" "$2" --db "$work"
    done ;;
esac
