#!/usr/bin/env python3
"""Compares two `--out DIR` folders of dpaudit mia/merge runs: the same files, byte for byte,
except what names the run itself: the command line (report.json `command`, and where the
Markdown and HTML renderings print it), the device line ("merged shards" for a merge, the CPU for
a run that scored), the backend line (the executor a run that scored used; part files do not
record it, so a merge states none) and mia.json's `elapsed_s`.

    same_report.py A_DIR B_DIR

Exit 0 when they agree, 1 (printing each difference) when they do not.
"""

import hashlib
import json
import os
import re
import sys

# The backend fact as each rendering prints it (present only in a run that scored).
BACKEND_LINE = re.compile(r"^(- \*\*backend\*\*: .*|<li><strong>backend</strong>: .*</li>)\n", re.M)


def facts_device(report):
    """The value of the `device` fact in the report's summary, or None."""
    for fact in report.get("summary", []):
        if fact.get("name") == "device":
            return fact.get("value")
    return None


def normalised_report(report):
    r = json.loads(json.dumps(report))
    r.pop("command", None)
    r["summary"] = [f for f in r.get("summary", []) if f.get("name") != "backend"]
    for fact in r.get("summary", []):
        if fact.get("name") == "device":
            fact["value"] = "<device>"
    return r


def normalised_mia(record):
    r = dict(record)
    r.pop("elapsed_s", None)
    r.pop("device", None)
    r.pop("backend", None)
    return r


def main(a, b):
    names_a, names_b = sorted(os.listdir(a)), sorted(os.listdir(b))
    problems = []
    if names_a != names_b:
        problems.append(f"files differ: {names_a} vs {names_b}")
    ra = json.load(open(os.path.join(a, "report.json"), encoding="utf-8"))
    rb = json.load(open(os.path.join(b, "report.json"), encoding="utf-8"))
    # What may differ, as each rendering prints it.
    swaps = [(ra["command"], rb["command"])]
    if facts_device(ra) is not None and facts_device(rb) is not None:
        swaps.append((facts_device(ra), facts_device(rb)))
    for name in sorted(set(names_a) & set(names_b)):
        pa, pb = os.path.join(a, name), os.path.join(b, name)
        da, db = open(pa, "rb").read(), open(pb, "rb").read()
        if name == ".dpaudit-manifest.json":
            # Hashes of files that differ as above differ too: the same files in the same
            # order, each hash that of the file beside it.
            ma, mb = json.loads(da), json.loads(db)
            same = [f["name"] for f in ma["files"]] == [f["name"] for f in mb["files"]] and all(
                manifest_holds(d, m) for d, m in ((a, ma), (b, mb))
            )
        elif name == "report.json":
            same = normalised_report(ra) == normalised_report(rb)
        elif name == "mia.json":
            same = normalised_mia(json.loads(da)) == normalised_mia(json.loads(db))
        elif name.endswith((".md", ".html")):
            ta = BACKEND_LINE.sub("", da.decode("utf-8"))
            for x, y in swaps:
                ta = ta.replace(x, y)
                if name.endswith(".html"):
                    ta = ta.replace(html_escape(x), html_escape(y))
            same = ta == BACKEND_LINE.sub("", db.decode("utf-8"))
        else:
            same = da == db
        if not same:
            problems.append(f"{name}: {pa} and {pb} differ")
    for p in problems:
        print(f"same_report: {p}", file=sys.stderr)
    if not problems:
        print(f"same_report: {a} and {b} agree ({len(names_a)} files; command, device, backend and elapsed time aside)")
    return 1 if problems else 0


def manifest_holds(folder, manifest):
    for f in manifest["files"]:
        data = open(os.path.join(folder, f["name"]), "rb").read()
        if hashlib.sha256(data).hexdigest() != f["sha256"] or len(data) != f["bytes"]:
            print(f"same_report: {folder}/.dpaudit-manifest.json: wrong hash for {f['name']}", file=sys.stderr)
            return False
    return True


def html_escape(s):
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;").replace('"', "&quot;")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2]))
