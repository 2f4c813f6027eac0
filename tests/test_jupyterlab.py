"""JupyterLab opens the paired jupytext notebooks as notebooks (README "Set-up", `make lab`).

The setting is a JupyterLab front-end one: the document manager's default viewer of Python files is jupytext's
notebook (``jupyter/overrides.json``), installed by the Makefile into the ``overrides.d`` folder of the venv's
JupyterLab application settings. Here a real ``jupyter lab`` server is started from .venv on 127.0.0.1 (a free port,
a token, every user folder in tmp_path, the settings folder filled by the Makefile's own rule), and through its
REST API:

* the settings API gives the override as the default of ``defaultViewers`` (the negative control: the schema as
  JupyterLab ships it has no default viewer for Python);
* the contents API opens ``notebooks/01_rvq_bottleneck.py`` as a notebook (jupytext's contents manager): cells,
  the first code cell tagged ``parameters``;
* every ``notebooks/NN_*.py`` opened as a notebook and saved back unchanged through the contents API (what
  JupyterLab's save does) is byte-identical, twice over, and also after a kernel's traces (``language_info``,
  outputs, execution counts) are added: the repository's ``jupytext.toml`` keeps jupytext from adding its
  version lines to the header (the negative control: without that filter, the first save changes the file);

and the server is stopped (terminate, then kill) whatever happened. A last test checks that the Makefile's install
path is the settings folder JupyterLab reads from .venv.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
OVERRIDES = REPO / "jupyter" / "overrides.json"
DOCMANAGER = "@jupyterlab/docmanager-extension:plugin"
NOTEBOOK = "notebooks/01_rvq_bottleneck.py"
START_TIMEOUT_S = 120  # a bound on the wait, not a timing check: a busy machine starts the server in seconds

pytest.importorskip("jupyterlab")
pytest.importorskip("jupytext")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _make_env() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("MAKE")}


def _install_settings(settings_dir: Path) -> Path:
    """The Makefile's own rule, pointed at ``settings_dir`` (LAB_SETTINGS overridden; .venv not rebuilt)."""
    target = settings_dir / "overrides.d" / "rvqspec.json"
    r = subprocess.run([shutil.which("make"), "-C", str(REPO), "-o", ".venv/.installed", f"LAB_SETTINGS={target}",
                        str(target)], capture_output=True, text=True, timeout=60, env=_make_env())
    assert r.returncode == 0, r.stdout + r.stderr
    return target


def _get(url: str, token: str) -> dict:
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def _put(url: str, token: str, model: dict) -> dict:
    req = urllib.request.Request(url, data=json.dumps(model).encode(), method="PUT",
                                 headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        return json.loads(resp.read())


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    if shutil.which("make") is None:
        pytest.skip("needs make")
    tmp = tmp_path_factory.mktemp("lab")
    settings = tmp / "app-settings"
    _install_settings(settings)
    port, token = _free_port(), secrets.token_hex(16)
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(tmp / "config"), "JUPYTER_DATA_DIR": str(tmp / "data"),
           "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"), "JUPYTERLAB_SETTINGS_DIR": str(tmp / "user-settings"),
           "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces"), "HOME": str(tmp)}
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
           "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={REPO}",
           f"--LabApp.app_settings_dir={settings}"] + (["--allow-root"] if os.geteuid() == 0 else [])
    log = (tmp / "server.log").open("w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"jupyter lab exited ({proc.returncode}): {(tmp / 'server.log').read_text()[-2000:]}")
            try:
                _get(f"{base}/api/status", token)
                break
            except (urllib.error.URLError, ConnectionError, OSError):
                if time.monotonic() > deadline:
                    pytest.fail(f"jupyter lab did not answer in {START_TIMEOUT_S} s: "
                                f"{(tmp / 'server.log').read_text()[-2000:]}")
                time.sleep(0.5)
        yield base, token
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=20)
        log.close()


def test_settings_api_gives_python_files_the_jupytext_notebook_viewer(server):
    base, token = server
    got = _get(f"{base}/lab/api/settings/{DOCMANAGER}", token)
    viewers = got["schema"]["properties"]["defaultViewers"]["default"]
    assert viewers == json.loads(OVERRIDES.read_text())[DOCMANAGER]["defaultViewers"]
    assert viewers["python"] == "Jupytext Notebook"
    # negative control: JupyterLab's own schema (what a server without the override serves) has no such default
    from jupyterlab.commands import get_app_dir

    shipped = json.loads((Path(get_app_dir()) / "schemas" / "@jupyterlab" / "docmanager-extension" /
                          "plugin.json").read_text())
    assert "python" not in shipped["properties"]["defaultViewers"]["default"]


def test_contents_api_opens_the_py_notebook_as_a_notebook(server):
    base, token = server
    nb = _get(f"{base}/api/contents/{NOTEBOOK}?type=notebook&content=1", token)
    assert nb["type"] == "notebook" and nb["format"] == "json"
    cells = nb["content"]["cells"]
    code = [c for c in cells if c["cell_type"] == "code"]
    assert len(code) > 1 and "parameters" in code[0]["metadata"].get("tags", [])
    # the same file as plain text is the jupytext source the notebook was read from (not a cached .ipynb)
    text = _get(f"{base}/api/contents/{NOTEBOOK}?type=file&content=1", token)
    assert text["type"] == "file" and text["content"] == (REPO / NOTEBOOK).read_text()


def test_saving_every_notebook_unchanged_leaves_its_source_byte_identical(server):
    base, token = server
    sources = sorted((REPO / "notebooks").glob("[0-9][0-9]_*.py"))
    assert len(sources) >= 2
    before = {src: src.read_bytes() for src in sources}
    try:
        for src in sources:
            url = f"{base}/api/contents/notebooks/{src.name}"
            for save in range(2):
                nb = _get(f"{url}?type=notebook&content=1", token)
                content = nb["content"]
                if save == 1:  # what running the notebook in a kernel adds to the model before a save
                    content["metadata"]["language_info"] = {"name": "python", "version": "3.11.0"}
                    for i, cell in enumerate(c for c in content["cells"] if c["cell_type"] == "code"):
                        cell["execution_count"] = i + 1
                        cell["outputs"] = [{"output_type": "stream", "name": "stdout", "text": "x\n"}]
                _put(url, token, {"type": "notebook", "format": "json", "content": content})
                assert src.read_bytes() == before[src], f"save {save + 1} of {src.name} changed it"
    finally:  # a failing save must not leave the checkout dirty
        for src, data in before.items():
            if src.read_bytes() != data:
                src.write_bytes(data)


def test_without_the_repositorys_filter_jupytext_would_add_its_version_lines():
    """The negative control of the round trip: the same read and write through jupytext with no configuration adds
    the format and jupytext version lines to the header; with the repository's configuration it does not."""
    import jupytext
    from jupytext.config import load_jupytext_configuration_file

    src = (REPO / NOTEBOOK).read_text()
    config = load_jupytext_configuration_file(str(REPO / "jupytext.toml"))
    bare = jupytext.writes(jupytext.reads(src, fmt="py:percent"), fmt="py:percent")
    assert bare != src and "jupytext_version:" in bare and "jupytext_version:" not in src
    kept = jupytext.writes(jupytext.reads(src, fmt="py:percent"), fmt="py:percent", config=config)
    assert kept == src


def test_the_makefile_installs_the_setting_where_the_venvs_jupyterlab_reads_it():
    if shutil.which("make") is None:
        pytest.skip("needs make")
    from jupyterlab.commands import get_app_dir

    r = subprocess.run([shutil.which("make"), "-C", str(REPO), "-n", "-o", ".venv/.installed", "-W",
                        "jupyter/overrides.json", "lab"], capture_output=True, text=True, timeout=60, env=_make_env())
    assert r.returncode == 0, r.stderr
    install = next(ln for ln in r.stdout.splitlines() if ln.startswith("install ") and "overrides.json" in ln)
    target = (REPO / install.split()[-1]).resolve()
    assert target.parent == (Path(get_app_dir()) / "settings" / "overrides.d").resolve()
    lab = next(ln for ln in r.stdout.splitlines() if " lab " in ln and "jupyter" in ln)
    assert "--ip=127.0.0.1" in lab and lab.split()[0] == ".venv/bin/jupyter"


def test_notebook_progress_bars_have_their_widgets(monkeypatch):
    """tqdm's notebook bar (tqdm.auto under a kernel, as datasets and transformers use it) builds its ipywidgets
    progress bar; without ipywidgets (the negative control: ``IProgress`` absent) it fails with the warning a user
    saw, "IProgress not found"."""
    from importlib.metadata import version

    import tqdm.notebook as tn

    pins = dict(ln.split("==") for ln in (REPO / "requirements.txt").read_text().splitlines()
                if "==" in ln and not ln.startswith("#"))
    assert version("ipywidgets") == pins["ipywidgets"]
    assert type(tn.tqdm_notebook.status_printer(None, total=3, desc="x")).__name__ == "TqdmHBox"
    monkeypatch.setattr(tn, "IProgress", None)
    with pytest.raises(ImportError, match="IProgress not found"):
        tn.tqdm_notebook.status_printer(None, total=3, desc="x")
