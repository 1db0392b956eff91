#!/usr/bin/env python3
"""Includes point down the layers: docs/design.md's table "folder | may
include" says which folders (or single headers) each folder's C++ may
include; this fails on any `#include "folder/..."` it does not allow, naming
the file, the line and the rule. The most specific folder of the table
applies; `all` allows anything.

    python3 tools/checks/check_layers.py [REPO]
"""
import pathlib
import re
import sys

from repo_files import tracked_files

SOURCES = {".h", ".hpp", ".cc", ".cpp", ".cu", ".cuh", ".inc"}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')
ROW = re.compile(r"^\|\s*`([^`]+/)`\s*\|\s*(.+?)\s*\|\s*$")


def read_rules(design):
    """{folder: allowed folders, or None for all} from the table under the
    header row `| folder | may include |`."""
    rules = {}
    in_table = False
    for line in design.read_text(encoding="utf-8").splitlines():
        if re.match(r"^\|\s*folder\s*\|\s*may include\s*\|", line):
            in_table = True
            continue
        if not in_table:
            continue
        if not line.startswith("|"):
            break
        row = ROW.match(line)
        if not row:
            continue  # the |---| separator
        folder, allowed = row.groups()
        rules[folder] = None if allowed.strip() == "all" else re.findall(r"`([^`]+)`", allowed)
    if not rules:
        raise SystemExit(f"{design}: no '| folder | may include |' table")
    return rules


def rule_for(path, rules):
    """The most specific folder of the table that holds path, or None."""
    matches = [folder for folder in rules if path.startswith(folder)]
    return max(matches, key=len) if matches else None


def source_files(repo):
    """Tracked C++ sources, as paths relative to repo."""
    return [str(path.relative_to(repo)) for path in tracked_files(repo)
            if path.suffix in SOURCES]


def main():
    repo = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else ".").resolve()
    rules = read_rules(repo / "docs" / "design.md")
    top_folders = {folder.split("/")[0] + "/" for folder in rules}
    problems = []
    checked = 0
    for name in source_files(repo):
        folder = rule_for(name, rules)
        if folder is None or rules[folder] is None:
            continue
        checked += 1
        text = (repo / name).read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), 1):
            included = INCLUDE.match(line)
            if not included:
                continue
            target = included.group(1)
            if target.split("/")[0] + "/" not in top_folders:
                continue  # a header beside the file, or a library's
            if not any(target.startswith(allowed) for allowed in rules[folder]):
                problems.append(f"{name}:{number}: includes \"{target}\", but {folder} may include "
                                f"only {', '.join(rules[folder])} (docs/design.md, section 1)")
    for problem in problems:
        print(problem)
    if problems:
        return 1
    print(f"layers: {checked} files checked, every include points down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
