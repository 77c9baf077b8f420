"""Table services beside the next batch (`table.services.run=beside`): one daemon thread per
table in the driver runs the services a published commit made due, while the writer's next
batches go on.

Why a thread and not the batch's own path: clustering, rewrite-data-files and
remove-orphan-files grow with the table, and run inline they hold the next batch (records wait
in Kafka meanwhile: the freshness tail). Beside the batch they take the table lock and pass the
conflict checks exactly as `lakesink table cluster` or `lakesink iceberg rewrite-data-files`
run from another process beside a writer do; the batch never waits for them except for the
lock's short hold.

The rules:
- a job is known by its name; while one of a name waits its turn, another of that name is not
  queued (coalesced: the services act on the whole table, one later run covers both);
- a job's failure (raised, or reported in its result's `errors`) is logged and counted
  (`lakesink_table_service_runs{outcome="failed"}`), never raised to a batch;
- `wait_idle` lets the ingestion's shutdown wait for the run in progress; `close` drops what
  waits (the next commits make it due again) and refuses more;
- the thread lives while there is work: an idle runner holds none (an ingestion that ends
  leaves nothing behind).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from lakesink.metrics import IngestionMetrics

log = logging.getLogger(__name__)

Job = Callable[[], object]


@dataclass
class RunnerStats:
    """What a runner did: jobs run, failed (raised or reported errors), coalesced (not queued
    because one of the same name waited), dropped (waiting at close)."""

    runs: int = 0
    failed: int = 0
    coalesced: int = 0
    dropped: int = 0
    busy_s: float = 0.0


def reported_errors(result: object) -> list[str]:
    """The errors a service run reports in its result (`errors`: a list of text), if any."""
    errors = getattr(result, "errors", None)
    return [str(e) for e in errors] if isinstance(errors, list) else []


class ServicesRunner:
    """Runs a table's service jobs on a thread of their own (started for them, ended when
    none is left), one at a time, in order."""

    def __init__(self, table: str, *, metrics: IngestionMetrics | None = None) -> None:
        self.table = table
        self.metrics = metrics
        self.stats = RunnerStats()
        self._cond = threading.Condition()
        self._waiting: dict[str, Job] = {}  # by name, in the order handed in
        self._running: str | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    @property
    def busy(self) -> bool:
        """A job runs or waits."""
        with self._cond:
            return self._running is not None or bool(self._waiting)

    def submit(self, name: str, job: Job) -> bool:
        """Hand `job` to the thread (started if none runs). False when it was not queued: one
        of the same name waits already (coalesced), or the runner is closed."""
        with self._cond:
            if self._closed:
                log.info("table %s: services runner closed; %s not run", self.table, name)
                return False
            if name in self._waiting:
                self.stats.coalesced += 1
                log.info("table %s: %s waits already; not queued twice", self.table, name)
                return False
            self._waiting[name] = job
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"lakesink-services-{self.table}", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()
            return True

    def wait_idle(self, timeout_s: float | None = None) -> bool:
        """Wait until nothing runs or waits; False if `timeout_s` passed first."""
        with self._cond:
            return self._cond.wait_for(
                lambda: self._running is None and not self._waiting, timeout=timeout_s
            )

    def close(self, timeout_s: float | None = None) -> bool:
        """Drop what waits, let the job in progress finish (up to `timeout_s`: then it is
        abandoned on its daemon thread, as a crash would leave it: the table's recovery rolls
        its instant back) and end the thread. True when the thread ended."""
        with self._cond:
            self._closed = True
            if self._waiting:
                self.stats.dropped += len(self._waiting)
                log.info(
                    "table %s: services not run at close: %s", self.table, ", ".join(self._waiting)
                )
                self._waiting.clear()
            self._cond.notify_all()
            thread = self._thread
        if thread is None:
            return True
        thread.join(timeout_s)
        if thread.is_alive():
            log.warning("table %s: a service run was still going at close", self.table)
            return False
        return True

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._waiting:  # idle: the thread ends, the next submit starts another
                    self._thread = None
                    return
                name = next(iter(self._waiting))
                job = self._waiting.pop(name)
                self._running = name
            started = time.perf_counter()
            try:
                errors = reported_errors(job())
            except Exception as e:  # a service never fails the ingestion: logged, counted
                log.exception("table %s: %s beside the batch failed", self.table, name)
                errors = [f"{name}: {e}"]
            busy = time.perf_counter() - started
            if errors:
                log.warning("table %s: %s failed: %s", self.table, name, "; ".join(errors))
            if self.metrics is not None:
                self.metrics.record_service_run(failed=bool(errors))
            with self._cond:
                self.stats.runs += 1
                self.stats.failed += bool(errors)
                self.stats.busy_s += busy
                self._running = None
                self._cond.notify_all()
