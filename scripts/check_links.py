#!/usr/bin/env python3
"""Fails when a relative link of the repository's Markdown leads nowhere (`make lint` runs it).

Every Markdown file git knows of (README.md, docs/, ARCHITECTURE.md, CONTRIBUTING.md,
CHANGELOG.md, clients/*/README.md, bench/, tests/deploy/HA.md, ...) is read; in each, every
link `[text](target)` and `[text]: target` outside code (fenced blocks and `code spans`)
whose target is not a URL must name a file or folder that exists, relative to the file, and
its `#anchor`, if any, a heading of the Markdown file it names (or of the file itself, for
`#anchor` alone), spelled as GitHub spells heading anchors: lower case, punctuation but `-`
and `_` dropped, spaces as `-`, and `-1`, `-2`, ... after a heading's repeats.

    python3 scripts/check_links.py            check every Markdown file git knows of
    python3 scripts/check_links.py FILE...    check those files only

Exit status 1 and one line per broken link (file:line: target: why), or 0.
"""
import pathlib
import re
import subprocess
import sys
import urllib.parse

ROOT = pathlib.Path(__file__).resolve().parent.parent

FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"", re.I)


def markdown_files():
    out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "*.md"], cwd=ROOT, capture_output=True,
                         check=True).stdout.decode()
    return [ROOT / name for name in out.split("\0") if name]


def strip_code_spans(line):
    """The line with its `code spans` blanked (their length kept)."""
    return re.sub(r"(`+)(.+?)\1", lambda m: " " * len(m.group(0)), line)


def github_slug(heading):
    """The anchor GitHub gives a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML
    text = text.replace("`", "").replace("*", "").replace("~", "")
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)  # keeps letters, digits, _, - and spaces
    return text.replace(" ", "-")


_anchors = {}


def anchors(path):
    if path not in _anchors:
        seen, found = {}, set()
        in_code = False
        for line in path.read_text(encoding="utf-8").splitlines():
            if FENCE.match(line):
                in_code = not in_code
                continue
            if in_code:
                continue
            found.update(HTML_ANCHOR.findall(line))
            heading = HEADING.match(line)
            if heading:
                slug = github_slug(heading.group(2))
                count = seen.get(slug, 0)
                seen[slug] = count + 1
                found.add(slug if count == 0 else f"{slug}-{count}")
        _anchors[path] = found
    return _anchors[path]


def links(path):
    """(line number, target) of every link of `path` outside code."""
    in_code = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            in_code = not in_code
            continue
        if in_code:
            continue
        line = strip_code_spans(line)
        for match in INLINE_LINK.finditer(line):
            yield number, match.group(1)
        definition = REFERENCE_DEF.match(line)
        if definition:
            yield number, definition.group(1)


def problem(source, target):
    """Why `target`, a link of `source`, leads nowhere; None when it leads somewhere."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # https:, mailto:, ...
        return None
    file_part, _, anchor = target.partition("#")
    file_part = urllib.parse.unquote(file_part)
    if file_part.startswith("/"):
        dest = ROOT / file_part.lstrip("/")
    elif file_part:
        dest = (source.parent / file_part).resolve()
    else:
        dest = source
    if not dest.exists():
        return "no such file"
    try:
        dest.relative_to(ROOT)
    except ValueError:
        return "outside the repository"
    if anchor and dest.is_file() and dest.suffix == ".md":
        if urllib.parse.unquote(anchor) not in anchors(dest):
            return f"no heading with anchor #{anchor} in {dest.relative_to(ROOT)}"
    return None


def main(argv):
    files = [pathlib.Path(a).resolve() for a in argv] if argv else markdown_files()
    broken, count = [], 0
    for path in files:
        for number, target in links(path):
            count += 1
            why = problem(path, target)
            if why:
                broken.append(f"{path.relative_to(ROOT)}:{number}: {target}: {why}")
    for line in broken:
        print(line, file=sys.stderr)
    if broken:
        print(f"{len(broken)} broken link(s) of {count}", file=sys.stderr)
        return 1
    print(f"{count} links in {len(files)} Markdown files: every relative one leads somewhere")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
