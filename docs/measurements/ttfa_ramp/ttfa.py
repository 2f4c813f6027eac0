# Time to first audio of the default `rvqspec synth --model embedded --stream`, ramp (the default) and ramp 0,
# interleaved, N runs each. python ttfa.py N OUTDIR
import json, subprocess, sys, statistics
n, out = int(sys.argv[1]), sys.argv[2]
TEXT = "The quick brown fox jumps over the lazy dog while the farmer watches from afar."
PATCH = ("import sys; from rvqspec_lib.device.streaming_rvq import StreamingRVQDecoder as D; "
         "D.__init__.__kwdefaults__['ramp_frames'] = int(sys.argv.pop(1)); "
         "from rvqspec_lib.cli.main import main; sys.exit(main())")
rows = {4: [], 0: []}
for i in range(n):
    for ramp in (4, 0):
        j = f"{out}/r{ramp}_{i}.json"
        cmd = ["/work/main/.venv/bin/python", "-c", PATCH, str(ramp), "synth", "--model", "embedded", "--stream",
               "--text", TEXT, "--out", f"{out}/r{ramp}_{i}.wav", "--json", j]
        p = subprocess.run(cmd, capture_output=True, text=True, cwd="/work/main")
        if p.returncode:
            print(p.stderr[-2000:]); sys.exit(1)
        s = json.load(open(j))
        rows[ramp].append((s["ttfa_ms"], s["rtf"], s["underruns"], s.get("first_audio_frames")))
        print(ramp, i, rows[ramp][-1], flush=True)
for ramp, r in rows.items():
    print(f"ramp {ramp}: ttfa ms {[round(x[0]) for x in r]} median(warm) {statistics.median([x[0] for x in r[1:]]):.0f}"
          f" rtf {[round(x[1], 2) for x in r]} underruns {[x[2] for x in r]} first_audio_frames {r[0][3]}")
