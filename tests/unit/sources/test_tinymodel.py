"""The speed calibration's models hold values like a trained model's (edgekv.sources.tinymodel.fill_values): block
scales spread over two octaves, random quants, log-normal norm gains, weights centred and of the RMS the hidden
size asks for (weight_rms); and llama.cpp computes finite logits on them for every weight type the calibration
writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from edgekv.sources.tinymodel import NORM_GAIN_SIGMA, SCALE_SPREAD_OCTAVES, _scale_fields, weight_rms, write_llama

SHAPE = {"n_embd": 256, "n_ff": 512, "n_layer": 2, "n_head": 4, "n_head_kv": 2}
TYPES = ("Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS", "F16", "BF16")


def _matrices(path):
    return [t for t in GGUFReader(path).tensors if t.name.endswith("_q.weight") or t.name.endswith("down.weight")
            or t.name == "output.weight"]


@pytest.mark.parametrize("mat_type", TYPES)
def test_values_like_a_trained_model_s(tmp_path, mat_type):
    p = tmp_path / "m.gguf"
    write_llama(p, **SHAPE, mat_type=mat_type, values=True)
    mats = _matrices(p)
    assert len(mats) == 5
    for t in mats:
        raw = np.asarray(t.data).view(np.uint8).reshape(-1)
        w = dequantize(raw, t.tensor_type).reshape(-1).astype(np.float64)
        assert np.isfinite(w).all() and np.count_nonzero(w) > 0.8 * w.size, t.name
        # every type at one size, centred (a trained model's tensors average about 0; Q4_0's quants -8..7 leave
        # -0.1 x the RMS): the attention's scores, and so its cost per cell, do not depend on the weight type or
        # the hidden size (tinymodel's comment)
        rms = float(np.sqrt(np.mean(w ** 2)))
        assert abs(rms / weight_rms(SHAPE["n_embd"]) - 1) < 0.1 and abs(w.mean()) < 0.15 * rms, (t.name, rms, w.mean())
        fields, _ = _scale_fields(t.tensor_type.name, len(raw) // (w.size // _block(t.tensor_type)))
        blocks = raw.reshape(-1, len(raw) // (w.size // _block(t.tensor_type)))
        for off in fields:
            d = np.abs(blocks[:, off:off + 2].copy().view(np.float16).reshape(-1).astype(np.float64))
            lg = np.log2(d)
            # the block scales spread evenly over two octaves (a trained model's tensors: a log2 std of 0.26-1.12
            # in SmolLM2 and Gemma 3 270M)
            assert lg.max() - lg.min() <= 2 * SCALE_SPREAD_OCTAVES + 0.02
            assert 0.45 < lg.std() < 0.7 and len(np.unique(d)) > 200
    norms = [t for t in GGUFReader(p).tensors if "norm" in t.name]
    g = np.concatenate([np.asarray(t.data, dtype=np.float64).reshape(-1) for t in norms])
    assert (g > 0).all() and abs(np.log(g).std() - NORM_GAIN_SIGMA) < 0.1


def _block(qt) -> int:
    from gguf import GGML_QUANT_SIZES

    return GGML_QUANT_SIZES[qt][0]


def test_without_values_the_model_is_a_hole_of_zeros(tmp_path):
    p = tmp_path / "z.gguf"
    size = write_llama(p, **SHAPE, mat_type="Q4_1")
    assert p.stat().st_size == size and p.stat().st_blocks * 512 < size / 4     # sparse: the data was never written
    for t in _matrices(p):
        assert not np.asarray(t.data).any()
    v = tmp_path / "v.gguf"
    assert write_llama(v, **SHAPE, mat_type="Q4_1", values=True) == size
    assert v.stat().st_blocks * 512 >= size                                      # every byte written


@pytest.mark.slow
@pytest.mark.parametrize("mat_type", ("Q4_1", "Q8_0", "Q4_K", "Q6_K", "IQ4_NL"))
def test_llama_cpp_computes_finite_logits_on_the_values(tmp_path, mat_type):
    """A real run: llama.cpp loads the model (repacked or not, as the preflight says) and every logit of a few
    decoded tokens is finite, and they differ (the values flow through every layer)."""
    import llama_cpp

    from tests.llamaparams import preflight_model_params

    p = tmp_path / "m.gguf"
    write_llama(p, **SHAPE, mat_type=mat_type, values=True)
    with preflight_model_params():
        llm = llama_cpp.Llama(model_path=str(p), n_ctx=64, n_batch=64, n_threads=2, logits_all=True, verbose=False)
    try:
        llm.eval([1, 7, 42, 200])
        logits = np.array(llm.scores[:4], dtype=np.float64)
    finally:
        llm.close()
    assert np.isfinite(logits).all()
    assert logits.std() > 0 and not np.allclose(logits[0], logits[3])


def test_mxfp4_blocks_get_a_sane_e8m0_exponent(tmp_path):
    """MXFP4 has no fp16 scale: its one-byte e8m0 exponent is set (three neighbouring powers of two, shifted as a
    whole toward weight_rms: within a factor sqrt(2) of it), the rest random."""
    p = tmp_path / "m.gguf"
    write_llama(p, **SHAPE, mat_type="MXFP4", values=True)
    for t in _matrices(p):
        assert t.tensor_type == GGMLQuantizationType.MXFP4
        blocks = np.asarray(t.data).view(np.uint8).reshape(-1, 17)
        e = np.unique(blocks[:, 0]).astype(int)
        assert len(e) == 3 and e.max() - e.min() == 2 and 100 < e.min() < 140
        w = dequantize(blocks.reshape(-1), t.tensor_type)
        assert np.isfinite(w).all() and np.count_nonzero(w) > 0.8 * w.size
        assert 0.7 < np.sqrt(np.mean(w.astype(np.float64) ** 2)) / weight_rms(SHAPE["n_embd"]) < 1.42


# -- a calibration plan's models: written as a probe loads them, cut to their headers, deleted at the end ---------


@pytest.mark.slow
def test_a_plan_model_is_written_as_it_is_loaded_then_cut_to_its_header(tmp_path, monkeypatch):
    """plan_model names a file and writes nothing; plan_model_file writes the whole model (llama.cpp loads it and
    decodes), then cuts it to its header (the tensor table the solve reads back); a second use writes it whole
    again; drop_plan_models deletes it."""
    import llama_cpp

    from edgekv.sources.gguf_header import read_header_file
    from edgekv.sources.tinymodel import drop_plan_models, plan_model, plan_model_file
    from tests.llamaparams import preflight_model_params

    monkeypatch.setenv("EDGEKV_HOME", str(tmp_path))
    m = plan_model("wn_q8_0", **SHAPE, mat_type="Q8_0")
    p = Path(m["model_path"])
    assert p.parent == tmp_path / "calibration" / "speed" / "scratch" and not p.exists()
    for _ in range(2):
        with plan_model_file(m) as path:
            h = read_header_file(path)
            assert Path(path).stat().st_size == h.file_size > h.data_offset
            with preflight_model_params():
                llm = llama_cpp.Llama(model_path=path, n_ctx=64, n_batch=64, n_threads=2, logits_all=True,
                                      verbose=False)
            try:
                llm.eval([1, 7, 42])
                assert np.isfinite(np.array(llm.scores[:3])).all()
            finally:
                llm.close()
        assert p.stat().st_size == h.data_offset        # cut: its header alone
        assert [t.name for t in read_header_file(p).tensors] == [t.name for t in h.tensors]
    drop_plan_models([m])
    assert not p.exists()


def test_a_plan_model_path_is_the_one_its_name_and_shape_give(tmp_path, monkeypatch):
    """A plan entry never chooses where a model is written: a path other than its name, shape and owner's is
    refused before anything is written, and drop_plan_models deletes nothing outside the scratch folder."""
    from edgekv.sources.tinymodel import drop_plan_models, plan_model, plan_model_file

    monkeypatch.setenv("EDGEKV_HOME", str(tmp_path))
    elsewhere = tmp_path / "mine.gguf"
    elsewhere.write_bytes(b"x")
    m = {**plan_model("wn_q8_0", **SHAPE, mat_type="Q8_0"), "model_path": str(elsewhere)}
    with pytest.raises(ValueError, match="is not where"), plan_model_file(m):
        pass
    drop_plan_models([m])
    assert elsewhere.read_bytes() == b"x"
    bad = plan_model("wn_q8_0", **SHAPE, mat_type="Q8_0")
    bad["write"]["name"] = "../x"
    with pytest.raises(ValueError, match="bad calibration model name"), plan_model_file(bad):
        pass


def test_the_sweep_deletes_models_of_dead_calibrations_and_stale_kept_ones(tmp_path, monkeypatch):
    """sweep_speed_models: a scratch model of a process that no longer runs and a kept model untouched for STALE_S
    go; this process's scratch models and a kept model used lately stay."""
    import os
    import subprocess
    import sys
    import time

    from edgekv.sources.tinymodel import STALE_S, speed_model_file, sweep_speed_models

    monkeypatch.setenv("EDGEKV_HOME", str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    pid = int(dead.stdout)
    files = {k: speed_model_file("wn_q8_0", owner, **SHAPE) for k, owner in (("dead", pid), ("mine", os.getpid()))}
    files["old"] = speed_model_file("w_q8_0", **SHAPE)
    files["new"] = speed_model_file("w_q4_1", **SHAPE)
    for p in files.values():
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"GGUF")
    t = time.time() - STALE_S - 60
    os.utime(files["old"], (t, t))
    gone = sweep_speed_models()
    assert sorted(gone) == sorted([files["dead"], files["old"]])
    assert {k for k, p in files.items() if p.exists()} == {"mine", "new"}


def test_a_full_disk_is_one_line_naming_the_folder_and_the_size(tmp_path, monkeypatch):
    """The disk filling while a model is written: an OSError whose one line names the speed folder, the model and
    its size, and what to do; no partial file is left."""
    import errno

    from edgekv.sources import tinymodel as T

    monkeypatch.setenv("EDGEKV_HOME", str(tmp_path))
    real = T.fill_values

    def full(f, offset, nbytes, *a, **kw):
        if offset > 1 << 20:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(f, offset, nbytes, *a, **kw)

    monkeypatch.setattr(T, "fill_values", full)
    m = T.plan_model("ws_q8_0", **{**SHAPE, "n_layer": 24}, mat_type="Q8_0")
    with pytest.raises(OSError) as e, T.plan_model_file(m):
        pass
    msg = e.value.strerror
    assert e.value.errno == errno.ENOSPC and "\n" not in msg
    assert str(tmp_path / "calibration" / "speed") in msg and "ws_q8_0 (" in msg and " MiB)" in msg
    assert "EDGEKV_HOME" in msg
    assert list((tmp_path / "calibration" / "speed").rglob("*")) == [tmp_path / "calibration" / "speed" / "scratch"]


FULL_DISK_CHILD = """
import os, sys
os.environ["EDGEKV_HOME"] = sys.argv[1]
from edgekv.sources.tinymodel import plan_model, plan_model_file
m = plan_model("ws_q8_0", n_embd=256, n_ff=512, n_layer=24, n_head=4, n_head_kv=2, mat_type="Q8_0")
try:
    with plan_model_file(m):
        print("WROTE")
except OSError as e:
    print(e.errno, e.strerror)
    print(sorted(str(p) for p in __import__("pathlib").Path(sys.argv[1]).rglob("*") if p.is_file()))
"""


def test_a_real_full_disk_is_one_line_and_leaves_no_partial_model(tmp_path):
    """A real full disk: a 1 MiB tmpfs mounted in a mount namespace of its own (unshare -m; the mount goes with the
    process) as EDGEKV_HOME, and a model of several MiB written there: ENOSPC, the one line, no file left."""
    import errno

    from tests.smalldisk import run_on_small_disk

    home = tmp_path / "small"
    r = run_on_small_disk(home, "1m", FULL_DISK_CHILD, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"{errno.ENOSPC} no space left on the disk of {home}/calibration/speed to write the "
                               "speed calibration's model ws_q8_0 ("), r.stdout
    assert lines[0].endswith("or set EDGEKV_HOME to a folder on a disk with room") and len(lines) == 2
    assert lines[1] == "[]"         # no partial model (the atomic write's temporary file removed)
