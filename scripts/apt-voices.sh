#!/usr/bin/env bash
# Install the offline speech synthesisers the corpus renders with (rvqspec_lib/corpus.py), idempotently.
#
#   flite                 flite voices slt, kal16, awb, rms (`flite -voice NAME`)
#   festival + festvox-us-slt-hts, festvox-kallpc16k   festival HTS / diphone voices (`text2wave`)
#   espeak-ng             German, Spanish, Russian, Japanese, Mandarin (`espeak-ng -v de` ...)
#   sox                   resampling to 24 kHz
#
# Runs as root or through sudo; does nothing (and needs no network) when everything is installed already.
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

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
        echo "apt-voices: need root to install: ${missing[*]}" >&2; exit 1
    fi
fi

echo "apt-voices: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "apt-voices: done"
