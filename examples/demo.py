"""Summarise the repository this runs in, the way an agent would with execute_code.

Run it from the repository root:

    lemon-exec run examples/demo.py

The helpers (ls, find, grep, read, batch, notify, text) are pre-imported by the kernel; this
file is not meant to be run with plain ``python``. Intermediate results (file lists, file
contents, grep hits) stay inside the script; only the text() summary is the result, and the
print()ed line lands in the diagnostics tail.
"""

# The helpers are injected into the script's namespace by the kernel, not imported.
# ruff: noqa: F821

from collections import Counter

# Helper calls are budgeted per run (max_rpc_calls, default 100): leave room for the
# ls/find/grep calls and any continuation reads.
READ_BUDGET = 80
BATCH_SIZE = 16
TRUNCATED = "[truncated: "

notify("listing the top level")
entries = [e for e in ls(".").splitlines() if e and not e.startswith(TRUNCATED)]
folders = [e for e in entries if e.endswith("/") and not e.startswith(".")]

notify("finding Python files")
py_files = [p for p in find("*.py").splitlines() if p.endswith(".py")]


calls = 2  # the ls() and find() above


def plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def count_lines(path: str, body: str) -> int:
    """Lines in ``body``; follows read()'s continuation note when a file was cut."""
    global calls
    total = 0
    while True:
        lines = body.splitlines()
        if lines and lines[-1].startswith(TRUNCATED):
            total += len(lines) - 1
            calls += 1
            try:
                body = read(path, offset=total + 1)
            except ToolError:  # out of helper budget: count what was read
                return total
        else:
            return total + len(lines)


lines_by_area: Counter[str] = Counter()
files_by_area: Counter[str] = Counter()
to_read = py_files[:READ_BUDGET]
for start in range(0, len(to_read), BATCH_SIZE):
    chunk = to_read[start : start + BATCH_SIZE]
    notify(f"reading files {start + 1}-{start + len(chunk)} of {len(to_read)}")
    try:
        bodies = batch([("read", {"path": path}) for path in chunk])
        calls += len(chunk)
    except ToolError as exc:  # e.g. the result-byte budget ran out: report what we have
        notify(f"stopped reading: {exc}")
        break
    for path, body in zip(chunk, bodies, strict=True):
        area = path.split("/", 1)[0] if "/" in path else "(top level)"
        lines_by_area[area] += count_lines(path, body)
        files_by_area[area] += 1

notify("looking for to-do and fix-me markers")
marker = "|".join(("TO" + "DO", "FIX" + "ME"))  # spelled apart so this file does not match
calls += 1
hits = [
    line
    for line in grep(rf"\b({marker})\b", ".", glob="*.py").splitlines()
    if line and not line.startswith(TRUNCATED)
]

counted = sum(files_by_area.values())
summary = [
    f"Top level: {len(entries)} entries; folders: {', '.join(folders) or '(none)'}",
    f"Python files: {len(py_files)} ({sum(lines_by_area.values())} lines in the {counted} read)",
]
for area, lines in lines_by_area.most_common():
    summary.append(f"  {area}: {plural(files_by_area[area], 'file')}, {plural(lines, 'line')}")
summary.append(f"To-do and fix-me markers in Python files: {len(hits)}")
summary.extend(f"  {hit[:120]}" for hit in hits[:5])
if len(hits) > 5:
    summary.append(f"  ... and {len(hits) - 5} more")

print(f"demo: made {calls} helper calls")  # diagnostics, not the result
text("\n".join(summary))
