"""The metrics keys (metrics.*): the Prometheus endpoint and the lag readings."""

from __future__ import annotations

from lakesink.config.parsers import Key, optional_port, positive_float

METRICS_KEYS: tuple[Key, ...] = (
    Key(
        "metrics.port",
        optional_port,
        None,
        "Serve Prometheus metrics on this port while ingesting (`/metrics`; 0 picks a free "
        "port); unset: no endpoint. Metric names: the docs page Metrics.",
    ),
    Key(
        "metrics.host",
        str,
        "127.0.0.1",
        "Address the metrics endpoint listens on (0.0.0.0 for every interface).",
    ),
    Key(
        "metrics.lag.interval.s",
        positive_float,
        10.0,
        "Seconds between readings of the high watermarks for the lag metrics.",
    ),
)
