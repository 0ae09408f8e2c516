"""HTML pieces of the study report: the page skeleton, CSS, tables, and figure embedding.

One self-contained file: plotly.js is inlined once in <head> (no CDN, opens offline), every figure
is a <div> plus a small script that draws into it. Nothing here reads a store.
"""

from __future__ import annotations

import html
from typing import Any, Iterable

CSS = """
:root { --fg: #1d2433; --muted: #5b6578; --line: #dde2ea; --bg-soft: #f5f7fa;
        --complete: #2b6cb0; --pruned: #dd8a1a; --fail: #c53030; --running: #718096; }
* { box-sizing: border-box; }
body { font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg);
       margin: 0; background: #fff; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 28px 60px; }
h1 { font-size: 26px; margin: 0 0 4px; }
h2 { font-size: 20px; margin: 0 0 4px; }
h3 { font-size: 16px; margin: 16px 0 6px; }
.sub { color: var(--muted); margin: 0 0 16px; }
section { border-top: 1px solid var(--line); padding: 22px 0 10px; }
.caption { color: var(--muted); margin: 0 0 10px; max-width: 900px; }
.note { background: var(--bg-soft); border-left: 4px solid #a0aec0; padding: 10px 14px; margin: 8px 0;
        max-width: 900px; }
.note.warn { border-left-color: var(--pruned); background: #fffaf0; }
.cards { display: flex; flex-wrap: wrap; gap: 12px; margin: 12px 0 8px; }
.card { background: var(--bg-soft); border: 1px solid var(--line); border-radius: 8px; padding: 10px 14px;
        min-width: 150px; }
.card .k { color: var(--muted); font-size: 12px; text-transform: uppercase; letter-spacing: .04em; }
.card .v { font-size: 20px; font-weight: 600; }
.card .v small { font-size: 13px; font-weight: 400; color: var(--muted); }
.state-COMPLETE { color: var(--complete); } .state-PRUNED { color: var(--pruned); }
.state-FAIL { color: var(--fail); } .state-RUNNING, .state-WAITING { color: var(--running); }
table.data { border-collapse: collapse; margin: 8px 0; font-size: 13.5px; }
table.data th, table.data td { border-bottom: 1px solid var(--line); padding: 5px 10px; text-align: left;
                               vertical-align: top; }
table.data th { background: var(--bg-soft); font-weight: 600; }
table.data td.num { text-align: right; font-variant-numeric: tabular-nums; }
table.data td a { white-space: nowrap; }
code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 12.5px; }
nav.toc { margin: 10px 0 0; color: var(--muted); font-size: 14px; }
nav.toc a { color: var(--complete); text-decoration: none; margin-right: 14px; white-space: nowrap; }
.plot { min-height: 120px; }
footer { color: var(--muted); font-size: 12.5px; border-top: 1px solid var(--line); padding-top: 12px;
         margin-top: 24px; }
"""


def esc(v: Any) -> str:
    return html.escape("" if v is None else str(v))


def fmt_num(v: Any, digits: int = 4) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        if v != v:
            return "–"
        return f"{v:.{digits}g}"
    return str(v)


def page(title: str, body: str, plotly_js: str) -> str:
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
        f"<title>{esc(title)}</title>\n<style>{CSS}</style>\n"
        # plotly.js, inlined once for every figure on the page: the file works offline.
        f"<script type=\"text/javascript\">{plotly_js}</script>\n"
        f"</head>\n<body>\n<main>\n{body}\n</main>\n</body>\n</html>\n"
    )


def section(key: str, title: str, caption: str, content: str) -> str:
    return (
        f"<section id=\"{esc(key)}\">\n<h2>{esc(title)}</h2>\n"
        f"<p class=\"caption\">{caption}</p>\n{content}\n</section>\n"
    )


def note(text: str, warn: bool = False) -> str:
    return f"<p class=\"note{' warn' if warn else ''}\">{text}</p>"


def figure(fig, key: str) -> str:
    """A plotly figure as a div + script, without plotly.js (the page head has it once)."""
    import plotly.io as pio

    fig.update_layout(template="plotly_white", margin={"l": 60, "r": 30, "t": 40, "b": 50})
    div = pio.to_html(
        fig,
        full_html=False,
        include_plotlyjs=False,
        div_id=f"plot-{key}",
        default_height=f"{int(fig.layout.height or 440)}px",
        config={"displaylogo": False, "responsive": True},
    )
    return f"<div class=\"plot\" data-plot=\"{esc(key)}\">{div}</div>"


def table(headers: Iterable[str], rows: Iterable[Iterable[Any]], numeric: Iterable[bool] | None = None, raw: bool = False) -> str:
    """A plain HTML table; cells are escaped unless raw (pre-rendered HTML)."""
    headers = list(headers)
    numeric = list(numeric) if numeric is not None else [False] * len(headers)
    out = ["<table class=\"data\">", "<thead><tr>" + "".join(f"<th>{esc(h)}</th>" for h in headers) + "</tr></thead>", "<tbody>"]
    for row in rows:
        cells = []
        for v, is_num in zip(row, numeric):
            text = v if raw and isinstance(v, str) else esc(fmt_num(v) if is_num else v)
            cells.append(f"<td class=\"num\">{text}</td>" if is_num else f"<td>{text}</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    return "\n".join(out)


def cards(items: Iterable[tuple[str, str]]) -> str:
    """Summary tiles: (label, value-html)."""
    return "<div class=\"cards\">" + "".join(
        f"<div class=\"card\"><div class=\"k\">{esc(k)}</div><div class=\"v\">{v}</div></div>" for k, v in items
    ) + "</div>"
