"""The files the checks read: git's tracked files, or outside a git checkout
every file but hidden folders and build trees. Shared by check_notes.py and
check_layers.py, which import it from their own folder."""
import pathlib
import subprocess


def tracked_files(repo):
    """Paths (under repo) of the files the checks read."""
    listed = subprocess.run(["git", "-C", str(repo), "ls-files", "-z"], capture_output=True)
    if listed.returncode == 0:
        return [repo / name for name in listed.stdout.decode().split("\0") if name]
    return [path for path in pathlib.Path(repo).rglob("*")
            if not any(part.startswith((".", "build")) for part in path.relative_to(repo).parts)]
