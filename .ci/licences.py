"""Licence check of lemon_exec's runtime dependency tree (run by ``.ci/run``).

Walks the requirements of the installed ``lemon_exec`` (its own, and those of the extras
users install to run it: ``mcp``, ``notebook`` and ``images``) through ``importlib.metadata``, reads each
distribution's licence (``License-Expression``, else the ``License :: ...`` classifiers, else
the ``License`` field) and fails when one is not on the permissive allowlist below. An MIT
package must not pull in copyleft code (webfetch once depended on html2text, GPL-3.0).

    python .ci/licences.py [--extra NAME ...]

Exit status 0 when every licence is allowed, 1 otherwise (each offender printed).
"""

from __future__ import annotations

import argparse
import re
import sys
from importlib import metadata

from packaging.markers import default_environment
from packaging.requirements import Requirement

#: Permissive licences (SPDX ids and the spellings packages use for them).
ALLOWED = {
    "MIT", "MIT-0", "BSD", "BSD-2-Clause", "BSD-3-Clause", "0BSD", "Apache-2.0", "ISC",
    "PSF-2.0", "Python-2.0", "Unlicense", "Zlib", "HPND",
    # HPND's "MIT-CMU" variant (Pillow): permissive, notice kept.
    "MIT-CMU",
    # Weak, file-level copyleft: using the files unmodified puts nothing on our code (certifi).
    "MPL-2.0",
}
#: Licence words that are copyleft for our purposes, whatever else the text says.
_COPYLEFT = re.compile(r"\b(A?GPL|LGPL|GNU (Lesser |Affero )?General Public)", re.IGNORECASE)
_CLASSIFIER_IDS = {
    "MIT License": "MIT",
    "BSD License": "BSD",
    "Apache Software License": "Apache-2.0",
    "ISC License (ISCL)": "ISC",
    "Python Software Foundation License": "PSF-2.0",
    "Mozilla Public License 2.0 (MPL 2.0)": "MPL-2.0",
    "The Unlicense (Unlicense)": "Unlicense",
    "Historical Permission Notice and Disclaimer (HPND)": "HPND",
    "zlib/libpng License": "Zlib",
}
_SPELLINGS = {
    "mit license": "MIT", "bsd license": "BSD", "new bsd license": "BSD-3-Clause",
    "bsd 3-clause": "BSD-3-Clause", "3-clause bsd license": "BSD-3-Clause",
    "apache 2.0": "Apache-2.0", "apache license 2.0": "Apache-2.0",
    "apache software license": "Apache-2.0", "apache-2": "Apache-2.0",
}


def tree(root: str, extras: list[str]) -> dict[str, metadata.Distribution]:
    """Every distribution ``root`` (with ``extras``) needs, by normalised name."""
    found: dict[str, metadata.Distribution] = {}
    todo: list[tuple[str, tuple[str, ...]]] = [(root, tuple(extras))]
    while todo:
        name, wanted = todo.pop()
        dist = metadata.distribution(name)
        key = _norm(dist.metadata["Name"])
        if key in found and not wanted:
            continue
        found[key] = dist
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is not None and not any(
                req.marker.evaluate({**default_environment(), "extra": extra})
                for extra in (*wanted, "")
            ):
                continue
            if _norm(req.name) not in found:
                todo.append((req.name, tuple(req.extras)))
    found.pop(_norm(root))
    return found


def licence(dist: metadata.Distribution) -> str:
    meta = dist.metadata
    if meta.get("License-Expression"):
        return str(meta["License-Expression"])
    ids = [
        _CLASSIFIER_IDS.get(c.rsplit(" :: ", 1)[-1], c.rsplit(" :: ", 1)[-1])
        for c in meta.get_all("Classifier") or []
        if c.startswith("License :: ") and c != "License :: OSI Approved"
    ]
    if ids:
        return " OR ".join(dict.fromkeys(ids))
    text = (meta.get("License") or "").strip().splitlines()
    return text[0] if text else "UNKNOWN"


def allowed(expression: str) -> bool:
    """Whether an SPDX-like expression admits a permissive reading (``A OR B``: either)."""
    for alternative in re.split(r"\s+OR\s+", expression.strip("() ")):
        parts = re.split(r"\s+AND\s+", alternative.strip("() "))
        if all(_spdx(p) in ALLOWED and not _COPYLEFT.search(p) for p in parts):
            return True
    return False


def _spdx(name: str) -> str:
    name = name.strip("() ")
    return _SPELLINGS.get(name.lower(), name)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--extra", action="append", default=None, help="default: mcp, notebook, images"
    )
    args = parser.parse_args()
    extras = args.extra if args.extra is not None else ["mcp", "notebook", "images"]
    bad: list[str] = []
    dists = tree("lemon_exec", extras)
    for key in sorted(dists):
        dist = dists[key]
        found = licence(dist)
        if not allowed(found):
            bad.append(f"{dist.metadata['Name']} {dist.version}: {found}")
    print(f"licences: {len(dists)} runtime dependencies of lemon_exec[{','.join(extras)}]")
    for line in bad:
        print(f"  not on the allowlist: {line}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
