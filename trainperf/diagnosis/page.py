"""What trainperf's HTML pages share beyond the charts: the findings table (one renderer for the run, trace and
run-with-traces reports)."""

from __future__ import annotations

import html


def findings_html(result: dict, empty: str) -> str:
    """The findings of a diagnosis as a table (severity, id, evidence, likely cause, what to try, the gain's upper
    bound), or the paragraph ``empty`` when no rule fired."""
    if not result["findings"]:
        return f"<p>{html.escape(empty)}</p>"
    e = html.escape
    rows = "".join(f"<tr class='{e(f['severity'])}'><td>{e(f['severity'])}</td><td><code>{e(f['id'])}</code></td>"
                   f"<td>{e(f['evidence'])}</td><td>{e(f['cause'])}</td><td>{e(f['fix'])}</td>"
                   f"<td>{e((f.get('gain') or {}).get('text') or '-')}</td></tr>" for f in result["findings"])
    return ("<table><tr><th>severity</th><th>id</th><th>evidence</th><th>likely cause</th><th>what to try</th>"
            f"<th>gain (upper bound)</th></tr>{rows}</table>")


__all__ = ["findings_html"]
