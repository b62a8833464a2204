"""Metric sinks. JSONL is always on: every record is appended whole and flushed to the OS at once
(one ``write`` per batch of lines), so a crash (kill -9) leaves at most one torn last line, which
the readers skip (:func:`trainperf.runio.read_jsonl`)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from trainperf.runio import dumps_strict


class JSONLSink:
    def __init__(self, path: str | os.PathLike, *, truncate_after_step: int | None = None):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if truncate_after_step is not None and self.path.exists():
            self._truncate(truncate_after_step)
        elif truncate_after_step is None and self.path.exists():
            self.path.unlink()
        self._f = open(self.path, "a", buffering=1, encoding="utf-8")  # line-buffered

    def _truncate(self, step: int) -> None:
        """On resume: drop lines of steps after the checkpoint (they will be recomputed)."""
        keep = []
        for line in self.path.read_text(encoding="utf-8", errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                continue  # a line cut by a crash, or garbage
            s = rec.get("step", -1) if isinstance(rec, dict) else None
            if isinstance(s, (int, float)) and not isinstance(s, bool) and s <= step:
                keep.append(line)
        tmp = self.path.with_name(f".{self.path.name}.tmp{os.getpid()}")  # atomic: a kill now keeps the old file
        try:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write("".join(k + "\n" for k in keep))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        finally:
            tmp.unlink(missing_ok=True)

    def write(self, record: dict) -> None:
        self._f.write(dumps_strict(record, indent=None) + "\n")  # strict JSON: a NaN loss is logged as null

    def write_lines(self, lines: list[str]) -> None:
        """Lines already serialized (strict JSON, no newline), appended in one write and flushed."""
        if lines:
            self._f.write("".join(x + "\n" for x in lines))
            self._f.flush()

    def close(self) -> None:
        self._f.close()


class TensorBoardSink:
    """Scalars of each step record to TensorBoard event files (needs the tensorboard package)."""

    def __init__(self, log_dir: str | os.PathLike):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as exc:
            raise ImportError(
                "monitor.tensorboard=true needs the tensorboard package: pip install 'trainperf[tensorboard]'"
            ) from exc
        self._w = SummaryWriter(log_dir=str(log_dir))

    def write(self, record: dict) -> None:
        step = record.get("step")
        if step is None:
            return
        for key, value in _flat_numbers(record):
            if key != "step":
                self._w.add_scalar(key.replace(".", "/"), value, step)

    def close(self) -> None:
        self._w.close()


def _flat_numbers(record: dict, prefix: str = ""):
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, bool) or value is None:
            continue
        if isinstance(value, (int, float)):
            yield name, float(value)
        elif isinstance(value, dict):
            yield from _flat_numbers(value, name + ".")


def _prom_value(v: float) -> str:
    if v != v:
        return "NaN"
    if v in (float("inf"), float("-inf")):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


def _metric_name(key: str) -> str:
    import re

    return "trainperf_" + re.sub(r"[^a-zA-Z0-9_]", "_", key)


class PrometheusEndpoint:
    """``GET /metrics`` in the Prometheus text exposition format (version 0.0.4), served by the
    standard library's HTTP server in a daemon thread. Bound to 127.0.0.1 unless told otherwise;
    port 0 picks a free port (see ``.port``). Gauges hold the latest value of each number of the
    step and sample records, labelled with the rank."""

    def __init__(self, port: int, host: str = "127.0.0.1", rank: int = 0):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        self.rank = rank
        self._values: dict[str, float] = {}
        self._lock = threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's naming
                if self.path.split("?")[0] not in ("/metrics", "/"):
                    self.send_error(404, "only /metrics is served")
                    return
                body = endpoint.exposition().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):  # keep the training output clean
                pass

        try:
            self._server = ThreadingHTTPServer((host, port), Handler)
        except (OSError, OverflowError) as exc:  # in use, no such address, a port past 65535 (base port + rank)
            from trainperf.errors import ConfigError

            raise ConfigError(
                f"monitor.prometheus_port: rank {rank} cannot serve on {host}:{port} ({getattr(exc, 'strerror', None) or exc}); "
                "choose a free port (rank r serves on the port + r) or 0 to let each rank pick one, and "
                "monitor.prometheus_host an address of this machine") from None
        self._server.daemon_threads = True
        self.host, self.port = self._server.server_address[:2]
        self._thread = threading.Thread(target=self._server.serve_forever, name="trainperf-prometheus",
                                        daemon=True)
        self._thread.start()

    def write(self, record: dict) -> None:
        with self._lock:
            for key, value in _flat_numbers(record):
                if key not in ("t", "rank"):
                    self._values[_metric_name(key)] = value

    def exposition(self) -> str:
        with self._lock:
            items = sorted(self._values.items())
        lines = []
        for name, value in items:
            lines.append(f"# TYPE {name} gauge")
            lines.append(f'{name}{{rank="{self.rank}"}} {_prom_value(value)}')
        return "\n".join(lines) + "\n"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
