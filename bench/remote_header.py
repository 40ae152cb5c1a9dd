"""Bytes and time for `edgekv predict hf://... --engine` against a local hub on 127.0.0.1.

Starts tests/hubserver.py's stand-in for the Hugging Face hub and its CDN, serving the two real models,
then runs the real command in a fresh process for each: on the local file, then on hf:// with an empty
header cache (cold) and again (warm), and checks that the printed table is identical.  The server
counts every body byte it sends.

    .venv/bin/python bench/remote_header.py [--out bench/remote_header.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from hubserver import FakeHub  # noqa: E402

from edgekv.sources import resolve_model, verified_sha256  # noqa: E402

MODELS = [("smollm2-135m", "edgekv-test/SmolLM2-135M-Instruct-GGUF", "SmolLM2-135M-Instruct.Q4_1.gguf"),
          ("gemma3-270m", "edgekv-test/gemma-3-270m-GGUF", "gemma-3-270m-q4_k_m.gguf")]
ARGS = ["--engine", "-c", "4096,32768", "-ctk", "f16,q8_0,q4_0"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "bench" / "remote_header.json"))
    a = ap.parse_args()
    hub = FakeHub().start()
    rows = []
    try:
        for name, repo, file in MODELS:
            path = Path(resolve_model(name).path)
            hub.add_repo(repo, {file: path}, shas={file: verified_sha256(path)})
            home = tempfile.mkdtemp(prefix="edgekv-bench-")
            env = {**os.environ, "HF_ENDPOINT": hub.endpoint, "EDGEKV_HOME": home,
                   "HF_HOME": os.path.join(home, "hf")}
            spec = f"hf://{repo}/{file}"
            t0 = time.perf_counter()
            local = subprocess.run([sys.executable, "-m", "edgekv.cli", "predict", str(path), *ARGS], env=env,
                                   capture_output=True, text=True)
            rows.append({"model": name, "run": "local file", "file_size": path.stat().st_size, "body_bytes_sent": 0,
                         "requests": [], "command_wall_s": round(time.perf_counter() - t0, 2), "note": "",
                         "command": f"edgekv predict {path} " + " ".join(ARGS)})
            print(json.dumps(rows[-1]))
            for run in ("cold", "warm"):
                hub.reset()
                cmd = [sys.executable, "-m", "edgekv.cli", "predict", spec, *ARGS]
                t0 = time.perf_counter()
                p = subprocess.run(cmd, env=env, capture_output=True, text=True)
                wall = time.perf_counter() - t0
                if p.returncode:
                    raise SystemExit(p.stderr)
                note = next((ln for ln in p.stderr.splitlines() if "header" in ln), "")
                if p.stdout != local.stdout:
                    raise SystemExit(f"{spec}: the output differs from the local file's:\n{p.stdout}\n{local.stdout}")
                rows.append({"model": name, "run": run, "file_size": path.stat().st_size,
                             "body_bytes_sent": hub.bytes_sent("/cdn/"),
                             "requests": [f"{m} {u.split('/')[1]} {r or ''}".strip() for m, u, r in hub.requests()],
                             "command_wall_s": round(wall, 2), "note": note,
                             "command": "HF_ENDPOINT=" + hub.endpoint + " edgekv predict " + " ".join([spec, *ARGS])})
                print(json.dumps(rows[-1]))
    finally:
        hub.stop()
    Path(a.out).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
