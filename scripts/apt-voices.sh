#!/usr/bin/env bash
# Install the Debian packages the project needs (the corpus and notebook 00 render speech with them, the embedded
# model's text front end is espeak-ng phonemes; recipes/embedded/corpus.py), idempotently.
#
#   flite                 flite voices slt, kal16, awb, rms (`flite -voice NAME`)
#   festival + festvox-us-slt-hts, festvox-kallpc16k   festival HTS / diphone voices (`text2wave`)
#   espeak-ng             German, Spanish, Russian, Japanese, Mandarin (`espeak-ng -v de` ...)
#   sox                   resampling to 24 kHz (also called by the `sox` Python package and qwen-tts)
#
# `make test`, `make paper` and `make embedded` run it first (Makefile target `voices`).
# When every package is installed it only asks dpkg-query (no apt-get, no network) and exits 0 in well under a second.
# Otherwise it runs `apt-get update` + `apt-get install` as root, or through sudo when not root; with neither it prints
# ONE line naming the command to run as root and exits 1 (so make stops there).
set -euo pipefail

PACKAGES=(flite festival festvox-us-slt-hts festvox-kallpc16k espeak-ng sox)

missing=()
for p in "${PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing+=("$p")
    fi
done

if [ ${#missing[@]} -eq 0 ]; then
    echo "apt-voices: all installed (${PACKAGES[*]})"
    exit 0
fi

SUDO=()
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO=(sudo); else
        echo "apt-voices: missing Debian packages (${missing[*]}) and neither root nor sudo here: as root, run" \
             "\`apt-get update && apt-get install -y --no-install-recommends ${missing[*]}\`, then rerun make" >&2
        exit 1
    fi
fi

echo "apt-voices: installing ${missing[*]}${SUDO:+ (through sudo)}"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
"${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "apt-voices: done"
