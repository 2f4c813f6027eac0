#!/usr/bin/env bash
# The real-size checkpoint end to end on a GPU, sized for under 8 minutes on an H100 (the steps' time limits add up
# to 445 s; docs/model.md, "A real-size checkpoint without the weights, and the GPU run"):
#   1. a 0.6B checkpoint in the release's exact layout with random weights (tests/checkpoints.py --size 0.6b),
#   2. rvqspec prepare --device cuda on a few frames (offsets, trees, auto),
#   3. the whole frame with speculation: rvqspec bench frames --device cuda on that checkpoint,
#   4. rvqspec synth --stream --device cuda (time to first audio, real-time factor, underruns), the default decoder
#      and --decoder paper,
# every output under one folder (default build/gpu_end_to_end), then a short summary (summary.txt there).
#
#   bash scripts/gpu_end_to_end.sh [OUT_DIR]        # from the repository root, after `make env`
#
# Stops with exit 2 before doing anything where CUDA is absent. A dry run of every step on the CPU with the tiny
# checkpoint: DEVICE=cpu SIZE=tiny bash scripts/gpu_end_to_end.sh build/e2e-dry
# Knobs (environment): DEVICE (cuda), SIZE (0.6b | tiny), FRAMES (prepare --frames, 100), BACKENDS (bench frames
# --backends: eager,compile on CUDA, eager on the CPU), PY (.venv/bin/python), TIME_SCALE (1: every step's time
# limit multiplied by it, for a slow or shared machine). A step that runs past its limit is stopped and the next one
# runs (prepare resumes on a second run, reusing the checkpoint; the summary says what is missing).
set -uo pipefail

DEVICE=${DEVICE:-cuda}
SIZE=${SIZE:-0.6b}
FRAMES=${FRAMES:-100}
PY=${PY:-.venv/bin/python}
TIME_SCALE=${TIME_SCALE:-1}
OUT=${1:-build/gpu_end_to_end}
if [[ $DEVICE == cuda* ]]; then BACKENDS=${BACKENDS:-eager,compile} DTYPE=bfloat16
else BACKENDS=${BACKENDS:-eager} DTYPE=float32; fi
TEXT="The quick brown fox jumps over the lazy dog, and the speech comes out one frame at a time."

if [[ ! -f tests/checkpoints.py ]]; then
  echo "gpu_end_to_end: run it from the repository root (bash scripts/gpu_end_to_end.sh)" >&2; exit 2
fi
if [[ ! -x $PY ]]; then
  echo "gpu_end_to_end: no Python at $PY: run \`make env\` first, or set PY=" >&2; exit 2
fi
if [[ $DEVICE == cuda* ]] && ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_end_to_end: CUDA is not available here (torch.cuda.is_available() is False): nothing run." \
       "A dry run on the CPU: DEVICE=cpu SIZE=tiny bash $0 [OUT_DIR]" >&2
  exit 2
fi
mkdir -p "$OUT"
CKPT=$OUT/ckpt-$SIZE
RV=("$PY" -m rvqspec_lib.cli.main)
: > "$OUT/steps.tsv"

# step NAME LIMIT_S CMD...: runs CMD with its output in OUT/NAME.log, stopped after LIMIT_S seconds; one line each in
# steps.tsv (name, exit status, wall seconds)
step() {
  local name=$1 limit=$(( $2 * TIME_SCALE )); shift 2
  local t0=$SECONDS rc
  echo "== $name (at most ${limit} s): $*"
  timeout --signal=INT --kill-after=15 "$limit" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  printf '%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" >> "$OUT/steps.tsv"
  if (( rc != 0 )); then
    echo "   $name: exit $rc after $((SECONDS - t0)) s (see $OUT/$name.log)"; tail -3 "$OUT/$name.log"
  fi
  return 0
}

if [[ -f $CKPT/speech_tokenizer/model.safetensors ]]; then
  echo "== checkpoint: $CKPT exists, reused"
else
  step checkpoint 75 "$PY" -m tests.checkpoints "$CKPT" --size "$SIZE"
fi
step prepare 140 "${RV[@]}" prepare --model "$CKPT" --device "$DEVICE" --frames "$FRAMES" --json "$OUT/prepare.json"
# the paper's decoder where prepare calibrated its trees (random weights: its acceptance means nothing, its cost does)
DECODERS=ar,chain:4; [[ -f $CKPT/trees/offsets.json ]] && DECODERS+=,paper
step frames 120 "${RV[@]}" bench frames --model "$CKPT" --device "$DEVICE" --dtype "$DTYPE" --backends "$BACKENDS" \
  --decoders "$DECODERS" --repeats 20 --warmup 3 --no-progress --json "$OUT/frames.json"
step stream 55 "${RV[@]}" synth --model "$CKPT" --device "$DEVICE" --stream --text "$TEXT" --out "$OUT/stream.wav" \
  --json "$OUT/stream.json"
step stream_paper 55 "${RV[@]}" synth --model "$CKPT" --device "$DEVICE" --stream --decoder paper --text "$TEXT" \
  --out "$OUT/stream_paper.wav" --json "$OUT/stream_paper.json"

"$PY" - "$OUT" "$DEVICE" "$SIZE" <<'EOF' | tee "$OUT/summary.txt"
import json, sys
from pathlib import Path
out, device, size = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
def load(name):
    p = out / name
    return json.loads(p.read_text()) if p.is_file() else None
print(f"end to end on {device}, checkpoint size {size} (random weights: timing only), outputs in {out}")
for line in (out / "steps.tsv").read_text().splitlines():
    name, rc, s = line.split("\t")
    print(f"  {name:13s} exit {rc:>3s} {s:>5s} s")
frames = load("frames.json")
rows = (frames or {}).get("rows") or []
if rows:
    print("whole frame (median ms per frame; the fastest row of each kind and backend):")
    best = {}
    for r in rows:
        key = (r.get("backend"), r.get("precision"), bool(r.get("fused")), r.get("kind"))
        if key not in best or r["ms_per_frame"] < best[key]["ms_per_frame"]:
            best[key] = r
    for (b, prec, fused, kind), r in sorted(best.items(), key=lambda kv: kv[1]["ms_per_frame"]):
        print(f"  {r.get('decoder', kind)!s:24s} {b}/{prec}{' fused' if fused else ''}: {r['ms_per_frame']:.2f} ms"
              f"  ({r.get('tokens_per_call', float('nan')):.2f} codes a call)")
else:
    print("whole frame: no result (see frames.log)")
for name in ("stream", "stream_paper"):
    s = load(f"{name}.json")
    if s is None:
        print(f"{name}: no result (see {name}.log)")
    else:
        print(f"{name}: {s.get('decoder')} on {s.get('device')} ({s.get('precision', s.get('dtype'))}): time to first "
              f"audio {s['ttfa_ms']:.0f} ms, RTF {s['rtf']:.2f}, {s['underruns']} underrun(s), {s['frames']} frames")
EOF
