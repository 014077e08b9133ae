#!/usr/bin/env bash
# Record the GPU measurements that notebooks 05 and 06 show when a learner has no GPU.
#
# Run from the repository root on a machine with a CUDA GPU and torch (no install of kvlib needed):
#   bash assets/recordings/record.sh [OUTDIR]       (OUTDIR defaults to assets/recordings)
# Writes <gpu>-<date>-memory.json (kvlib bench memory: this machine's CPU, one thread, then the GPU)
# and <gpu>-<date>-gqa.json (kvlib bench gqa --device cuda), each with its device, date and versions,
# plus <gpu>-<date>.txt: the readable tables and nvidia-smi's view of the card.
# The reference solutions are used (KVLIB_SOLUTIONS=1): a recording is never a learner's code.
# Since 2026-12-01 `bench memory` takes the highest of five streaming kernels as the bandwidth ceiling
# and compiles the decode step as one graph (fullgraph=True); recordings made before keep the read
# kernel as the ceiling and a compiled row with graph breaks, and say so when printed. Since then, too,
# kvlib's Decoder picks each weight's memory order (kvlib.core.model.decode_layout, chosen on a CPU):
# bench memory's matrix-vector line prints the other order beside it, and bench gqa times split-K.
set -euo pipefail
out=${1:-assets/recordings}
py=${PYTHON:-python3}
export KVLIB_SOLUTIONS=1 PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
mkdir -p "$out"
gpu=$($py -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU visible to torch'; print(torch.cuda.get_device_name().removeprefix('NVIDIA ').replace(' ', '-').lower())")
stem="$out/$gpu-$(date -u +%F)"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.memory --format=csv || true; echo; } > "$stem.txt"
$py -m kvlib bench memory --json > "$stem-memory.json"
$py -m kvlib bench gqa --device cuda --json > "$stem-gqa.json"
$py - "$stem" >> "$stem.txt" <<'PY'
import json, sys
from kvlib.measure.bench_gqa import format_gqa
from kvlib.measure.bench_memory import format_memory
stem = sys.argv[1]
print(format_memory(json.load(open(stem + "-memory.json"))), "\n")
print(format_gqa(json.load(open(stem + "-gqa.json"))))
PY
cat "$stem.txt"
