"""`lakesink broker`: the demo's embedded Kafka-protocol broker (noida-db), kept running until
Ctrl-C, so that `examples/ingest.toml` (brokers `127.0.0.1:9092`, topic `events`) or a
configuration of one's own has a broker to read from without installing Kafka.

By default the broker listens on 127.0.0.1:9092 and gets a topic `events` with sample events of
the schema `examples/ingest.toml` decodes. Its data lives in a temporary folder removed when it
stops, unless `--dir` names one (a later `lakesink broker --dir` with the same folder finds the
records again).
"""

from __future__ import annotations

import argparse
import signal
import threading
from pathlib import Path
from types import FrameType

from lakesink.console import say
from lakesink.errors import KafkaError

DEFAULT_PORT = 9092
"""The port of `examples/ingest.toml`'s brokers (and Kafka's own default)."""


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "broker",
        help="run a local Kafka-protocol broker (the demo's) with a topic of sample events, "
        "until Ctrl-C",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help="port to listen on")
    p.add_argument("--topic", default="events", help="topic to create (empty: none)")
    p.add_argument("--partitions", type=int, default=4, help="partitions of the topic")
    p.add_argument(
        "--events", type=int, default=10_000, help="sample events to produce to the topic"
    )
    p.add_argument(
        "--dir", default=None, help="keep the broker's data here (default: removed at stop)"
    )


def run_broker(args: argparse.Namespace) -> int:
    from lakesink.kafka.client import create_topic
    from lakesink.kafka.embedded_broker import EmbeddedBroker, noida_db_binary
    from lakesink.kafka.producer import produce_sample_events

    noida_db_binary()  # missing: one line naming the extra, before anything starts
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    data_dir = Path(args.dir).resolve() if args.dir else None
    try:
        with EmbeddedBroker(host=args.host, port=args.port, data_dir=data_dir) as broker:
            bootstrap = broker.bootstrap_servers
            topic = ""
            if args.topic and create_topic(bootstrap, args.topic, args.partitions):
                events = max(0, args.events)
                produce_sample_events(bootstrap, args.topic, events, args.partitions, create=False)
                topic = f"; topic '{args.topic}' with {events:,} sample events"
            elif args.topic:  # a kept --dir's topic: its records are there already
                topic = f"; topic '{args.topic}' as it was kept"
            kept = f"; data kept in {data_dir}" if data_dir else ""
            say(f"lakesink broker: listening on {bootstrap}{topic}{kept}. Ctrl-C stops it.")
            while not stop.wait(0.5):
                if not broker.running:
                    raise KafkaError(
                        f"the broker on {bootstrap} exited; its log: {broker.log_path}"
                    )
            say("lakesink broker: stopping ...")
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    say("lakesink broker: stopped")
    return 0
