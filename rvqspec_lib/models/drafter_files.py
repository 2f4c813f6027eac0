"""Drafters on disk: ``<name>.safetensors`` (the tensors; the header metadata holds the JSON description) and
``<name>.json`` beside it (the same description, for people and Makefiles). :func:`make_drafter` builds one by name
from a file or from beside a model (``<model_dir>/drafters/<name>.safetensors``).
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import safetensors.torch
from safetensors import SafetensorError, safe_open

from rvqspec_lib.common.files import atomic_outputs, json_text
from rvqspec_lib.decoding.drafters import (DEFAULT_K, DRAFTERS, MedusaHeads, PositionOffsets, ReusedHeads, _check_name,
                                           fresh_drafter)
from rvqspec_lib.decoding.predictor import n_codes
from rvqspec_lib.models import loader

#: The ``format`` and ``version`` of a drafter file's description.
FORMAT, FORMAT_VERSION = "rvqspec-drafter", 1


def drafter_path(model_dir: str | os.PathLike, name: str) -> Path:
    """Where a trained drafter lives beside a model: ``<model_dir>/drafters/<name>.safetensors``."""
    _check_name(name)
    return Path(model_dir) / "drafters" / f"{name}.safetensors"


def cache_root() -> Path:
    """The project's cache folder: ``$RVQSPEC_CACHE``, else ``~/.cache/rvqspec``."""
    return Path(os.environ.get("RVQSPEC_CACHE") or Path("~/.cache/rvqspec").expanduser())


def cache_model_dir(model: str | os.PathLike) -> Path:
    """Where ``rvqspec prepare`` writes a model's files when its own folder is read-only (a hub cache) or it has
    none (a hub id): ``<cache_root>/models/<name>``, the hub id's ``/`` as ``--``, a folder's name followed by a
    digest of its absolute path (two folders of one name never share)."""
    p = Path(model).expanduser()
    if p.is_dir():
        digest = hashlib.sha1(str(p.resolve()).encode()).hexdigest()[:10]
        return cache_root() / "models" / f"{p.resolve().name}-{digest}"
    return cache_root() / "models" / str(model).replace("/", "--")


#: What ``rvqspec prepare`` writes into a model's folder (and what the embedded model ships): the spoken
#: utterances, the trained drafters, the calibrated trees.
PREPARED = ("utterances.safetensors", "drafters", "trees")


def model_drafter_dir(model: str | os.PathLike) -> Path | None:
    """The folder whose ``drafters/``, ``trees/`` and ``utterances.safetensors`` belong to a model:
    ``"embedded"`` -> ``data/embedded/model``; our own model's folder -> itself; a checkpoint folder -> itself where
    it holds prepared files or can be written, else its :func:`cache_model_dir` (a read-only folder: a hub cache);
    a hub id -> its :func:`cache_model_dir`; a loaded model -> that of its folder, or of its name for a hub id;
    anything else (``tiny-random``, the random-size models) -> ``None``.
    """
    if isinstance(model, loader.LoadedModel):  # the loaded model knows its folder
        if model.folder is not None:
            return model_drafter_dir(model.folder)
        return cache_model_dir(model.name) if model.kind in ("checkpoint", "random-checkpoint") else None
    if str(model) == loader.EMBEDDED_MODEL:  # read at call time: tests and RVQSPEC_EMBEDDED_DIR move it
        return loader.EMBEDDED_DIR / "model"
    p = Path(model).expanduser()
    if p.is_dir():
        cached = cache_model_dir(p)
        prepared = [any((d / f).exists() for f in PREPARED) for d in (p, cached)]
        if (p / loader.OWN_MODEL_MARKER).is_file() or not (p / "config.json").is_file() or prepared[0]:
            return p  # our own model, a folder of drafters, or a checkpoint prepared beside itself
        return cached if prepared[1] or not os.access(p, os.W_OK) else p
    try:
        kind, _ = loader._resolve(str(model))
    except ValueError:
        return None
    return cache_model_dir(str(model)) if kind == "hub" else None


def shipped_drafters(model: str | os.PathLike) -> list[str]:
    """Names of the trained drafters shipped beside a model, sorted (``heads`` needs no file and is not listed)."""
    d = model_drafter_dir(model)
    return sorted(p.stem for p in (d / "drafters").glob("*.safetensors")) if d is not None else []


HEADS_INSTEAD = "@heads (the reused heads, no training)"


def check_shipped_drafter(model: str | os.PathLike, name: str, *, heads_instead: str | None = None) -> None:
    """Before loading: a drafter named in a decoder (``@offsets``, ``paper``) must be shipped beside the model.
    ``heads_instead``: how the message names the same decoder drafting with the reused heads (default
    :data:`HEADS_INSTEAD`).

    Raises:
        ValueError: (one line) a model without a folder, no ``drafters/<name>.safetensors``, a damaged header.
    """
    if name == "heads":
        return
    d, model = model_drafter_dir(model), getattr(model, "name", model)  # a loaded model: named by its name
    if d is None:
        raise ValueError(f"the {name!r} drafter is not shipped beside {model} (it has no folder of its own): use a "
                         f"checkpoint folder, a hub id or the embedded model, or use "
                         f"{heads_instead or HEADS_INSTEAD}")
    have, file = shipped_drafters(model), d / "drafters" / f"{name}.safetensors"
    if name not in have:
        raise ValueError(f"the {name!r} drafter is not shipped beside {model} (no {file}; shipped: "
                         f"{', '.join(have) or 'none'}): make it with `{prepare_command(model)}`, or "
                         + _how_to_train(name, str(file), heads_instead))
    read_description(file)  # its header, cheaply: a damaged file fails here


def shipped_drafter(model: str | os.PathLike, name: str, code_predictor):
    """The drafter ``name`` shipped beside a model (``heads``: the reused heads), on the code predictor's device.

    Raises:
        ValueError: not shipped (:func:`check_shipped_drafter`), a file for another code predictor.
    """
    check_shipped_drafter(model, name)
    return make_drafter(name, code_predictor, model_drafter_dir(model))


def prepare_command(model: str | os.PathLike) -> str:
    """The command that makes everything the paper's decoder needs beside a model (spoken frames, the offsets, the
    calibrated trees of every drafter, the ``auto`` timing): ``rvqspec prepare --model <model>``, for messages."""
    return f"rvqspec prepare --model {getattr(model, 'name', model)}"


def _how_to_train(name: str, where: str, heads_instead: str | None = None) -> str:
    return (f"train one with `rvqspec train-drafter --model <model> --drafter {name} --out {where}` "
            f"(or rvqspec_lib.training.drafters.train_drafter), or use "
            f"{heads_instead or HEADS_INSTEAD}")


def make_drafter(name: str, code_predictor, path: str | os.PathLike | None = None, *, fresh: bool = False,
                 K: int = DEFAULT_K):
    """A drafter by ``name`` (``"heads"``: nothing to load, ``"offsets"``, ``"medusa"``) for ``code_predictor``, read
    from ``path`` (a drafter file, or a model folder holding ``drafters/<name>.safetensors``), or ``fresh``: untrained,
    of ``K`` offsets.

    Raises:
        ValueError: an unknown name; a file for another drafter or another code predictor size.
        FileNotFoundError: no trained drafter where asked (the message says how to train one).
    """
    _check_name(name)
    if name == "heads":
        return ReusedHeads()
    if fresh:
        return fresh_drafter(name, code_predictor, K=K)
    if path is None:
        raise FileNotFoundError(f"no trained {name!r} drafter given: pass --drafter-path <file>.safetensors (or a "
                                f"model directory holding drafters/{name}.safetensors); "
                                f"{_how_to_train(name, '<file>.safetensors')}")
    p = Path(path).expanduser()
    p = drafter_path(p, name) if p.is_dir() else p
    if not p.is_file():
        raise FileNotFoundError(f"no trained {name!r} drafter at {p}: {_how_to_train(name, str(p))}")
    d = load_drafter(p, code_predictor)
    if d.name != name:
        raise ValueError(f"{p} holds a {d.name!r} drafter, not {name!r}")
    return d


def save_drafter(drafter, path: str | os.PathLike) -> Path:
    """Write a trained drafter, both files or neither: ``path`` (safetensors, its JSON description in the header
    under ``"rvqspec"``) and that description (name, constructor arguments, tensor shapes, ``params_added``,
    ``provenance``) in ``path.with_suffix(".json")``.

    Raises:
        ValueError: :class:`ReusedHeads` (nothing to save), or a path not ending in ``.safetensors``.
    """
    if not isinstance(drafter, (PositionOffsets, MedusaHeads)):
        raise ValueError(f"only trained drafters (offsets, medusa) are saved; {type(drafter).__name__} has no "
                         "parameters: use make_drafter('heads', ...)")
    path = Path(path)
    if path.suffix != ".safetensors":
        raise ValueError(f"drafter files end in .safetensors, got {path.name}")
    path.parent.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in drafter.state_dict().items()}
    desc = {"format": FORMAT, "version": FORMAT_VERSION, "name": drafter.name, "config": drafter.config(),
            "params_added": drafter.params_added, "tensors": {k: list(v.shape) for k, v in tensors.items()},
            "provenance": drafter.provenance}
    text = json_text(desc)
    with atomic_outputs([path, path.with_suffix(".json")]) as (tmp, tmp_side):  # both files or neither, even on Ctrl-C
        safetensors.torch.save_file(tensors, str(tmp), metadata={"rvqspec": text})
        tmp_side.write_text(text + "\n")
    return path


def read_description(path: str | os.PathLike) -> dict:
    """The JSON description stored in a drafter file's header (no tensors are read).

    Raises:
        ValueError: a damaged file, not an rvqspec drafter file (one line).
    """
    try:
        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
    except SafetensorError as e:
        raise ValueError(f"drafter file {path} is damaged ({e}): copy it again (git checkout) or retrain it "
                         "(rvqspec train-drafter)") from None
    if "rvqspec" not in meta:
        raise ValueError(f"{path} is not an rvqspec drafter file (no 'rvqspec' header metadata)")
    desc = json.loads(meta["rvqspec"])
    if desc.get("format") != FORMAT or desc.get("name") not in DRAFTERS[1:]:
        raise ValueError(f"{path}: unexpected drafter description {desc.get('format')!r} / {desc.get('name')!r}")
    return desc


def load_drafter(path: str | os.PathLike, code_predictor):
    """Load a drafter written by :func:`save_drafter`, on the code predictor's device.

    Raises:
        FileNotFoundError: no such file. ValueError: not a drafter file, or sizes that do not match
            ``code_predictor`` (hidden size, vocabulary, codes per frame).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no drafter file {path}")
    desc = read_description(path)
    cfg = dict(desc["config"])
    want = {"hidden_size": int(code_predictor.config.hidden_size), "vocab_size": int(code_predictor.config.vocab_size),
            "n_codes": n_codes(code_predictor)}
    bad = {k: (cfg[k], v) for k, v in want.items() if k in cfg and int(cfg[k]) != v}
    if bad:
        raise ValueError(f"{path} was trained for another code predictor: " +
                         ", ".join(f"{k} {a} (file) vs {b} (model)" for k, (a, b) in bad.items()))
    drafter = PositionOffsets(**cfg) if desc["name"] == "offsets" else MedusaHeads(**cfg)
    drafter.load_state_dict(safetensors.torch.load_file(str(path)))
    drafter.provenance = dict(desc.get("provenance") or {})
    return drafter.to(next(code_predictor.parameters()).device).eval()
