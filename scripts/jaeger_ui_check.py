"""Open a faultlab Jaeger export in the real Jaeger UI and check what a person sees there.

Data flow (one run, nothing leaves the machine):

    EXPORT.json ──► pick the trace (--trace ID, else the earliest trace with an error span;
        │            --failed: each such trace, one browser page each) and the export's
        │            facts: each span's process role/rank/pid and times, the pids a chaos
        │            fault acted on (killed, stopped, hung)
        ▼
    loopback HTTP server ◄── Jaeger UI build (static files; page routes fall back to
        │                    index.html; /api/* answers empty results, a trace
        │                    by id 404: no backend)
        ▼
    node scripts/jaeger_ui_drive.cjs (playwright-core + Debian's chromium): /search →
        Upload → the trace → screenshots; prints every row's service, name, error icon,
        span id and opened detail text as JSON
        ▼
    checks (each PASS / FAIL / SKIP, judged on the rendered DOM; the export only says
        which row is whose) ──► report on stdout; exit 0 when nothing FAILed

Invariants: the server and the browser live only inside main() (the server is shut down and
the node process waited for, on every path); bad input or a missing tool ends with one line
on stderr and exit 2, a failed check with exit 1.  Normally run through
scripts/jaeger_ui_check.sh, which builds the UI and installs the tools first.
"""

from __future__ import annotations

import argparse
import json
import mimetypes
import os
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

CACHE = Path(os.environ.get("FAULTLAB_JAEGER_UI_CACHE", Path.home() / ".cache" / "faultlab"))
DEFAULT_BUILD = CACHE / "jaeger-ui" / "packages" / "jaeger-ui" / "build"
DEFAULT_PLAYWRIGHT = CACHE / "jaeger-ui-driver" / "node_modules" / "playwright-core"
DRIVER = Path(__file__).with_name("jaeger_ui_drive.cjs")
BROWSER_TIMEOUT_S = 240  # for one trace
MAX_TRACES = 12
EMPTY_API = json.dumps({"data": [], "total": 0, "limit": 0, "offset": 0, "errors": None}).encode()
NOT_FOUND_API = json.dumps({"data": None, "errors": [{"code": 404, "msg": "trace not found"}]}).encode()
TRACE_BY_ID = re.compile(r"^/api/(v3/)?traces/[0-9a-fA-F]+$")
FAULT = "chaos.fault"
DETECTION = "faultlab.detection"


class CheckError(Exception):
    """Bad input or a missing tool: reported as one line, exit 2."""


@dataclass(frozen=True)
class SpanFact:
    span_id: str
    name: str
    role: str
    rank: int | None
    pid: int | None
    start_us: int
    end_us: int
    parent: str | None  # a CHILD_OF parent in the same trace


@dataclass(frozen=True)
class TraceFacts:
    trace_id: str
    why: str
    spans: dict[str, SpanFact]
    hit_pids: frozenset[int]


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # PASS, FAIL or SKIP
    detail: str


# ---- the export ---------------------------------------------------------------------------


def load_traces(path: Path) -> list[dict[str, Any]]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CheckError(f"cannot read {path} as JSON: {e}") from e
    traces = doc.get("data") if isinstance(doc, dict) else None
    if not isinstance(traces, list) or not traces:
        raise CheckError(f"{path} is not a Jaeger export (want a non-empty 'data' list of traces)")
    return traces


def _tags(items: list[dict[str, Any]]) -> dict[str, Any]:
    return {str(t.get("key")): t.get("value") for t in items}


def _has_error(trace: dict[str, Any]) -> bool:
    return any(_tags(s.get("tags", [])).get("error") in (True, "true") for s in trace["spans"])


def _start(trace: dict[str, Any]) -> int:
    return min((int(s.get("startTime", 0)) for s in trace["spans"]), default=0)


def choose_traces(traces: list[dict[str, Any]], trace_id: str | None,
                  every_failed: bool) -> list[tuple[dict[str, Any], str]]:
    if trace_id is not None:
        for t in traces:
            if t.get("traceID") == trace_id:
                return [(t, "given by --trace")]
        raise CheckError(f"trace {trace_id} is not in the export ({len(traces)} traces)")
    failed = sorted((t for t in traces if _has_error(t)), key=_start)
    if not failed:
        raise CheckError("no trace in the export has an error span; name one with --trace ID")
    if not every_failed:
        return [(failed[0], f"the earliest of {len(failed)} traces with an error span")]
    shown = failed[:MAX_TRACES]
    return [(t, f"failed trace {i} of {len(failed)}" + (f" (the first {MAX_TRACES} are checked)"
                                                       if len(failed) > MAX_TRACES else ""))
            for i, t in enumerate(shown, 1)]


def _fault_pids(traces: list[dict[str, Any]]) -> frozenset[int]:
    """Pids the export's chaos faults acted on: chaos.fault spans and chaos.fault events."""
    pids: set[int] = set()
    for t in traces:
        for s in t["spans"]:
            if s.get("operationName", "").startswith(FAULT):
                tags = _tags(s.get("tags", []))
                keys = ("process.pid", "faultlab.fault.pid")
                pids.update(v for k in keys if isinstance(v := tags.get(k), int))
            for log in s.get("logs", []):
                fields = _tags(log.get("fields", []))
                if fields.get("event") == FAULT and isinstance(fields.get("faultlab.fault.pid"), int):
                    pids.add(fields["faultlab.fault.pid"])
    return frozenset(pids)


def trace_facts(trace: dict[str, Any], why: str, hit_pids: frozenset[int]) -> TraceFacts:
    procs = {k: _tags(p.get("tags", [])) for k, p in trace.get("processes", {}).items()}
    spans = {}
    for s in trace["spans"]:
        proc = procs.get(s.get("processID"), {})
        rank = _tags(s.get("tags", [])).get("faultlab.rank", proc.get("faultlab.rank"))
        parents = [r["spanID"] for r in s.get("references", [])
                   if r.get("refType") == "CHILD_OF" and r.get("traceID") == trace["traceID"]]
        start = int(s.get("startTime", 0))
        spans[s["spanID"]] = SpanFact(
            s["spanID"], s.get("operationName", ""), str(proc.get("faultlab.role", "?")),
            rank if isinstance(rank, int) else None, proc.get("process.pid"),
            start, start + int(s.get("duration", 0)), parents[0] if parents else None,
        )
    return TraceFacts(trace["traceID"], why, spans, hit_pids)


def facts_of(export: Path, trace_id: str | None, every_failed: bool) -> list[TraceFacts]:
    traces = load_traces(export)
    hit = _fault_pids(traces)
    return [trace_facts(t, why, hit) for t, why in choose_traces(traces, trace_id, every_failed)]


# ---- the UI: server and browser -------------------------------------------------------------


def _handler_for(build: Path) -> type[BaseHTTPRequestHandler]:
    root = build.resolve()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = urlsplit(self.path).path
            if TRACE_BY_ID.search(path):  # as a backend without it: a link to another trace
                self._send(NOT_FOUND_API, "application/json", 404)
                return
            if path.startswith("/api/"):
                self._send(EMPTY_API, "application/json")
                return
            file = (root / path.lstrip("/")).resolve()
            if not file.is_file() or root not in file.parents:
                file = root / "index.html"  # a page route of the single-page app
            self._send(file.read_bytes(), mimetypes.guess_type(file.name)[0] or "application/octet-stream")

        def _send(self, body: bytes, ctype: str, status: int = 200) -> None:
            self.send_response(status)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    return Handler


@contextmanager
def serve(build: Path) -> Iterator[str]:
    if not (build / "index.html").is_file():
        raise CheckError(f"no Jaeger UI build at {build} (run scripts/jaeger_ui_check.sh to build it)")
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(build))
    thread = threading.Thread(target=server.serve_forever, name="jaeger-ui-server", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def drive(url: str, export: Path, jobs: list[dict[str, str]], tools: argparse.Namespace) -> Any:
    env = {**os.environ, "FAULTLAB_PLAYWRIGHT_CORE": str(tools.playwright),
           "FAULTLAB_CHROMIUM": tools.chromium}
    cmd = [tools.node, str(DRIVER), url, str(export.resolve()), json.dumps(jobs)]
    timeout = BROWSER_TIMEOUT_S * len(jobs)
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise CheckError(f"the browser did not finish within {timeout} s") from e
    if done.returncode != 0:
        raise CheckError(f"the browser run failed: {done.stderr.strip()[-2000:]}")
    return json.loads(done.stdout)


# ---- what the page shows --------------------------------------------------------------------


def _shown(rows: list[dict[str, Any]], word: str) -> list[str]:
    return [r["name"] for r in rows if word in r["name"] or word in r["detail"]]


def check_story(facts: TraceFacts, seen: dict[str, Any]) -> list[Check]:
    rows = seen["rows"]
    checks = [_check_rows(facts, rows, seen["header"])]
    for word, what in ((FAULT, "the fault"), (DETECTION, "the detection")):
        where = _shown(rows, word)
        checks.append(Check(f"{word} shown", "PASS" if where else "FAIL",
                            f"{what} on: {', '.join(where)}" if where else f"no row or event names {word}"))
    services = sorted({r["service"] for r in rows})
    checks.append(Check("services distinguishable", "PASS" if len(services) > 1 else "FAIL",
                        f"{len(services)} service name(s): {', '.join(services)}"))
    checks.append(_check_events_in_view(rows))
    checks.append(_check_latency_readable(rows))
    checks.append(_check_hit(facts, rows))
    checks.append(_check_survivors(facts, rows))
    return checks


def _check_rows(facts: TraceFacts, rows: list[dict[str, Any]], header: str) -> Check:
    """The header's span count against the export; the rows read (the first screenful of a
    long trace: the timeline is a virtual list) each one of the export's spans."""
    total = int(m.group(1)) if (m := re.search(r"Total Spans\s*(\d+)", header)) else len(rows)
    strangers = [r["name"] for r in rows if r["spanID"] not in facts.spans]
    missing = [] if len(rows) < total else sorted(facts.spans.keys() - {r["spanID"] for r in rows})
    ok = total == len(facts.spans) and not strangers and not missing
    detail = f"{total} spans drawn for {len(facts.spans)} in the export"
    detail += f" (rows read: the first {len(rows)})" if len(rows) < total else ""
    detail += f"; not drawn: {', '.join(facts.spans[m].name for m in missing)}" if missing else ""
    detail += f"; not in the export: {', '.join(strangers)}" if strangers else ""
    return Check("every span drawn", "PASS" if ok else "FAIL", detail)


def _check_events_in_view(rows: list[dict[str, Any]]) -> Check:
    """Jaeger hides events outside the trace's time range until 'show all': 'Logs (3 of 4)'."""
    cut = [f"{r['name']} {r['events']}" for r in rows if re.search(r"\(\d+ of \d+\)", r.get("events") or "")]
    return Check("every event in view", "FAIL" if cut else "PASS",
                 f"hidden until 'show all': {'; '.join(cut)}" if cut
                 else "no event outside the trace's range")


def _check_latency_readable(rows: list[dict[str, Any]]) -> Check:
    """A person reads milliseconds with one or two decimals (issue 22, item 7)."""
    shown = readable_values(rows)
    if not shown:
        return Check("detection latency readable", "SKIP", "no faultlab.detection.latency_ms shown")
    long = [v for v in shown if len(v.partition(".")[2]) > 2]
    return Check("detection latency readable", "FAIL" if long else "PASS",
                 f"shown as {', '.join(shown)} ms" + (" (more than 2 decimals)" if long else ""))


def _check_hit(facts: TraceFacts, rows: list[dict[str, Any]]) -> Check:
    if not facts.hit_pids:
        return Check("faulted process has a row", "SKIP", "no chaos fault in the export names a pid")
    own = [r["name"] for r in rows if (s := facts.spans.get(r["spanID"])) and s.pid in facts.hit_pids]
    return Check("faulted process has a row", "PASS" if own else "FAIL",
                 f"pid {sorted(facts.hit_pids)}: "
                 + (", ".join(own) if own else "no span of it in this trace"))


def _check_survivors(facts: TraceFacts, rows: list[dict[str, Any]]) -> Check:
    survivors = [r for r in rows if (s := facts.spans.get(r["spanID"])) and s.role == "worker"
                 and s.pid not in facts.hit_pids]
    if not facts.hit_pids or not survivors:
        return Check("survivor not an error", "SKIP", "no surviving worker's span in this trace")
    flagged = [r["name"] for r in survivors if r["ownError"]]
    return Check("survivor not an error", "FAIL" if flagged else "PASS",
                 f"error icon on: {', '.join(flagged)}" if flagged
                 else f"{len(survivors)} surviving worker row(s), none with an error icon")


def bars_past_parent(facts: TraceFacts, slack_us: int = 1000) -> list[str]:
    """Spans drawn ending after their parent (not judged: a survivor may outlive a failed
    call; said because the bar runs past its parent's on the timeline)."""
    notes = []
    for s in facts.spans.values():
        parent = facts.spans.get(s.parent or "")
        if parent and s.end_us > parent.end_us + slack_us:
            notes.append(f"{s.name} ends {(s.end_us - parent.end_us) / 1000:.1f} ms after its parent "
                         f"{parent.name} ({(parent.end_us - parent.start_us) / 1000:.1f} ms)")
    return notes


def readable_values(rows: list[dict[str, Any]]) -> list[str]:
    """The detection latency as the page prints it (for the report, not judged)."""
    found = []
    for r in rows:
        found += re.findall(r"faultlab\.detection\.latency_ms\W+([0-9.]+)", r["detail"])
    return found


# ---- the command ----------------------------------------------------------------------------


def _report(facts: TraceFacts, seen: dict[str, Any], checks: list[Check], pngs: tuple[Path, Path]) -> None:
    print(f"trace {facts.trace_id} ({facts.why}); {seen['results']} traces in the search list")
    if m := re.search(r"Services\s*(\d+)", seen["header"]):
        print(f"  trace page header: Services {m.group(1)}")
    for r in seen["rows"]:
        s = facts.spans.get(r["spanID"])
        who = (s.role + (f" rank {s.rank}" if s.rank is not None else "") + f" pid {s.pid}") if s else "?"
        names = ", ".join(r.get("eventNames") or [])
        events = f"  [{r['events']}: {names}]" if r.get("events") else ""
        print(f"  {'ERR' if r['ownError'] else '   '} {r['service']:<22} {r['name']:<40} {who}{events}")
    for c in checks:
        print(f"{c.status:<4} {c.name}: {c.detail}")
    for note in bars_past_parent(facts):
        print(f"NOTE bar past its parent: {note}")
    print(f"screenshots: {pngs[0]} (timeline), {pngs[1]} (the fault's row, else the first error row, opened)")


def _tools(args: argparse.Namespace) -> argparse.Namespace:
    node, chromium = shutil.which("node"), args.chromium or shutil.which("chromium")
    missing = [n for n, v in (("node", node), ("chromium", chromium)) if not v]
    if not (args.playwright / "package.json").is_file():
        missing.append(f"playwright-core at {args.playwright}")
    if missing:
        raise CheckError(f"missing: {', '.join(missing)} (scripts/jaeger_ui_check.sh installs them)")
    return argparse.Namespace(node=node, chromium=chromium, playwright=args.playwright)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("export", type=Path, help="a faultlab trace export (--format jaeger)")
    p.add_argument("--trace", help="trace id to open (default: the earliest trace with an error span)")
    p.add_argument("--failed", action="store_true",
                   help=f"check every trace with an error span (the first {MAX_TRACES}), each with "
                   "its own screenshots EXPORT.<id>.png")
    p.add_argument("--out", type=Path, help="timeline screenshot (default: EXPORT with .png)")
    p.add_argument("--detail-out", type=Path, help="screenshot with the fault's row (else the first "
                   "error row) opened (default: EXPORT with .detail.png)")
    build = Path(os.environ.get("FAULTLAB_JAEGER_UI_BUILD", DEFAULT_BUILD))
    p.add_argument("--build", type=Path, default=build,
                   help=f"the Jaeger UI build directory (default {DEFAULT_BUILD})")
    p.add_argument("--playwright", type=Path, default=DEFAULT_PLAYWRIGHT, help="the playwright-core package")
    p.add_argument("--chromium", help="the chromium binary (default: chromium on PATH)")
    return p.parse_args(argv)


def _screenshots(args: argparse.Namespace, facts: list[TraceFacts]) -> list[tuple[Path, Path]]:
    if len(facts) == 1:
        return [(args.out or args.export.with_suffix(".png"),
                 args.detail_out or args.export.with_suffix(".detail.png"))]
    stem = args.export.with_suffix("")
    return [(Path(f"{stem}.{f.trace_id[:7]}.png"), Path(f"{stem}.{f.trace_id[:7]}.detail.png"))
            for f in facts]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        facts = facts_of(args.export, args.trace, args.failed)
        pngs = _screenshots(args, facts)
        jobs = [{"traceId": f.trace_id, "timeline": str(a), "detail": str(b)}
                for f, (a, b) in zip(facts, pngs, strict=True)]
        tools = _tools(args)
        with serve(args.build) as url:
            seen = drive(url, args.export, jobs, tools)
    except CheckError as e:
        print(f"jaeger_ui_check: {e}", file=sys.stderr)
        return 2
    failed = False
    for i, (f, page, shots) in enumerate(zip(facts, seen, pngs, strict=True)):
        if i:
            print()
        checks = check_story(f, page)
        _report(f, page, checks, shots)
        failed = failed or any(c.status == "FAIL" for c in checks)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
