"""trigger.interval.s=0: micro-batches back to back, with Spark's idle polling delay taken from
trigger.idle.poll.ms for the query's start only."""

from __future__ import annotations

import pytest

from lakesink.config import build_config
from lakesink.errors import ConfigError
from lakesink.spark.pipeline import SPARK_POLLING_DELAY, idle_polling_delay

BASE = {
    "kafka.bootstrap.servers": "127.0.0.1:9092",
    "kafka.topics": "t",
    "value.format": "raw",
    "table.path": "/tmp/t",
}


class FakeConf:
    """The get/set/unset of pyspark's RuntimeConfig, over a dict."""

    def __init__(self, **values: str) -> None:
        self.values = dict(values)
        self.seen: list[str | None] = []

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)

    def set(self, key: str, value: str) -> None:
        self.values[key] = value

    def unset(self, key: str) -> None:
        self.values.pop(key, None)


def test_a_zero_trigger_is_accepted_and_a_negative_one_is_named() -> None:
    assert build_config({**BASE, "trigger.interval.s": 0})["trigger.interval.s"] == 0.0
    with pytest.raises(ConfigError, match=r"trigger\.interval\.s.*0 or a positive number"):
        build_config({**BASE, "trigger.interval.s": -1})


def test_back_to_back_triggers_take_the_idle_poll_delay_while_the_query_starts() -> None:
    cfg = build_config({**BASE, "trigger.interval.s": 0, "trigger.idle.poll.ms": 250})
    conf = FakeConf()
    with idle_polling_delay(conf, cfg, once=False):
        assert conf.get(SPARK_POLLING_DELAY) == "250ms"
    assert SPARK_POLLING_DELAY not in conf.values  # the session's default again
    mine = FakeConf(**{SPARK_POLLING_DELAY: "20ms"})
    with idle_polling_delay(mine, cfg, once=False):
        assert mine.get(SPARK_POLLING_DELAY) == "250ms"
    assert mine.get(SPARK_POLLING_DELAY) == "20ms"  # a shared session keeps its own value


@pytest.mark.parametrize(("trigger", "once"), [(5.0, False), (0.0, True)])
def test_timed_triggers_and_once_leave_the_polling_delay_alone(trigger: float, once: bool) -> None:
    cfg = build_config({**BASE, "trigger.interval.s": trigger})
    conf = FakeConf()
    with idle_polling_delay(conf, cfg, once=once):
        assert SPARK_POLLING_DELAY not in conf.values
