"""Checks of the built documentation site that a strict MkDocs build does not make: text that
Markdown silently lost or merged, found in the HTML pages a reader gets.

- a `<placeholder>` written outside code in a page's Markdown is read as an HTML tag and
  vanishes from the page ("<table.path>/.hoodie/..." shows as "/.hoodie/...");
- a numbered step that follows a paragraph of the step before without a blank line joins that
  paragraph ("... variables. 3. Check it: ...") instead of starting its own list item.

    python scripts/check_docs_html.py docs site
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

HTML_TAGS = {"br", "p", "a", "b", "i", "em", "strong", "code", "pre", "sup", "sub", "details",
             "summary", "div", "span", "kbd", "img", "table", "tr", "td", "th"}  # fmt: skip


def lost_placeholders(markdown: str) -> list[str]:
    """`<name>` runs outside code blocks and code spans that are not HTML tags."""
    text = re.sub(r"```.*?```", "", markdown, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    found = re.findall(r"</?([^<>\s/]+)[^<>]*>", text)
    return sorted({f"<{name}>" for name in found if name.lower() not in HTML_TAGS})


def merged_steps(html: str) -> list[str]:
    """Paragraphs holding a line that starts like a numbered step ("3. Check it")."""
    return [
        m.group(1)[:60]
        for p in re.findall(r"<p>(.*?)</p>", html, flags=re.S)
        for m in re.finditer(r"\n(\d+\. [A-Z][^\n]*)", p)
    ]


def main(docs: Path, site: Path) -> int:
    problems: list[str] = []
    for page in sorted(docs.glob("*.md")):
        for name in lost_placeholders(page.read_text()):
            problems.append(f"{page}: {name} outside code is read as an HTML tag and lost")
        built = site / f"{page.stem}.html"
        if built.exists():
            for step in merged_steps(built.read_text()):
                problems.append(f"{built}: a numbered step ran into a paragraph: {step!r}")
    for problem in problems:
        print(f"check-docs: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
