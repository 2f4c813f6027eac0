"""Set-up in two commands: `make test` and `make paper` install the Debian packages themselves (README "Set-up").

``scripts/apt-voices.sh`` is run with fake ``id``, ``dpkg-query``, ``sudo`` and ``apt-get`` first on ``PATH`` (a
temporary folder holding them and links to the few real tools the script needs), so nothing is installed or removed
on this machine: every branch of the script is exercised and what it would have run is read back from a log.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "apt-voices.sh"
PACKAGES = ["flite", "festival", "festvox-us-slt-hts", "festvox-kallpc16k", "espeak-ng", "sox"]
BASH = shutil.which("bash")


def _bin(tmp: Path, real: tuple[str, ...]):
    """``(bin folder, log file, fake(name, body))``: a PATH folder holding links to the ``real`` tools the script
    uses, and a writer of fake programs into it."""
    bin_ = tmp / "bin"
    bin_.mkdir(parents=True)
    for tool in real:
        os.symlink(shutil.which(tool), bin_ / tool)

    def fake(name: str, body: str) -> None:
        (bin_ / name).write_text(f"#!{BASH}\n{body}\n")
        (bin_ / name).chmod(0o755)

    return bin_, tmp / "calls.log", fake


def _fake_path(tmp: Path, *, uid: int, installed: set[str], sudo: bool) -> tuple[dict, Path]:
    """A PATH with only fakes and the real tools the script uses; returns (env, log file)."""
    bin_, log, fake = _bin(tmp, ("grep", "env", "cat", "date"))
    fake("id", f'[ "$1" = "-u" ] && echo {uid}')
    cases = " ".join(sorted(installed)) or "__none__"
    fake("dpkg-query", f'echo "dpkg-query $*" >> {log}\n'
                       f'for p in {cases}; do [ "${{@: -1}}" = "$p" ] && {{ printf "install ok installed"; exit 0; }}; done\n'
                       'echo "dpkg-query: no packages found" >&2; exit 1')
    fake("apt-get", f'echo "apt-get $*" >> {log}')
    if sudo:
        fake("sudo", f'echo "sudo $*" >> {log}\n"$@"')
    env = {"PATH": str(bin_), "HOME": str(tmp), "LANG": "C.UTF-8"}
    return env, log


def _run(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([BASH, str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=60)


def _calls(log: Path) -> list[str]:
    return log.read_text().splitlines() if log.exists() else []


def test_no_root_no_sudo_prints_one_line_naming_the_command(tmp_path):
    env, log = _fake_path(tmp_path, uid=1000, installed={"flite", "festival"}, sudo=False)
    r = _run(env)
    assert r.returncode == 1
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1, r.stderr  # ONE line, no traceback-like noise
    missing = [p for p in PACKAGES if p not in {"flite", "festival"}]
    cmd = "apt-get update && apt-get install -y --no-install-recommends " + " ".join(missing)
    assert f"`{cmd}`" in lines[0] and "root" in lines[0] and "sudo" in lines[0], lines[0]
    assert not any(c.startswith(("apt-get", "sudo")) for c in _calls(log))  # nothing attempted


def test_sudo_is_used_when_not_root(tmp_path):
    env, log = _fake_path(tmp_path, uid=1000, installed=set(PACKAGES) - {"sox"}, sudo=True)
    r = _run(env)
    assert r.returncode == 0, r.stderr
    calls = [c for c in _calls(log) if not c.startswith("dpkg-query")]
    assert calls[0] == "sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq"
    assert calls[-1] == "apt-get install -y -qq --no-install-recommends sox"
    assert "sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends sox" in calls


def test_root_installs_without_sudo(tmp_path):
    env, log = _fake_path(tmp_path, uid=0, installed=set(), sudo=True)  # sudo present, but root needs none
    r = _run(env)
    assert r.returncode == 0, r.stderr
    calls = [c for c in _calls(log) if not c.startswith("dpkg-query")]
    assert calls == ["apt-get update -qq", "apt-get install -y -qq --no-install-recommends " + " ".join(PACKAGES)]


def test_everything_installed_is_a_dpkg_query_check_only(tmp_path):
    # no root, no sudo: still fine, because nothing is missing; no apt-get update, no network
    env, log = _fake_path(tmp_path, uid=1000, installed=set(PACKAGES), sudo=False)
    r = _run(env)
    assert r.returncode == 0 and "all installed" in r.stdout, (r.stdout, r.stderr)
    assert _calls(log) == [f"dpkg-query -W -f=${{Status}} {p}" for p in PACKAGES]


def test_make_test_and_make_paper_stop_at_the_message(tmp_path):
    """`make test` / `make paper` run the script before anything else and stop there when it fails."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("no make")
    env, log = _fake_path(tmp_path, uid=1000, installed=set(), sudo=False)
    os.symlink(BASH, Path(env["PATH"]) / "bash")
    for goal in ("test", "paper"):
        r = subprocess.run([make, "-C", str(REPO), "-o", ".venv/.installed", goal], env=env, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode != 0, goal
        ours = [ln for ln in r.stderr.splitlines() if ln.startswith("apt-voices:")]
        assert len(ours) == 1 and "apt-get install -y --no-install-recommends " + " ".join(PACKAGES) in ours[0]
        assert "pytest" not in r.stdout and "papermill" not in r.stdout, (goal, r.stdout)  # make stopped there


def test_the_makefile_runs_the_script_for_test_paper_and_embedded():
    make = shutil.which("make")
    if make is None:
        pytest.skip("no make")
    for goal, next_cmd in (("test", "pytest"), ("paper", "papermill"), ("embedded", "recipes.embedded.build")):
        env = {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}  # not an outer make's flags
        r = subprocess.run([make, "-n", "-C", str(REPO), "-o", ".venv/.installed", goal, "FIG_DIR=build/_dry_run"],
                           capture_output=True, text=True, timeout=60, env=env)
        assert r.returncode == 0, r.stderr
        lines = [ln for ln in r.stdout.splitlines() if not ln.startswith("make")]
        first = next(i for i, ln in enumerate(lines) if "scripts/apt-voices.sh" in ln)
        later = next(i for i, ln in enumerate(lines) if next_cmd in ln)
        assert first < later, (goal, lines)


def test_ci_and_readme_use_the_two_commands():
    ci = (REPO / ".ci" / "run").read_text()
    assert "make test" in ci
    readme = (REPO / "README.md").read_text()
    setup = readme[readme.index("## Set-up"):readme.index("\n## ", readme.index("## Set-up") + 5)]
    block = setup[setup.index("```bash") + 7:setup.index("```", setup.index("```bash") + 7)]
    lines = block.strip().splitlines()
    assert sorted(ln.split("#")[0].strip() for ln in lines) == ["make paper", "make test"]
    assert lines[0].startswith("make test")  # the quick one first; the full paper takes hours, and says so
    assert all(" on 2 cores" in ln and ("minutes" in ln or " h " in ln) for ln in lines), lines
    for needed in ("make paper SMOKE=1", "source .venv/bin/activate", ".venv/bin/rvqspec", "make lab"):
        assert needed in setup, needed


def _no_debian(tmp: Path, *, darwin: bool, brew: bool, have: set[str]) -> tuple[dict, Path]:
    """A PATH without dpkg-query (macOS or another Linux): fake ``uname``, ``brew`` (installs by creating the
    programs) and the voice programs in ``have``."""
    bin_, log, fake = _bin(tmp, ("grep", "env", "cat", "chmod"))
    fake("uname", f'echo {"Darwin" if darwin else "Linux"}')
    for b in have:
        fake(b, "exit 0")
    if brew:
        fake("brew", f'echo "brew $*" >> {log}\nfor b in "${{@:2}}"; do printf "#!{BASH}\\nexit 0\\n" > {bin_}/$b; '
                     f'chmod +x {bin_}/$b; done')
    return {"PATH": str(bin_), "HOME": str(tmp), "LANG": "C.UTF-8"}, log


def test_macos_installs_the_default_voices_with_homebrew(tmp_path):
    env, log = _no_debian(tmp_path, darwin=True, brew=True, have={"sox"})
    r = _run(env)
    assert r.returncode == 0, r.stderr
    assert _calls(log) == ["brew install flite espeak-ng"]  # only what is missing; no apt-get, no dpkg-query
    assert "festival's optional voices" in r.stdout and "skipped" in r.stdout


def test_without_debian_or_homebrew_one_line_names_the_programs(tmp_path):
    env, log = _no_debian(tmp_path, darwin=False, brew=False, have={"flite"})
    r = _run(env)
    assert r.returncode == 1 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "espeak-ng sox" in lines[0] and "brew install" in lines[0], r.stderr
    env, _ = _no_debian(tmp_path / "all", darwin=False, brew=False, have={"flite", "espeak-ng", "sox"})
    assert _run(env).returncode == 0  # everything on PATH: nothing to do
