"""Header-only reading over real HTTP (127.0.0.1): hf://, https URLs, split GGUFs, offline, errors.

The server (tools/hubserver.py) serves the models the way the Hugging Face hub and its CDN do; it counts every
body byte it sends, so the tests assert how much of a model crossed the wire.  What reads only the header, or
fails before the weights, is served the header-only stand-ins of the two models (``remote``, fast: the committed
headers with a hole of the weights' size); downloads, engine dry runs, split files and a real header larger than
the first range are served the real models (``real_remote``, slow).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict

import pytest
from conftest import GEMMA_FILE, GEMMA_REPO, SMOL_FILE, SMOL_REPO, SPLIT_REPO, TINY_FILE, TINY_REPO

from edgekv.cli.main import main
from edgekv.core.predict import ContextParams, predict
from edgekv.errors import SourceError, UsageError
from edgekv.prediction.api import load_model
from edgekv.prediction.crosscheck import compare, engine_lines
from edgekv.runtime.engine import EngineSession
from edgekv.sources.remote import FIRST_RANGE_BYTES

MODELS = {
    "smollm2": (SMOL_REPO, SMOL_FILE, "smollm2_path"),
    "gemma3": (GEMMA_REPO, GEMMA_FILE, "gemma3_path"),
}
CONFIGS = [ContextParams(n_ctx=4096), ContextParams(n_ctx=8192, type_k="q8_0", type_v="q8_0", flash_attn="on"),
           ContextParams(n_ctx=1000, type_k="q4_0", type_v="f16", swa_full=True, n_seq_max=2)]


def _same_header(a, b) -> None:
    assert a.metadata.keys() == b.metadata.keys()
    assert [(k, repr(v)) for k, v in a.metadata.items()] == [(k, repr(v)) for k, v in b.metadata.items()]
    assert a.tensors == b.tensors
    assert (a.file_size, a.data_offset, a.weights_bytes) == (b.file_size, b.data_offset, b.weights_bytes)


@pytest.mark.parametrize("which", [*MODELS, pytest.param("gemma3-real", marks=pytest.mark.slow)])
def test_hf_reads_only_the_header(which, request):
    """From the header-only stand-ins; and from Gemma 3's real file, whose header (its 262K-token vocabulary) is
    longer than the first range (slow: the real models)."""
    if which == "gemma3-real":
        remote, local = request.getfixturevalue("real_remote"), request.getfixturevalue("gemma3_path")
        which = "gemma3"
    else:
        remote, local = request.getfixturevalue("remote"), request.getfixturevalue("sparse_models")[which]
    repo, file, _ = MODELS[which]
    _reads_only_the_header(remote, repo, file, local)


def _reads_only_the_header(remote, repo, file, path) -> None:
    local = load_model(str(path))
    m = load_model(f"hf://{repo}/{file}")
    assert m.ref.source == "hf" and not m.ref.complete
    _same_header(m.header, local.header)
    assert m.shape == local.shape
    sent = remote.bytes_sent("/cdn/")
    assert sent == m.ref.fetch["bytes_received"]
    # about the header: the first 2 MiB range, or less than twice the header, never the weights
    assert local.header.data_offset <= sent <= max(FIRST_RANGE_BYTES, 2 * local.header.data_offset)
    assert sent < local.header.file_size / 10
    assert all(r[2] and r[2].startswith("bytes=") for r in remote.requests("/cdn/"))
    assert os.path.getsize(m.ref.path) == local.header.data_offset   # the cached header-only file

    # again: the cached header; only the HEAD that resolves 'main' to a commit goes out
    remote.reset()
    again = load_model(f"hf://{repo}/{file}")
    assert again.ref.fetch is None and remote.bytes_sent() == 0
    assert [r[0] for r in remote.requests()] == ["HEAD"]
    # pinned to the commit: no request at all
    commit = m.ref.origin.rsplit("@", 1)[1]
    remote.reset()
    load_model(f"hf://{repo}/{file}@{commit}")
    assert remote.requests() == []


@pytest.mark.parametrize("which", MODELS)
def test_engine_dry_run_from_the_remote_header_equals_the_full_file(which, real_remote, request):
    remote = real_remote
    repo, file, fixture = MODELS[which]
    local = load_model(str(request.getfixturevalue(fixture)))
    m = load_model(f"hf://{repo}/{file}")
    with EngineSession(m.ref.path, header=m.header) as eng:
        assert eng.sparse                           # llama.cpp got a sparse stand-in of the full size
        got = eng.run(CONFIGS)
        remote_size = eng.model_size_bytes
    with EngineSession(local.ref.path, header=local.header) as eng:
        assert not eng.sparse
        want = eng.run(CONFIGS)
        assert remote_size == eng.model_size_bytes == local.header.weights_bytes
    for c, g, w in zip(CONFIGS, got, want):
        assert g.ok and w.ok, c
        assert engine_lines(g) == engine_lines(w), c
        assert (g.n_ctx, g.n_ctx_seq, g.n_ubatch, g.compute_mib, g.output_mib) == \
               (w.n_ctx, w.n_ctx_seq, w.n_ubatch, w.compute_mib, w.output_mib), c
        assert compare(predict(m.shape, c), g) == [], c
    assert remote.bytes_sent("/cdn/") < local.header.file_size / 10


PREDICT_ARGS = ["--engine", "--json", "-c", "4096,16384", "-ctk", "f16,q4_0", "-fa", "on"]


def _rows(out: str) -> list[dict]:
    """predict --json records without what names the file or the moment (the model block and the llama.cpp
    arguments name its path; the memory available is read at each call); the bytes must not differ."""
    rows = json.loads(out)
    for r in rows:
        r.pop("model")
        assert r.pop("llama_cpp_args")[:1] == ["-m"]
        proc = r["prediction"].get("process") or {}
        assert proc.pop("available_bytes", 0) > 0 or "fits" not in proc
    return rows


def test_cli_predict_hf_equals_the_local_file(real_remote, smollm2_path, tmp_path):
    remote = real_remote
    """`edgekv predict hf://...` as a real command against the local hub: same rows as the local file."""
    env = {**os.environ, "EDGEKV_HOME": str(tmp_path / "edgekv-home"), "HF_ENDPOINT": remote.endpoint}
    cmd = [sys.executable, "-m", "edgekv.cli", "predict"]
    hf = subprocess.run(cmd + [f"hf://{SMOL_REPO}/{SMOL_FILE}"] + PREDICT_ARGS, env=env, capture_output=True,
                        text=True, timeout=300)
    assert hf.returncode == 0, hf.stderr
    assert "read the header over HTTP: 2,097,152 bytes in 1 request(s)" in hf.stderr
    loc = subprocess.run(cmd + [str(smollm2_path)] + PREDICT_ARGS, env=env, capture_output=True, text=True, timeout=300)
    assert loc.returncode == 0, loc.stderr
    assert _rows(hf.stdout) == _rows(loc.stdout)
    assert all(r["prediction"]["engine"]["match"] for r in _rows(hf.stdout))
    assert remote.bytes_sent("/cdn/") == 2 * 1024 * 1024


def test_cli_predict_and_inspect_hf_gemma_in_process(real_remote, gemma3_path, capsys):
    assert main(["predict", f"hf://{GEMMA_REPO}/{GEMMA_FILE}"] + PREDICT_ARGS) == 0
    hf = capsys.readouterr()
    assert "read the header over HTTP" in hf.err
    assert main(["predict", str(gemma3_path)] + PREDICT_ARGS) == 0
    assert _rows(hf.out) == _rows(capsys.readouterr().out)
    assert main(["inspect", f"hf://{GEMMA_REPO}/{GEMMA_FILE}", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["source"] == "hf" and d["gguf"]["file_size"] == gemma3_path.stat().st_size


def test_plain_url_reads_only_the_header(remote, sparse_models):
    url = f"{remote.endpoint}/files/{SMOL_FILE}"
    local = load_model(str(sparse_models["smollm2"]))
    m = load_model(url)
    assert m.ref.source == "url" and not m.ref.complete
    _same_header(m.header, local.header)
    assert remote.bytes_sent() == FIRST_RANGE_BYTES
    remote.reset()
    again = load_model(url)      # revalidated with one HEAD (same ETag and size): no body bytes
    assert again.ref.fetch is None and remote.bytes_sent() == 0
    assert [r[0] for r in remote.requests()] == ["HEAD"]


def _one_line_error(capsys, argv: list[str], code: int = 1) -> str:
    assert main(argv) == code
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("edgekv: error: ") and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("target, message", [
    ("/norange/" + SMOL_FILE, "ignored the HTTP range request"),
    ("/files/missing.gguf", "not found (HTTP 404)"),
    ("/page.html", "not a GGUF file (starts with b'<!DO'"),
    ("/files/readme.txt", "not a GGUF file"),
    ("hf://edgekv-test/nope/x.gguf", "repository edgekv-test/nope not found"),
    (f"hf://{SMOL_REPO}/missing.gguf", f"missing.gguf not found in {SMOL_REPO}"),
    (f"hf://{SMOL_REPO}/{SMOL_FILE}@v9", "revision 'v9' not found"),
])
def test_remote_errors_are_one_clear_line(target, message, remote, capsys):
    spec = target if target.startswith("hf://") else remote.endpoint + target
    err = _one_line_error(capsys, ["inspect", spec])
    assert message in err, err
    if "norange" in target:
        # the client gave up at the first response instead of reading the model
        assert remote.requests("/norange/") == [("HEAD", "/norange/" + SMOL_FILE, None),
                                                ("GET", "/norange/" + SMOL_FILE, f"bytes=0-{FIRST_RANGE_BYTES - 1}")]


def test_usage_errors(remote, capsys):
    err = _one_line_error(capsys, ["inspect", "hf://only-a-repo"], code=2)
    assert "hf://OWNER/REPO/FILE.gguf" in err


# -- split GGUFs ----------------------------------------------------------------------------------------

def test_split_gguf_reads_as_one_model(smollm2_split, smollm2_path, capsys):
    whole = load_model(str(smollm2_path))
    split = load_model(str(smollm2_split[0]))
    assert len(split.header.shards) == 3
    assert sorted(t.name for t in split.header.tensors) == sorted(t.name for t in whole.header.tensors)
    assert split.header.weights_bytes == whole.header.weights_bytes
    assert split.header.file_size == sum(p.stat().st_size for p in smollm2_split)
    assert split.shape == whole.shape
    with EngineSession(str(smollm2_split[0]), header=split.header) as eng:
        assert not eng.sparse
        got = eng.run(CONFIGS[:2])
        assert eng.model_size_bytes == whole.header.weights_bytes
    for c, g in zip(CONFIGS, got):
        assert compare(predict(split.shape, c), g) == [], c
    # the second file alone is refused with the way out
    with pytest.raises(UsageError, match="pass the first file"):
        load_model(str(smollm2_split[1]))


def test_remote_split_gguf_header_only_and_engine(real_remote, smollm2_split, smollm2_path):
    remote = real_remote
    first = smollm2_split[0].name
    m = load_model(f"hf://{SPLIT_REPO}/Q4_1/{first}")
    assert not m.ref.complete and len(m.ref.shards) == 3 and m.ref.fetch["files"] == 3
    assert [os.path.basename(p) for p in m.ref.shards] == [p.name for p in smollm2_split]
    whole = load_model(str(smollm2_path))
    assert m.header.weights_bytes == whole.header.weights_bytes
    total = sum(p.stat().st_size for p in smollm2_split)
    assert remote.bytes_sent("/cdn/") == m.ref.fetch["bytes_received"] < total / 10
    with EngineSession(m.ref.path, header=m.header) as eng:     # llama.cpp opens all three sparse files
        assert eng.sparse
        res = eng.run([CONFIGS[0]])[0]
        assert eng.model_size_bytes == whole.header.weights_bytes
    assert compare(predict(m.shape, CONFIGS[0]), res) == []


# -- offline ---------------------------------------------------------------------------------------------

def test_offline_uses_cached_headers_and_says_what_is_missing(remote, monkeypatch, capsys):
    spec = f"hf://{SMOL_REPO}/{SMOL_FILE}"          # a branch: resolving it needs the hub, or a cached ref
    online = load_model(spec)
    remote.reset()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    m = load_model(spec)
    assert remote.requests() == [] and m.ref.path == online.ref.path and m.ref.origin == online.ref.origin
    err = _one_line_error(capsys, ["inspect", f"hf://{GEMMA_REPO}/{GEMMA_FILE}"])
    assert "HF_HUB_OFFLINE is set" in err and "not cached" in err and "unset HF_HUB_OFFLINE" in err
    err = _one_line_error(capsys, ["predict", f"{remote.endpoint}/files/{SMOL_FILE}"])
    assert "HF_HUB_OFFLINE is set" in err
    assert remote.requests() == []
    # a models.toml name with no PyPI package: the message names the entry
    err = _one_line_error(capsys, ["inspect", "qwen3-8b"])
    assert err.startswith("edgekv: error: qwen3-8b (hf://Qwen/Qwen3-8B-GGUF/Qwen3-8B-Q4_K_M.gguf@7c41481f")


def test_unreachable_network_falls_back_to_the_cache(remote, monkeypatch, capsys):
    spec = f"hf://{SMOL_REPO}/{SMOL_FILE}"
    online = load_model(spec)
    url = f"{remote.endpoint}/files/{SMOL_FILE}"
    load_model(url)
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")      # nothing listens there
    m = load_model(spec)
    assert m.ref.path == online.ref.path
    err = _one_line_error(capsys, ["inspect", f"hf://{GEMMA_REPO}/{GEMMA_FILE}"])
    assert "127.0.0.1:9 cannot be reached" in err and "not cached" in err
    # a hub that answers 503 is treated the same way
    monkeypatch.setenv("HF_ENDPOINT", remote.endpoint)
    remote.fail_with = 503
    assert load_model(spec).ref.path == online.ref.path
    err = _one_line_error(capsys, ["inspect", f"hf://{GEMMA_REPO}/{GEMMA_FILE}"])
    assert "answered HTTP 503" in err and "not cached" in err


# -- models pull -----------------------------------------------------------------------------------------

def _registry(tmp_path, monkeypatch, sha: str, revision: str, repo: str = SMOL_REPO, file: str = SMOL_FILE) -> None:
    p = tmp_path / "models.toml"
    p.write_text(f"""schema_version = 1
[models.smol]
hf_repo = "{repo}"
file = "{file}"
revision = "{revision}"
sha256 = "{sha}"
description = "SmolLM2 from the local hub"
license = "apache-2.0"
""")
    monkeypatch.setenv("EDGEKV_MODELS", str(p))


def test_pull_downloads_verifies_and_resumes(real_remote, smollm2_path, tmp_path, monkeypatch, capsys):
    remote = real_remote
    from edgekv.sources.home import verified_sha256
    from edgekv.sources.registry import load_registry
    from edgekv.sources.resolve import resolve_model

    sha = verified_sha256(smollm2_path)
    _registry(tmp_path, monkeypatch, sha, remote.smol_commit)
    size = smollm2_path.stat().st_size
    # the connection drops after 40 MB: huggingface-hub resumes from there with a Range request
    remote.cut_after[sha] = 40_000_000
    assert main(["models", "pull", "smol", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["source"] == "downloaded" and r["verified"] and r["sha256"] == sha and r["size_bytes"] == size
    first, resumed = [x[2] for x in remote.requests("/cdn/", "GET")]
    start = int(resumed.removeprefix("bytes=").removesuffix("-"))     # what it had written (whole chunks)
    assert first is None and 0 < start <= 40_000_000
    assert remote.bytes_sent("/cdn/") == 40_000_000 + (size - start)
    # now the name resolves to the complete file in the Hugging Face cache, with no request
    remote.reset()
    ref = resolve_model("smol")
    assert ref.source == "hf-cache" and ref.complete and verified_sha256(ref.path) == sha
    assert remote.requests() == []
    assert main(["models", "pull", "smol", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["source"] == "hf-cache"
    assert load_registry().get("smol").pinned


def test_pull_refuses_a_wrong_or_unknown_sha256(remote, tmp_path, monkeypatch, capsys):
    """On a whole tiny model: the download is the point, not its size."""
    tiny = {"repo": TINY_REPO, "file": TINY_FILE}
    _registry(tmp_path, monkeypatch, "0" * 64, "unknown", **tiny)
    err = _one_line_error(capsys, ["models", "pull", "smol"])
    assert f"is not models.toml's {'0' * 64} for 'smol'" in err
    _registry(tmp_path, monkeypatch, "unknown", "unknown", **tiny)
    err = _one_line_error(capsys, ["models", "pull", "smol"])
    assert 'sha256 = "unknown"' in err and "--allow-unverified" in err
    assert main(["models", "pull", "smol", "--allow-unverified", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["source"] in ("downloaded", "hf-cache") and r["verified"]      # checked against the hub's LFS sha256
    assert any("not in models.toml" in n for n in r["notes"]) and any("not pinned" in n for n in r["notes"])


def test_pull_offline_says_what_is_missing(remote, tmp_path, monkeypatch, capsys):
    _registry(tmp_path, monkeypatch, "1" * 64, remote.smol_commit)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    err = _one_line_error(capsys, ["models", "pull", "smol"])
    assert "HF_HUB_OFFLINE is set" in err and "not in the Hugging Face cache" in err
    assert remote.requests() == []


def test_registry_name_reads_the_header_when_weights_are_not_local(remote, sparse_models, tmp_path, monkeypatch):
    from edgekv.sources.home import verified_sha256

    _registry(tmp_path, monkeypatch, verified_sha256(sparse_models["smollm2"]), remote.smol_commit)
    m = load_model("smol")
    assert m.ref.source == "hf" and not m.ref.complete and m.ref.name == "smol"
    assert remote.bytes_sent("/cdn/") == FIRST_RANGE_BYTES
    # a pinned sha256 the hub does not serve is caught from the HEAD alone (X-Linked-Etag)
    _registry(tmp_path, monkeypatch, "2" * 64, remote.smol_commit)
    monkeypatch.setenv("EDGEKV_HOME", str(tmp_path / "other-home"))
    with pytest.raises(SourceError, match="the hub serves a different file"):
        load_model("smol")


def test_modelref_is_plain_data(remote):
    m = load_model(f"hf://{SMOL_REPO}/{SMOL_FILE}")
    d = asdict(m.ref)
    assert d["origin"].startswith(f"hf://{SMOL_REPO}/{SMOL_FILE}@") and d["fetch"]["requests"] == 1


def test_hub_resolve_urls_are_read_as_hf(remote, capsys):
    """A Hugging Face /resolve/ URL gets the hub's treatment (commit, LFS sha256), not a plain URL's."""
    url = f"{remote.endpoint}/{SMOL_REPO}/resolve/main/{SMOL_FILE}"
    m = load_model(url)
    assert m.ref.source == "hf" and m.ref.origin == f"hf://{SMOL_REPO}/{SMOL_FILE}@{remote.smol_commit}"
    assert main(["inspect", url, "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["origin"] == m.ref.origin and d["complete"] is False and d["files"] == [m.ref.path]
