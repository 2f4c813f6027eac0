"""Add the calibration split to an embedded-model build that was made before the recipe had one.

The recipe (recipes/embedded/build.py, stage ``texts``) now renders ``--n-calib`` calibration sentences with the
training voices, encodes them with the codec and ships their codes beside the evaluation split; a build made before
that has no ``calibration`` rows. This script adds exactly those utterances to ``<dir>/utterances.safetensors`` and
``.jsonl``: the same seeded sentences (``calibration_sentences``), the same voices (one per sentence, chosen by a hash
of the sentence), the build's own codec. It does nothing when the split is there already; the files are rewritten
atomically.

    python scripts/ship_calibration.py [--dir data/embedded] [--n 100] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from recipes.embedded.build import PRESETS, calibration_sentences  # noqa: E402

from recipes.embedded import corpus  # noqa: E402

from rvqspec_lib.data import voices
from recipes.embedded.codes import encode_manifest  # noqa: E402
from rvqspec_lib.models.rvq_codec import RVQCodec  # noqa: E402
from rvqspec_lib.data.utterances import load_codes, write_shipped_utterances  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", default="data/embedded", help="the build's deliverable folder")
    ap.add_argument("--n", type=int, default=PRESETS["full"]["n_calib"], help="calibration sentences")
    ap.add_argument("--seed", type=int, default=0, help="the build's --seed")
    ap.add_argument("--voices", default=PRESETS["full"]["voices"], help="the build's voices")
    a = ap.parse_args(argv)
    root = Path(a.dir)
    path = root / "utterances.safetensors"
    rows = [json.loads(line) for line in path.with_suffix(".jsonl").read_text().splitlines() if line.strip()]
    if any(r["split"] == "calibration" for r in rows):
        print(f"{path}: the calibration split is there already")
        return 0
    sents = calibration_sentences(a.n, a.seed)
    codes = load_codes(path)
    with tempfile.TemporaryDirectory() as tmp:
        voices.render_corpus(sents, tmp, voices=a.voices.split(","), one_voice_each=True)
        new = corpus.read_manifest(tmp)  # absolute audio paths
        new_codes = encode_manifest(new, RVQCodec.load(root / "codec.safetensors", decoder=None))
    new = [r for r in new if len(new_codes[r["id"]])]
    assert all(r["split"] == "calibration" for r in new), "a calibration sentence hashed to another split"
    codes.update(new_codes)
    write_shipped_utterances(rows + new, codes, path)
    print(f"{path}: added {len(new)} calibration utterances, "
          f"{sum(len(new_codes[r['id']]) for r in new)} frames ({sum(r['seconds'] for r in new) / 60:.1f} min)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
