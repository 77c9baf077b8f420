"""MkDocs hooks of lakesink's documentation site (mkdocs.yml).

- `benchmarks.md` is benchmarks/README.md, published as a page at build time (one source).
- A link from a page to a repository file outside docs/ (`../examples/ingest.toml`) works on
  GitHub as it is; for the site the file is published under `repo/` and the link rewritten, so
  strict builds check these links too instead of ignoring them.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parents[1]
_REPO_LINK = re.compile(r"\]\(\.\./([^)#\s]+)(#[^)\s]*)?\)")
_published: set[str] = set()

RERUN = """

## Rerunning them

From a checkout, on an idle machine if the figures are to be compared:

```sh
bash scripts/setup-venv.sh && . .venv/bin/activate
pip install -e '.[bench]'
bash scripts/setup-kafka.sh           # Apache Kafka from Maven Central, once (needs Maven, Java 17)
python benchmarks/run.py              # ~10 min on 2 cores; --help for sizes and --skip
python benchmarks/bench_async.py      # sync vs async commit when each table commit is slowed
python benchmarks/bench_services.py   # clustering, and commit time with archival as a table ages
python benchmarks/bench_table.py      # publish and file-system view cost
python benchmarks/bench_readers.py    # one table read by Java Hudi, hudi-rs and lakesink's reader
python benchmarks/soak.py --minutes 30  # randomized crash soak; non-zero exit on any loss
```

`--broker noida` runs them on the embedded noida-db broker instead of Apache Kafka.
`benchmarks/run.py` prints its tables and writes `benchmarks/results/<time>.json`.
"""


def on_files(files: Files, config: Any) -> Files:
    bench = (ROOT / "benchmarks" / "README.md").read_text().rstrip("\n") + RERUN
    files.append(File.generated(config, "benchmarks.md", content=bench))
    for md in ROOT.joinpath("docs").glob("*.md"):
        for target, _anchor in _REPO_LINK.findall(md.read_text()):
            path = (ROOT / target).resolve()
            uri = f"repo/{target}"
            if path.is_file() and ROOT in path.parents and uri not in _published:
                _published.add(uri)
                files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Files) -> str:
    depth = posixpath.dirname(page.file.src_uri)
    prefix = "../" * (depth.count("/") + 1) if depth else ""

    def rewrite(m: re.Match[str]) -> str:
        target, anchor = m.group(1), m.group(2) or ""
        if f"repo/{target}" in _published:
            return f"]({prefix}repo/{target}{anchor})"
        return m.group(0)  # not a repository file: left for the strict link check to report

    return _REPO_LINK.sub(rewrite, markdown)
