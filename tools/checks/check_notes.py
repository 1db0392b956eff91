#!/usr/bin/env python3
"""Every `Note [Name]` cited in the repository is defined exactly once.

A Note is defined where its text starts: a comment line holding only the
heading (`// Note [Name]`, `# Note [Name]`) followed by more comment, an item
of a design summary (`//  - Note [Name]: ...`), or a docstring paragraph that
opens with it (`Note [Name]: ...`). Every other mention cites it, including
`// Note [Name]: why this line` next to the code it explains. Not counted:
a Note as inline code in Markdown (an example of the form), and the files of
the checks themselves (tools/checks/, tests/checks/), which are made of
examples. Exits 1 and lists the names cited but never
defined, and those defined more than once.

    python3 tools/checks/check_notes.py [REPO]
"""
import collections
import pathlib
import re
import sys

from repo_files import tracked_files

NOTE = re.compile(r"Note \[([^\]]+)\]")
MARKDOWN_EXAMPLE = re.compile(r"`(?://\s*)?Note \[[^\]]+\]`")
EXAMPLES = ("tools/checks/", "tests/checks/")
HEADING = re.compile(r"^\s*(?://|#)\s*Note \[([^\]]+)\]\s*$")
INLINE_DEFINITION = re.compile(r"^(?:\s*(?://|#)\s*- |)Note \[([^\]]+)\]:")
COMMENT_TEXT = re.compile(r"^\s*(?://|#)\s*\S")


def defined_name(lines, index):
    """The Note whose definition starts at lines[index], or None."""
    inline = INLINE_DEFINITION.match(lines[index])
    if inline:
        return inline.group(1)
    heading = HEADING.match(lines[index])
    if heading and index + 1 < len(lines) and COMMENT_TEXT.match(lines[index + 1]):
        return heading.group(1)
    return None


def main():
    repo = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    definitions = collections.defaultdict(list)
    citations = collections.defaultdict(list)
    for path in tracked_files(repo):
        if path.suffix in {".png", ".gz", ".bin"} or not path.is_file():
            continue
        if str(path.relative_to(repo)).startswith(EXAMPLES):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if path.suffix == ".md":
            text = MARKDOWN_EXAMPLE.sub("", text)
        lines = text.splitlines()
        for index, line in enumerate(lines):
            where = f"{path.relative_to(repo)}:{index + 1}"
            name = defined_name(lines, index)
            if name:
                definitions[name].append(where)
                line = line.replace(f"Note [{name}]", "", 1)
            for cited in NOTE.findall(line):
                citations[cited].append(where)
    problems = []
    for name, places in sorted(citations.items()):
        if name not in definitions:
            problems.append(f"Note [{name}] is cited but never defined: {', '.join(places)}")
    for name, places in sorted(definitions.items()):
        if len(places) > 1:
            problems.append(f"Note [{name}] is defined {len(places)} times: {', '.join(places)}")
    for problem in problems:
        print(problem)
    if problems:
        return 1
    print(f"notes: {len(definitions)} defined, each once; every citation has its definition")
    return 0


if __name__ == "__main__":
    sys.exit(main())
