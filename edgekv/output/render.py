"""The report's document (:class:`Document`: sections, tables, plots) and its renderers: Markdown, results.csv,
results.json and one self-contained HTML file.  Measures nothing; :mod:`edgekv.output.report` builds the document.

Rendering is deterministic: the same document gives byte-identical Markdown, CSV, JSON and HTML (no rendering
timestamps, fixed float formatting).
"""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import re
from dataclasses import dataclass, field
from typing import Any

from edgekv.output.export import export_columns, export_row, has_speed_prediction
from edgekv.output.inputs import KIND_PREDICT
from edgekv.records import frame as F
from edgekv.records.schema import Record, encode_block

REPORT_FORMAT = 1
DASH = "–"          # a value a record does not hold (never filled in from another source)

# -- the document ---------------------------------------------------------------------------------------

@dataclass
class Table:
    title: str
    intro: str
    headers: list[str]
    rows: list[list[str]]
    align: list[str] = field(default_factory=list)    # "l" or "r" per column


@dataclass
class Section:
    title: str
    paragraphs: list[str] = field(default_factory=list)
    tables: list[Table] = field(default_factory=list)
    images: list[tuple[str, str]] = field(default_factory=list)    # (file name, alt text)
    bullets: list[str] = field(default_factory=list)


@dataclass
class Document:
    title: str
    predicted_only: bool
    sections: list[Section]
    plots: dict[str, bytes]
    note: str | None = None
    rows: list[dict[str, Any]] = field(default_factory=list)      # the frame's rows, report order, as printed
    records: list[Record] = field(default_factory=list)           # the records, report order


def md_safe(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


# -- Markdown -------------------------------------------------------------------------------------------

def md_table(t: Table) -> list[str]:
    out = []
    if t.title:
        out += [f"### {t.title}", ""]
    if t.intro:
        out += [t.intro, ""]
    al = t.align or ["r"] * len(t.headers)
    out.append("| " + " | ".join(md_safe(h) for h in t.headers) + " |")
    out.append("|" + "|".join(":---" if a == "l" else "---:" for a in al) + "|")
    for row in t.rows:
        out.append("| " + " | ".join(row) + " |")
    out.append("")
    return out


def banner(doc: Document) -> str:
    """The first line of a predicted-only report (Markdown): what nothing in it was, and where its figures come from."""
    if not has_speed_prediction(doc.rows):
        return "**Predicted only.** Nothing in this report was measured: the figures are computed from GGUF metadata."
    return ("**Predicted only.** No model in this report was run: the memory figures are computed from GGUF metadata, "
            "the speed figures from it and a short speed calibration of one machine (`edgekv calibrate`: small "
            "synthetic models whose weights are values like a trained model's, run through llama.cpp).")


def render_markdown(doc: Document) -> str:
    out = [f"# {doc.title}", ""]
    if doc.predicted_only:
        out += [f"> {banner(doc)}", ""]
    if doc.note:
        out += [doc.note, ""]
    for sec in doc.sections:
        out += [f"## {sec.title}", ""]
        for p in sec.paragraphs:
            out += [p, ""]
        for t in sec.tables:
            out += md_table(t)
        for fname, alt in sec.images:
            out += [f"![{alt}]({fname})", ""]
        if sec.bullets:
            out += [f"- {b}" for b in sec.bullets] + [""]
    return "\n".join(out).rstrip("\n") + "\n"


# -- CSV / JSON -----------------------------------------------------------------------------------------

def render_csv(doc: Document) -> str:
    """results.csv: the frame's rows through :data:`edgekv.output.export.EXPORT`."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    cols = export_columns(doc.rows)
    w.writerow(cols)
    for x in doc.rows:
        r = export_row(x)
        w.writerow(["" if r.get(c) is None else _csv_value(r[c]) for c in cols])
    return buf.getvalue()


def _csv_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def render_json(doc: Document) -> str:
    """results.json: the environments, and the frame's rows through :data:`edgekv.output.export.EXPORT` (and
    :data:`~edgekv.output.export.EXPORT_LOAD`)."""
    envs: dict[str, dict[str, Any]] = {}
    for r in doc.records:
        if r.kind == KIND_PREDICT:
            continue
        envs.setdefault(F.device_label(r), {k: v for k, v in encode_block(r.environment).items()
                                            if k not in ("argv", "time_utc")})
    obj = {
        "edgekv_report": REPORT_FORMAT, "title": doc.title, "predicted_only": doc.predicted_only,
        "environments": [{"device": k, **v} for k, v in sorted(envs.items())],
        "columns": list(export_columns(doc.rows)),
        "rows": [export_row(x) for x in doc.rows],
    }
    return json.dumps(obj, indent=1, sort_keys=False, ensure_ascii=False, default=str) + "\n"


# -- HTML -----------------------------------------------------------------------------------------------

_CSS = """
body{font:15px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#1b1f24;max-width:1200px;margin:2em auto;
padding:0 1em}
h1{font-size:1.6em;border-bottom:2px solid #d0d7de;padding-bottom:.3em}h2{margin-top:1.8em;border-bottom:1px solid #d0d7de}
h3{margin-top:1.4em}table{border-collapse:collapse;margin:.6em 0 1.2em;font-size:13px}
th,td{border:1px solid #d0d7de;padding:4px 8px;vertical-align:top}th{background:#f3f5f7}
td.r,th.r{text-align:right;font-variant-numeric:tabular-nums}td.l,th.l{text-align:left}tr:nth-child(even) td{background:#fafbfc}
.note{background:#fff8c5;border:1px solid #d4a72c;padding:.6em 1em;border-radius:6px}
img{max-width:100%;border:1px solid #d0d7de;margin:.5em 0}code{background:#f3f5f7;padding:0 .25em;border-radius:3px;
font-size:90%}
""".strip()


def _inline_md(s: str) -> str:
    """The little Markdown the report uses in text (**bold**, *em*, `code`) as HTML."""
    s = html.escape(s.replace("\\|", "|"), quote=False)
    s = re.sub(r"`([^`]+)`", r"<code>\1</code>", s)
    s = re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", s)
    s = re.sub(r"\*([^*]+)\*", r"<em>\1</em>", s)
    return s


def render_html(doc: Document) -> str:
    out = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
           '<meta name="viewport" content="width=device-width, initial-scale=1">',
           f"<title>{html.escape(doc.title)}</title>", f"<style>{_CSS}</style>", "</head>", "<body>",
           f"<h1>{html.escape(doc.title)}</h1>"]
    if doc.predicted_only:
        out.append(f'<p class="note">{_inline_md(banner(doc))}</p>')
    if doc.note:
        out += [f"<p>{_inline_md(p)}</p>" for p in doc.note.split("\n\n")]
    for sec in doc.sections:
        out.append(f"<h2>{html.escape(sec.title)}</h2>")
        for p in sec.paragraphs:
            out.append(f"<p>{_inline_md(p)}</p>")
        for t in sec.tables:
            if t.title:
                out.append(f"<h3>{html.escape(t.title)}</h3>")
            if t.intro:
                out.append(f"<p>{_inline_md(t.intro)}</p>")
            al = t.align or ["r"] * len(t.headers)
            out.append("<table><thead><tr>" + "".join(f'<th class="{a}">{_inline_md(h)}</th>' for h, a in zip(t.headers, al))
                       + "</tr></thead><tbody>")
            for row in t.rows:
                out.append("<tr>" + "".join(f'<td class="{a}">{_inline_md(c)}</td>' for c, a in zip(row, al)) + "</tr>")
            out.append("</tbody></table>")
        for fname, alt in sec.images:
            png = doc.plots.get(fname)
            if png is None:
                continue
            b64 = base64.b64encode(png).decode("ascii")
            out.append(f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{b64}">'
                       f"<figcaption>{html.escape(alt)}</figcaption></figure>")
        if sec.bullets:
            out.append("<ul>" + "".join(f"<li>{_inline_md(b)}</li>" for b in sec.bullets) + "</ul>")
    out += ["</body>", "</html>"]
    return "\n".join(out) + "\n"


__all__ = ["Document", "render_csv", "render_html", "render_json", "render_markdown"]
