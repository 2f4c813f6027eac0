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
# Without Debian's dpkg-query (macOS, other Linux): the programs the default voices need (flite, espeak-ng, sox) are
# looked up on PATH; on macOS with Homebrew the missing ones are installed (`brew install`). Festival's voices are not
# in Homebrew: they are optional (no default voice uses them) and said to be skipped.
set -euo pipefail

if ! command -v dpkg-query >/dev/null 2>&1; then
    need=()
    for b in flite espeak-ng sox; do command -v "$b" >/dev/null 2>&1 || need+=("$b"); done
    if [ ${#need[@]} -gt 0 ] && [ "$(uname -s)" = Darwin ] && command -v brew >/dev/null 2>&1; then
        echo "apt-voices: installing ${need[*]} with Homebrew"
        brew install "${need[@]}"
        need=()
        for b in flite espeak-ng sox; do command -v "$b" >/dev/null 2>&1 || need+=("$b"); done
    fi
    if [ ${#need[@]} -gt 0 ]; then
        echo "apt-voices: no Debian here and not on PATH: ${need[*]}: install them (macOS: brew install ${need[*]};" \
             "other systems: their packages of the same names), then rerun make" >&2
        exit 1
    fi
    echo "apt-voices: flite, espeak-ng and sox found (not Debian: festival's optional voices slt-hts and" \
         "kal-diphone are skipped; no default voice uses them)"
    exit 0
fi

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
