"""predict --device metal --device-memory SIZE: will it fit a Mac with that much memory (edgekv.core.devicemem's
Metal rules: weights wrapped as Metal_Mapped, KV in shared buffers, all within the GPU working set)."""

from __future__ import annotations

import json

import pytest

from edgekv.cli.main import main
from edgekv.core.units import MIB


def run_json(capsys, *argv):
    assert main(list(argv) + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_a_mac_of_each_size(capsys, smollm2_path):
    out = run_json(capsys, "predict", str(smollm2_path), "-c", "32768", "-ctk", "f16,q4_0", "--device", "metal",
                   "--device-memory", "1GiB")
    rows = {r["type_k"]: r for r in out["device_fit"]}
    recs = {r["settings"]["type_k"]: r for r in out["predictions"]}
    f16 = rows["f16"]
    kv = recs["f16"]["prediction"]["formula"]["total_bytes"]
    weights = recs["f16"]["model"]["size_bytes"]
    # the GPU side is exactly the header's weights and the formula's KV; the compute buffer is said, not guessed
    assert f16["device_bytes"] == kv + weights and "not predicted" in f16["compute_buffer"]
    assert f16["working_set_bytes"] == 1024 * MIB * 2 // 3 and "2/3 of RAM" in f16["basis"]
    assert not f16["fits_working_set"] and f16["fits_ram"]                 # 812 MiB > 683 MiB working set
    assert rows["q4_0"]["fits_working_set"]                                # 228 MiB of q4_0 KV fits
    assert main(["predict", str(smollm2_path), "-c", "32768", "-ctk", "f16", "--device", "metal",
                 "--device-memory", "1GiB"]) == 0
    text = capsys.readouterr().out
    assert "on a Mac with 1.0 GiB" in text and "32768 f16: at least" in text and "macOS pages it" in text


@pytest.mark.parametrize("args, words", [
    (["--device", "cuda", "--device-memory", "8GiB"], "--device: cuda is not one"),
    (["--device", "metal"], "needs --device-memory"),
    (["--device", "metal", "--device-memory", "lots"], "--device-memory"),
    (["--device", "metal", "--device-memory", "8GiB", "--kv-only"], "--kv-only"),
])
def test_device_flags_refused_in_one_line(capsys, smollm2_header, args, words):
    assert main(["predict", str(smollm2_header), "-c", "1024", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0], err
