"""The docs hold together: every relative link in README.md, docs/*.md and benchmarks/README.md points to a file that
exists and, with an anchor, to a heading of it (GitHub's slugs); every page of docs/ is in mkdocs.yml's nav and every
nav entry exists. Plain text reads, no network, no mkdocs."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
CODE_SPAN = re.compile(r"`[^`\n]*`")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.M)


def pages():
  return [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted(DOCS.glob("*.md"))]


def slug(heading: str) -> str:
  """GitHub's anchor of a heading: lowercase, punctuation dropped (word characters, '-' and spaces kept), spaces ->
  '-'. Markup such as backticks and link brackets is punctuation, so it goes too."""
  heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)
  return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
  seen, out = {}, set()
  for heading in HEADING.findall(FENCE.sub("", path.read_text())):
    base = slug(heading)
    n = seen.get(base, 0)
    seen[base] = n + 1
    out.add(base if n == 0 else f"{base}-{n}")  # GitHub numbers repeated headings: x, x-1, x-2
  return out


def links(path: Path) -> list[str]:
  text = CODE_SPAN.sub("", FENCE.sub("", path.read_text()))
  return [t for t in LINK.findall(text) if not re.match(r"(https?:|mailto:)", t)]


def dead_links(path: Path) -> list[str]:
  dead = []
  for target in links(path):
    file, _, anchor = target.partition("#")
    dest = (path.parent / file).resolve() if file else path
    if not dest.exists():
      dead.append(f"{target}: no such file")
    elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
      dead.append(f"{target}: no such heading")
  return dead


def nav_entries() -> list[str]:
  """The .md files named in mkdocs.yml's nav (a plain read: the file has a custom YAML tag that safe_load refuses)."""
  text = (ROOT / "mkdocs.yml").read_text()
  nav = text[text.index("\nnav:") :]
  return re.findall(r"^\s+-\s+(?:[^:\n]+:\s+)?(\S+\.md)\s*$", nav, re.M)


def test_slugs_follow_github():
  assert slug("gpu.py — MFU of the RL update (Qwen2.5-VL-3B shape)") == "gpupy--mfu-of-the-rl-update-qwen25-vl-3b-shape"
  assert slug("How the CPU figures are taken (forward.py, train_step.py)") == (
    "how-the-cpu-figures-are-taken-forwardpy-train_steppy"
  )
  assert slug("Policy losses (`--only losses`)") == "policy-losses---only-losses"


def test_every_relative_link_resolves():
  dead = {str(p.relative_to(ROOT)): d for p in pages() if (d := dead_links(p))}
  assert not dead, dead


def test_a_dead_link_is_caught(tmp_path):
  (tmp_path / "there.md").write_text("# A heading\n\ntext\n")
  page = tmp_path / "page.md"
  page.write_text(
    "[ok](there.md) [ok](there.md#a-heading) [ok](#intro) `[code](gone.md)` [web](https://example.com/x)\n\n"
    "# Intro\n\n[gone](gone.md) [bad anchor](there.md#nope) ![img](missing.png)\n"
  )
  assert dead_links(page) == [
    "gone.md: no such file",
    "there.md#nope: no such heading",
    "missing.png: no such file",
  ]


def test_every_docs_page_is_in_the_nav_and_every_nav_entry_exists():
  nav = nav_entries()
  assert len(nav) == len(set(nav)), nav
  on_disk = sorted(p.name for p in DOCS.glob("*.md"))
  assert sorted(nav) == on_disk
  assert all((DOCS / entry).is_file() for entry in nav)
