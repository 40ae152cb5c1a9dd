"""Bytes and time for `edgekv predict hf://... --engine` against a local hub on 127.0.0.1.

Starts tools/hubserver.py's stand-in for the Hugging Face hub and its CDN, serving the two real models,
then runs the real command in a fresh process for each: on the local file, then on hf:// with an empty
header cache (cold) and again (warm), and checks that the printed table is identical.  The server
counts every body byte it sends.

    python -m tools.remote_header [--out tools/results/remote_header.json] [--readme FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from edgekv.sources.home import verified_sha256
from edgekv.sources.resolve import resolve_model
from tools.hubserver import FakeHub
from tools.llama_tools import write_section

ROOT = Path(__file__).resolve().parents[1]

MODELS = [("smollm2-135m", "edgekv-test/SmolLM2-135M-Instruct-GGUF", "SmolLM2-135M-Instruct.Q4_1.gguf"),
          ("gemma3-270m", "edgekv-test/gemma-3-270m-GGUF", "gemma-3-270m-q4_k_m.gguf")]
ARGS = ["--engine", "-c", "4096,32768", "-ctk", "f16,q8_0,q4_0"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "tools" / "results" / "remote_header.json"))
    ap.add_argument("--readme", help="write the Markdown table into this file (between remote markers)")
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
                         "command": f"edgekv predict {name} " + " ".join(ARGS)})
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
                fetch = re.search(r", ([\d.]+) s, of a", note)
                rows.append({"model": name, "run": run, "file_size": path.stat().st_size,
                             "body_bytes_sent": hub.bytes_sent("/cdn/"),
                             "header_fetch_s": float(fetch.group(1)) if fetch else None,
                             "requests": [f"{m} {u.split('/')[1]} {r or ''}".strip() for m, u, r in hub.requests()],
                             "command_wall_s": round(wall, 2), "note": note,
                             "command": "HF_ENDPOINT=" + hub.endpoint + " edgekv predict " + " ".join([spec, *ARGS])})
                print(json.dumps(rows[-1]))
    finally:
        hub.stop()
    Path(a.out).write_text(json.dumps(rows, indent=1) + "\n")
    if a.readme:
        write_section(Path(a.readme), BEGIN, END, markdown(rows))


BEGIN, END = "<!-- remote:begin -->", "<!-- remote:end -->"
LABELS = {"smollm2-135m": "SmolLM2-135M Q4_1", "gemma3-270m": "Gemma 3 270M Q4_K_M"}


def markdown(rows: list[dict]) -> str:
    lines = [
        BEGIN,
        "## Remote header: `edgekv predict hf://…` without downloading weights",
        "",
        "Written by `tools/remote_header.py` (edit by rerunning it). It serves the two real models from",
        "`tools/hubserver.py` (a stand-in for the Hugging Face hub and its CDN on 127.0.0.1, counting every body byte",
        f"it sends) and runs `edgekv predict hf://… {' '.join(ARGS)}` in a fresh process: on the local file, then",
        "cold (empty header cache) and warm. The printed tables are identical in all three runs. Machine: "
        f"{platform.machine()}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}.",
        "",
        "| model | file size | cold: bytes read | requests | header fetch | cold command | warm: bytes read | warm command "
        "| local file |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in dict.fromkeys(r["model"] for r in rows):
        by_run = {r["run"]: r for r in rows if r["model"] == name}
        local, cold, warm = by_run["local file"], by_run["cold"], by_run["warm"]
        gets = sum(q.startswith("GET") for q in cold["requests"])
        heads = sum(q.startswith("HEAD") for q in cold["requests"])
        warm_req = "HEAD only" if all(q.startswith("HEAD") for q in warm["requests"]) else ", ".join(warm["requests"])
        lines.append(f"| {LABELS.get(name, name)} | {cold['file_size']:,} B | {cold['body_bytes_sent']:,} B "
                     f"({100 * cold['body_bytes_sent'] / cold['file_size']:.1f} %) | {heads} HEAD + {gets} range GET"
                     f"{'s' if gets != 1 else ''} | {cold['header_fetch_s']:.2f} s | {cold['command_wall_s']:.2f} s | "
                     f"{warm['body_bytes_sent']:,} B ({warm_req}) | {warm['command_wall_s']:.2f} s | "
                     f"{local['command_wall_s']:.2f} s |")
    lines += [
        "",
        "The command time is dominated by `--engine` (a llama.cpp dry run in a child process); the header fetch",
        "itself is the \"header fetch\" column. Gemma's header is larger (its 262,144-token vocabulary), so the",
        "reader asks for more ranges, doubling each time. Figures in `remote_header.json`.",
        END,
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
