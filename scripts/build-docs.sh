#!/usr/bin/env bash
# Build the documentation site (mkdocs.yml) into site/ in strict mode: a broken link, a missing
# anchor or a page left out of the nav fails the build. Needs the `docs` extra.
set -euo pipefail
cd "$(dirname "$0")/.."
export NO_MKDOCS_2_WARNING=1   # Material's notice about MkDocs 2.0, printed on every build
python -m mkdocs build --strict --quiet --site-dir "${1:-site}"
# what a strict build lets through: placeholders Markdown drops, steps that merge into a paragraph
python scripts/check_docs_html.py docs "${1:-site}"
