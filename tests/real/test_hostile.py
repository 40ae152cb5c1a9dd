"""Hostile sources: a local server (tools/hubserver.py, 127.0.0.1 only) playing an attacker.

Every case runs the ``edgekv`` command (in this process, through the CLI's ``main``, with the case's environment
and working directory; the deadline cases in a child process, where a hung read cannot outlive the test) and
asserts its exit code, that it printed exactly one line on stderr (no traceback, no 'internal error'), that its
wall time is bounded (deadlines set small through ``--fetch-timeout``, never by sleeping long), and that no file
appeared anywhere in the temporary directory outside the two cache roots (the whole tree is compared before and
after; a victim file stands where the attacks aim).

The hub serves SmolLM2's header-only stand-in (the committed header with a hole of the weights' size,
tests/headers.py): every case reads a header or fails before the weights.  A case that reads a model predicts its
KV cache only (``--kv-only``): the process's memory needs the runtime's calibration, a llama.cpp child, and is not
what is tested here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import quote

import pytest
from conftest import SMOL_FILE, SMOL_REPO

from edgekv.cli.main import main

CACHES = ("edgekv-home", "hf-cache")


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Every entry under ``root`` with its size and mtime (empty when it does not exist)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            try:
                st = p.lstat()
            except OSError:
                continue
            out[str(p.relative_to(root))] = (st.st_size, st.st_mtime_ns)
    return out


class Sandbox:
    """A temporary directory with the two cache roots, a victim file, and the local hub's address."""

    def __init__(self, root: Path, hub, monkeypatch, capsys):
        self.root = root
        self.hub = hub
        self.monkeypatch, self.capsys = monkeypatch, capsys
        self.victim = root / "victim" / "home" / "user"
        self.victim.mkdir(parents=True)
        (self.victim / ".profile").write_text("# the user's own file\n")
        for c in CACHES:
            (root / c).mkdir()

    def env(self, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "EDGEKV_DEBUG")}
        env.update({"EDGEKV_HOME": str(self.root / "edgekv-home"), "HF_HUB_CACHE": str(self.root / "hf-cache"),
                    "HF_ENDPOINT": self.hub.endpoint, "HF_HUB_DISABLE_TELEMETRY": "1",
                    "EDGEKV_MODELS": str(self.root / "models.toml") if (self.root / "models.toml").exists()
                    else env.get("EDGEKV_MODELS", "")})
        if not env["EDGEKV_MODELS"]:
            del env["EDGEKV_MODELS"]
        env.update(extra)
        return env

    def run(self, *args: str, process: bool = False, **extra: str) -> tuple[int, str, str, float]:
        """``edgekv ARGS`` with the environment ``extra`` adds: in this process, or in a child (``process``)."""
        before = _snapshot(self.root)
        t0 = time.monotonic()
        if process:
            p = subprocess.run([sys.executable, "-m", "edgekv.cli", *args], capture_output=True, text=True,
                               env=self.env(**extra), timeout=90, cwd=self.root)
            rc, out, err = p.returncode, p.stdout, p.stderr
        else:
            rc, out, err = self._main(list(args), self.env(**extra))
        wall = time.monotonic() - t0
        after = _snapshot(self.root)
        changed = [k for k, v in after.items() if before.get(k) != v]
        outside = [k for k in changed if k.split(os.sep, 1)[0] not in CACHES]
        assert not outside, f"edgekv wrote outside its caches: {outside}"
        assert (self.victim / ".profile").read_text() == "# the user's own file\n"
        return rc, out, err, wall

    def _main(self, argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
        self.capsys.readouterr()
        with self.monkeypatch.context() as m:
            m.chdir(self.root)
            for k in set(os.environ) - set(env):
                m.delenv(k)
            for k, v in env.items():
                m.setenv(k, v)
            rc = main(argv)
        out, err = self.capsys.readouterr()
        return rc, out, err


def one_line_error(rc: int, err: str, *needles: str, code: int = 1) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert rc == code, err
    assert len(lines) == 1, err
    line = lines[0]
    assert line.startswith("edgekv: error: "), line
    assert "internal error" not in line and "Traceback" not in err
    for n in needles:
        assert n in line, line
    return line


@pytest.fixture
def box(header_hub, sparse_models, tmp_path, monkeypatch, capsys):
    hub = header_hub
    hub.reset()
    hub.any_file = sparse_models["smollm2"]
    hub.drip_s = 0.5
    yield Sandbox(tmp_path, hub, monkeypatch, capsys)
    hub.commit_override = None
    hub.drip_head = False
    hub.any_file = None


# -- 1. containment --------------------------------------------------------------------------------

def test_url_with_encoded_absolute_path_stays_in_the_cache(box):
    target = box.victim / ".profile"
    url = f"{box.hub.endpoint}/any/{quote(str(target), safe='')}"
    rc, out, err, _ = box.run("predict", url, "-c", "512", "-ctk", "f16", "--kv-only", "--json")
    assert rc == 0, err            # a valid model: predicted, its header cached under a hashed name
    assert json.loads(out)[0]["status"] == "ok"
    cached = list((box.root / "edgekv-home" / "headers" / "url").glob("*/*"))
    assert sorted(p.name for p in cached) == ["model.gguf", "model.gguf.json"]


@pytest.mark.parametrize("depth", [2, 12])
def test_url_with_encoded_dotdot_segments_stays_in_the_cache(box, depth):
    rel = "../" * depth + str(box.victim.relative_to("/")) + "/x.gguf"
    url = f"{box.hub.endpoint}/any/{quote(rel, safe='')}"
    rc, out, err, _ = box.run("predict", url, "-c", "512", "-ctk", "f16", "--kv-only", "--json")
    assert rc == 0, err
    assert not (box.victim / "x.gguf").exists()


@pytest.mark.parametrize("spec,needle", [
    (f"hf://{SMOL_REPO}/../../../x.gguf", "'..' segment"),
    (f"hf://{SMOL_REPO}/a/..%2F..%2Fx.gguf@main", None),        # not decoded: a literal name, not found
    (f"hf://../repo/{SMOL_FILE}", "repository id"),
    (f"hf://owner/re..po/{SMOL_FILE}", "repository id"),
    (f"hf://{SMOL_REPO}/{SMOL_FILE}@..", "revision"),
    (f"hf://{SMOL_REPO}/{SMOL_FILE}@a/../../b", "revision"),
    (f"hf://{SMOL_REPO}/" + "x" * 300 + ".gguf", "longer than 255 bytes"),
    (f"hf://{SMOL_REPO}/x\x01y.gguf", "control character"),
])
def test_hf_spec_with_unsafe_parts_is_refused(box, spec, needle):
    rc, out, err, wall = box.run("predict", spec, "-c", "512", "-ctk", "f16")
    line = one_line_error(rc, err)
    if needle:
        assert needle in line
    assert wall < 60


def test_url_with_an_over_long_file_name_uses_a_fixed_name(box):
    rc, out, err, _ = box.run("predict", f"{box.hub.endpoint}/any/{'x' * 400}.gguf", "-c", "512", "-ctk", "f16", "--kv-only")
    assert rc == 0, err
    assert [p.name for p in (box.root / "edgekv-home" / "headers" / "url").glob("*/*.gguf")] == ["model.gguf"]


def test_resolve_url_with_encoded_path_is_refused(box):
    url = f"{box.hub.endpoint}/{SMOL_REPO}/resolve/main/" + quote("../../../../victim/x.gguf", safe="")
    rc, out, err, _ = box.run("predict", url, "-c", "512", "-ctk", "f16")
    one_line_error(rc, err, "'..' segment")


@pytest.mark.parametrize("commit", ["../../../../victim/home/user", "/tmp/x", "0" * 39 + "/", "A" * 40])
def test_hub_commit_header_never_chooses_a_path(box, commit):
    box.hub.commit_override = commit.replace("/tmp/x", str(box.victim))
    rc, out, err, _ = box.run("predict", f"hf://{SMOL_REPO}/{SMOL_FILE}", "-c", "512", "-ctk", "f16")
    one_line_error(rc, err, "X-Repo-Commit", "not 40 lowercase hex")


def test_models_toml_entry_reaching_a_hostile_hub(box):
    (box.root / "models.toml").write_text(f'''schema_version = 1
[models."evil"]
hf_repo = "{SMOL_REPO}"
file = "{SMOL_FILE}"
revision = "unknown"
sha256 = "unknown"
description = "a valid entry"
license = "apache-2.0"
''')
    box.hub.commit_override = "../../../../../victim/home/user"
    rc, out, err, _ = box.run("predict", "evil", "-c", "512", "-ctk", "f16")
    one_line_error(rc, err, "X-Repo-Commit")


@pytest.mark.parametrize("file,needle", [("a\x00b.gguf", "NUL"), ("x" * 300 + ".gguf", "255 bytes"),
                                         ("../x.gguf", ".gguf"), ("/abs/x.gguf", ".gguf")])
def test_models_toml_unsafe_file_names(box, file, needle):
    (box.root / "models.toml").write_text(f'''schema_version = 1
[models."evil"]
hf_repo = "{SMOL_REPO}"
file = {json.dumps(file)}
revision = "unknown"
sha256 = "unknown"
description = "d"
license = "apache-2.0"
''')
    rc, out, err, _ = box.run("predict", "evil", "-c", "512", "-ctk", "f16")
    one_line_error(rc, err, "models.toml", needle)


def test_offline_read_through_a_crafted_name_is_refused(box, tmp_path):
    """A symlink planted in the header cache cannot make edgekv read outside it."""
    commit = box.hub.smol_commit
    d = box.root / "edgekv-home" / "headers" / "hf" / SMOL_REPO.replace("/", "--") / commit
    d.mkdir(parents=True)
    (d / SMOL_FILE).symlink_to(box.victim / ".profile")
    rc, out, err, _ = box.run("predict", f"hf://{SMOL_REPO}/{SMOL_FILE}@{commit}", "-c", "512",
                              HF_HUB_OFFLINE="1")
    one_line_error(rc, err, "outside edgekv's cache")


# -- 2. deadlines, redirects, encodings ------------------------------------------------------------
# The deadline cases wait out their deadline (3 s each) in a child process: slow by their nature.

@pytest.mark.slow
@pytest.mark.parametrize("route", ["drip", "driphead", "stall"])
def test_dripping_url_server_hits_the_deadline(box, route):
    url = f"{box.hub.endpoint}/{route}/{SMOL_FILE}"
    rc, out, err, wall = box.run("--fetch-timeout", "3", "predict", url, "-c", "512", process=True)
    one_line_error(rc, err, "giving up" if route != "stall" else "")
    assert wall < 45       # the deadline is 3 s; generous for a busy 2-core machine (start-up included)


@pytest.mark.slow
def test_dripping_hub_head_hits_the_deadline(box):
    box.hub.drip_head = True
    rc, out, err, wall = box.run("predict", f"hf://{SMOL_REPO}/{SMOL_FILE}", "-c", "512",
                                 EDGEKV_FETCH_TIMEOUT="3", process=True)
    one_line_error(rc, err, "giving up")
    assert wall < 45


@pytest.mark.slow
def test_dripping_cdn_body_hits_the_deadline(box):
    box.hub.drip_cdn = True
    try:
        rc, out, err, wall = box.run("--fetch-timeout", "3", "predict", f"hf://{SMOL_REPO}/{SMOL_FILE}", "-c", "512",
                                     process=True)
    finally:
        box.hub.drip_cdn = False
    one_line_error(rc, err, "giving up", "in 3 s")
    assert wall < 45


def test_bad_fetch_timeout_is_a_usage_error(box):
    rc, out, err, _ = box.run("--fetch-timeout", "0", "predict", "x.gguf")
    one_line_error(rc, err, "--fetch-timeout", code=2)
    rc, out, err, _ = box.run("predict", f"{box.hub.endpoint}/any/x.gguf", EDGEKV_FETCH_TIMEOUT="soon")
    one_line_error(rc, err, "EDGEKV_FETCH_TIMEOUT", code=2)


@pytest.mark.parametrize("route,needles", [
    ("loop/x.gguf", ("redirect loop",)),
    (f"gzip/{SMOL_FILE}", ("Content-Encoding: gzip",)),
    (f"badcr/start/{SMOL_FILE}", ("Content-Range",)),
    (f"badcr/end/{SMOL_FILE}", ("Content-Range",)),
    (f"badcr/total/{SMOL_FILE}", ("Content-Range",)),
    (f"lielen/short/{SMOL_FILE}", ("Content-Length",)),
    (f"lielen/long/{SMOL_FILE}", ()),
])
def test_protocol_lies_are_one_line(box, route, needles):
    rc, out, err, wall = box.run("--fetch-timeout", "10", "predict", f"{box.hub.endpoint}/{route}", "-c", "512")
    one_line_error(rc, err, *needles)
    assert wall < 60


def test_content_range_with_unknown_total_is_handled(box, sparse_models):
    smollm2_path = sparse_models["smollm2"]
    rc, out, err, _ = box.run("predict", f"{box.hub.endpoint}/badcr/star/{SMOL_FILE}", "-c", "512", "-ctk", "f16",
                              "--kv-only", "--json")
    assert rc == 0, err
    rc2, out2, err2, _ = box.run("predict", str(smollm2_path), "-c", "512", "-ctk", "f16", "--kv-only", "--json")
    got, want = json.loads(out)[0]["prediction"]["formula"], json.loads(out2)[0]["prediction"]["formula"]
    assert got["total_bytes"] == want["total_bytes"] and got["status"] == want["status"] == "ok"


@pytest.mark.parametrize("commit", ["../../../victim/home/user", "0" * 39 + "/"])
def test_models_pull_with_a_hostile_commit_header_writes_nothing_outside(box, commit):
    box.hub.commit_override = commit
    rc, out, err, wall = box.run("models", "pull", f"hf://{SMOL_REPO}/{SMOL_FILE}")
    one_line_error(rc, err, "X-Repo-Commit")
