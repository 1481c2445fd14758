"""mkdocs hooks: pages generated from the repository at build time (no plugin needed).

* ``<!-- header-docs: PATH -->`` in a page is replaced by the leading ``//`` comment block of the
  C++ header ``PATH`` (the formats page);
* ``benchmarks/results.md``, ``benchmarks/REPORT.md`` and ``benchmarks/sections/<name>.md`` are
  generated from ``bench/RESULTS.md``, ``bench/REPORT.md`` and ``bench/sections/*.md`` (front
  matter dropped, headings one level up, chart images left out: they are not kept in git), so
  the links of RESULTS.md work on the site as in the repository.
"""
from __future__ import annotations

import re
from pathlib import Path

from mkdocs.exceptions import PluginError
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
HEADER_DOCS = re.compile(r"<!--\s*header-docs:\s*(\S+)\s*-->")


def header_docs(path: Path) -> str:
    """The leading ``//`` comment block of a C++ header, without the comment markers."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("//"):
            break
        lines.append(line[3:] if line.startswith("// ") else line[2:])
    if len(lines) < 3:
        raise PluginError(f"header-docs: {path} has no leading comment block to document its format")
    return "\n".join(lines).strip("\n")


def _promote(md: str) -> str:
    """Headings one level up (outside fences), front matter and image links dropped."""
    if md.startswith("---\n"):
        end = md.find("\n---\n", 4)
        if end < 0:
            raise PluginError("bench section: front matter without its closing '---'")
        md = md[end + 5:]
    out, fence = [], False
    for line in md.split("\n"):
        if line.startswith("```"):
            fence = not fence
        if not fence:
            if re.match(r"#{2,6} ", line):
                line = line[1:]
            line = re.sub(r"!\[[^\]]*\]\([^)]*\.png\)", "", line)
        out.append(line)
    return "\n".join(out)


def on_files(files, config):
    docs = [("benchmarks/results.md", BENCH / "RESULTS.md", False),
            ("benchmarks/REPORT.md", BENCH / "REPORT.md", True)]
    docs += [(f"benchmarks/sections/{p.name}", p, True) for p in sorted((BENCH / "sections").glob("*.md"))]
    for uri, src, promote in docs:
        if not src.is_file():
            raise PluginError(f"generated page {uri}: {src.relative_to(ROOT)} is missing")
        text = src.read_text(encoding="utf-8")
        files.append(File.generated(config, uri, content=_promote(text) if promote else text))
    return files


def on_page_markdown(markdown, page, config, files):
    def repl(m):
        path = ROOT / m.group(1)
        if not path.is_file():
            raise PluginError(f"{page.file.src_uri}: header-docs: no file {m.group(1)}")
        return "```text\n" + header_docs(path) + "\n```"

    return HEADER_DOCS.sub(repl, markdown)
