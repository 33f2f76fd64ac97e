#!/usr/bin/env python3
"""Re-runs the hostile-input cases of issue 29 ("trust at the edges") against a built dpaudit
binary and prints a summary table: case, area, command, expected, got, PASS/FAIL.

Outside CI (some cases train a model or run the MNIST checkpoint: a few CPU-minutes in all).
Standard library only.

    scripts/campaign.py                              # uses target/release/dpaudit
    DPAUDIT_BIN=path/to/dpaudit scripts/campaign.py
    scripts/campaign.py --markdown                   # the table as Markdown (docs/reliability.md)
    scripts/campaign.py --only leak,crash            # only some areas

Every case runs from the repository root in its own temporary folder, under `ulimit -v`
(4 GiB: an allocation sized from input aborts instead of swapping) and a time limit. Exit code:
0 when every case passes, 1 otherwise.
"""

import argparse
import json
import os
import re
import shlex
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(os.environ.get("DPAUDIT_BIN", ROOT / "target/release/dpaudit")).resolve()
ULIMIT_KB = 4 * 1024 * 1024


class Result:
    def __init__(self, code, out, err, secs):
        self.code, self.out, self.err, self.secs = code, out, err, secs

    def __repr__(self):
        return f"exit {self.code}"


def run(args, cwd=None, env=None, timeout=120, prefix="", stdin=None):
    """Runs dpaudit with `args` (strings or paths) under ulimit -v; returns a Result."""
    cmd = " ".join(shlex.quote(str(a)) for a in [BIN, *args])
    script = f"ulimit -v {ULIMIT_KB}; {prefix} exec {cmd}"
    e = dict(os.environ)
    e.update(env or {})
    t = time.time()
    try:
        p = subprocess.run(
            ["sh", "-c", script],
            cwd=cwd or ROOT,
            env=e,
            capture_output=True,
            timeout=timeout,
            stdin=stdin,
        )
        code, out, err = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as x:
        code, out, err = "timeout", x.stdout or b"", x.stderr or b""
    return Result(code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace"), time.time() - t)


def crashed(r):
    """A panic (101), an abort (134, SIGABRT) or a kill by a signal, or a timeout."""
    return r.code in (101, 134, "timeout") or (isinstance(r.code, int) and r.code < 0) or "panicked" in r.err


def got(r, extra=""):
    first = (r.err.strip().splitlines() or r.out.strip().splitlines() or [""])[0]
    first = re.sub(r"/tmp/[^ :`']*/", "…/", first)
    s = f"exit {r.code}"
    if extra:
        s += f"; {extra}"
    if first:
        s += f": {first[:110]}"
    return s


CASES = []


def case(area, name, expected):
    def deco(f):
        CASES.append((area, name, expected, f))
        return f

    return deco


def fixture(rel):
    return (ROOT / rel).read_text()


def write(d, name, text):
    p = Path(d) / name
    p.write_text(text)
    return p


def event_toml(inner, delta="1e-5"):
    return f'schema_version = 1\nneighbouring = "add_remove"\ndelta = {delta}\n{inner}'


def eps_from(text, acc=None):
    """ε of the headline (or of one accountant) in `account`/`check` text output."""
    if acc:
        m = re.search(rf"^\s*{acc}\s+ε = (\S+)", text, re.M)
    else:
        m = re.search(r"Headline[^ε]*ε = (\S+)", text)
    return m.group(1) if m else None


# ------------------------------------------------------------------------------------------
# 1. Degenerate mechanisms are never certified (teammate area: degenerate σ).

for sigma in ["1e-160", "5e-324", "0"]:

    def _f(d, sigma=sigma):
        a = ["check", "--noise-multiplier", sigma, "--sample-rate", "0.01", "--steps", "10",
             "--delta", "1e-5", "--max-epsilon", "1"]
        r = run(a, cwd=d)
        return a, r, (r.code in (1, 2) and not crashed(r)), got(r)

    case("degenerate", f"check σ = {sigma}", "exit 1 (FAIL, ε = ∞) or 2")(_f)


@case("degenerate", "check: event file with σ = 1e-160", "exit 1 or 2")
def _(d):
    p = write(d, "ev.toml", event_toml('[event]\ntype = "self_composed"\ncount = 10\n[event.event]\n'
                                       'type = "poisson_sampled"\nq = 0.01\n[event.event.event]\n'
                                       'type = "gaussian"\nnoise_multiplier = 1e-160\n'))
    a = ["check", p, "--max-epsilon", "1"]
    r = run(a, cwd=d)
    return a, r, r.code in (1, 2) and not crashed(r), got(r)


@case("degenerate", "verify DP-RDM claim with σ = 5e-324", "not `holds`")
def _(d):
    src = ('schema_version = 1\ntitle = "t"\n[[dp_rdm]]\nid = "x"\nsource = "s"\ndataset = "CIFAR-10"\n'
           'n = 50000\nqueries = 1\nq = 0.01\nsigma = 5e-324\nk = 13\nlambda = 1.0\nepsilon = 10\ndelta = 2e-05\n')
    p = write(d, "c.toml", src)
    a = ["verify", p]
    r = run(a, cwd=d)
    m = re.search(r"summary: (\d+) hold", r.out)
    holds = int(m.group(1)) if m else None
    ok = not crashed(r) and (r.code == 2 or holds == 0)
    return a, r, ok, got(r, f"{holds} hold")


@case("degenerate", "account: 2^65 GDP steps (nested counts)",
      "2^65 refused naming event.event.count and 2^64 − 1 (never saturated); 3·2^62 accounted, ε ≈ 3× that of 2^62")
def _(d):
    # TOML integers stop at 2^63 − 1, so 2^65 steps are 8 × 2^62; 3 × 2^62 is below 2^64 − 1.
    def ev(outer):
        return event_toml(f'[event]\ntype = "self_composed"\ncount = {outer}\n[event.event]\ntype = "self_composed"\n'
                          'count = 4611686018427387904\n[event.event.event]\ntype = "gaussian"\nnoise_multiplier = 1.0\n')
    a = ["account", "--event", write(d, "ev8.toml", ev(8)), "--accountant", "gdp"]
    r = run(a, cwd=d)
    r3 = run(["account", "--event", write(d, "ev3.toml", ev(3)), "--accountant", "gdp"], cwd=d)
    r1 = run(["account", "--event", write(d, "ev1.toml", ev(1)), "--accountant", "gdp"], cwd=d)
    e3, e1 = eps_from(r3.out, "gdp"), eps_from(r1.out, "gdp")
    # GDP with μ = √T: ε ≈ μ²/2 for huge μ, so three times the steps give about three times ε.
    ratio = float(e3) / float(e1) if e3 and e1 else None
    refused = r.code == 2 and "event.event.count" in r.err and "2^64 − 1" in r.err
    ok = not crashed(r) and refused and ratio is not None and 2.9 < ratio < 3.1
    return a, r, ok, got(r, f"ε(3·2^62) / ε(2^62) = {ratio}")


@case("degenerate", "run dp-rdm with σ = 1e-160", "exit 2, ε spent = ∞, or no query answered")
def _(d):
    src = fixture("fixtures/runs/dp-rdm-digits.toml").replace("sigma = 0.25", "sigma = 1e-160")
    src = src.replace('"../embeddings/', f'"{ROOT}/fixtures/embeddings/')
    p = write(d, "run.toml", src)
    a = ["run", "dp-rdm", p, "--out", Path(d) / "out"]
    r = run(a, cwd=d)
    led = Path(d) / "out" / "ledger.toml"
    spent = re.search(r"epsilon of this run = (\S+)", led.read_text()) if led.exists() else None
    none = bool(led.exists() and re.search(r"answered = 0,", led.read_text()))
    ok = not crashed(r) and (r.code == 2 or none or bool(spent and spent.group(1).startswith(("inf", "∞"))))
    return a, r, ok, got(r, f"ledger: epsilon of this run = {spent.group(1) if spent else '?'}" + (", 0 answered" if none else ""))


@case("degenerate", "train --dp --noise-multiplier 1e-160 (card ε)", "exit 2, or ε = ∞ in the card")
def _(d):
    out = Path(d) / "m"
    a = ["train", "--dp", "--noise-multiplier", "1e-160", "--steps", "2", "--out", out, "-q"]
    r = run(a, timeout=300)
    card = Path(str(out) + ".toml")
    eps = None
    if card.exists():
        m = re.search(r"^epsilon\s*=\s*(\S+)", card.read_text(), re.M)
        eps = m.group(1) if m else None
    ok = not crashed(r) and (r.code == 2 or (eps is not None and eps.strip('"').lower() in ("inf", "+inf", "∞")))
    return a, r, ok, got(r, f"card ε = {eps}")


# ------------------------------------------------------------------------------------------
# 2. Schedules, calibration, trivially true claims, Laplace (teammate area).

@case("edges", "verify DPAgg-TI claim with δ ≥ m/n (trivially true)", "`holds`")
def _(d):
    src = ('schema_version = 1\ntitle = "t"\n[[dpagg_ti]]\nid = "trivial"\nsource = "s"\n'
           'dataset = "d"\nn = 158\nm = 4\nepsilon = 0.1\ndelta = 0.5\n')
    p = write(d, "c.toml", src)
    a = ["verify", p]
    r = run(a, cwd=d)
    ok = not crashed(r) and r.code == 0 and re.search(r"verdict: holds\b", r.out) is not None
    return a, r, ok, got(r)


@case("edges", "account: a `laplace` leaf", "accounted (exit 0)")
def _(d):
    p = write(d, "ev.toml", event_toml('[event]\ntype = "laplace"\nnoise_multiplier = 1.0\n'))
    a = ["account", "--event", p]
    r = run(a, cwd=d)
    return a, r, r.code == 0, got(r)


def ddpm_levels(timesteps, T=1000, b0=1e-4, b1=0.02):
    """Noise levels t = √((1 − ᾱ_k)/ᾱ_k) at diffusers timesteps k (β linear, computed here)."""
    abar, acc = [], 1.0
    for i in range(T):
        acc *= 1.0 - (b0 + i * (b1 - b0) / (T - 1))
        abar.append(acc)
    return [((1.0 - abar[k]) / abar[k]) ** 0.5 for k in timesteps]


for spacing in ["trailing", "linspace"]:

    def _f(d, spacing=spacing):
        # A row with ties of diffusers' own set_timesteps (fixtures/reference, diffusers 0.42.1).
        rows = [l.split(",") for l in (ROOT / "fixtures/reference/diffusers_timesteps.csv").read_text().splitlines()
                if not l.startswith(("#", "T,"))]
        row = next(r for r in rows if r[0] == "1000" and r[1] == spacing and r[2] == "0" and int(r[5]) > 0
                   and r[9] and int(r[4]) == int(r[3]) and 8 <= int(r[3]) <= 40
                   and all(0 <= int(k) < 1000 for k in r[9].split()))
        steps, want = int(row[3]), ddpm_levels([int(k) for k in row[9].split()])
        src = fixture("fixtures/samplers/ddpm-linear-ddim50.toml").replace('spacing = "leading"', f'spacing = "{spacing}"')
        src = src.replace("levels = 50", f"levels = {steps}").replace("stop_at = 0.05\n", "")
        a = ["analyze", write(d, "s.toml", src), "--format", "json"]
        r = run(a, cwd=d)
        try:
            t = next(t for t in json.loads(r.out)["tables"] if t["id"] == "steps")
            names = [c["name"] for c in t["columns"]]
            # The steps go from each level to the next: every t_from, then the last t_to.
            have = [x[names.index("t_from")] for x in t["rows"]] + [t["rows"][-1][names.index("t_to")]]
        except (ValueError, KeyError, StopIteration, IndexError):
            have = []
        worst = max((abs(h - w) / w for h, w in zip(have, want)), default=None)
        ok = r.code == 0 and len(have) == len(want) and worst is not None and worst < 1e-5
        return a, r, ok, got(r, f"{steps} steps, {len(have)} levels, largest relative difference {worst}")

    case("edges", f"DDIM {spacing} timesteps equal diffusers' set_timesteps (ties half to even)",
         "analyze's noise levels = the levels at diffusers' timesteps")(_f)


# ------------------------------------------------------------------------------------------
# 3. Secret noise (teammate area: outputs).

for mech, cfgname, drop in [("dpagg-ti", "dpagg-ti-digits.toml", "seed = 20240617"),
                            ("dp-rdm", "dp-rdm-digits.toml", "seed = 7")]:

    def _f(d, mech=mech, cfgname=cfgname, drop=drop):
        src = fixture(f"fixtures/runs/{cfgname}").replace(drop, "")
        src = src.replace('"../embeddings/', f'"{ROOT}/fixtures/embeddings/')
        p = write(d, "run.toml", src)
        outs = []
        for i in range(2):
            a = ["run", mech, p, "--out", Path(d) / f"o{i}"]
            r = run(a, cwd=d)
            f = Path(d) / f"o{i}" / "outputs.csv"
            outs.append(f.read_bytes() if f.exists() else None)
        ok = not crashed(r) and outs[0] is not None and outs[0] != outs[1]
        return a, r, ok, got(r, "two unseeded runs " + ("differ" if ok else "are identical or missing"))

    case("secret-noise", f"two unseeded `run {mech}` release different noise", "outputs differ")(_f)


@case("secret-noise", "seeded run's ledger says the seed makes it non-private", "warning in ledger.toml")
def _(d):
    src = fixture("fixtures/runs/dpagg-ti-digits.toml").replace('"../embeddings/', f'"{ROOT}/fixtures/embeddings/')
    p = write(d, "run.toml", src)
    a = ["run", "dpagg-ti", p, "--out", Path(d) / "o", "--seed", "7"]
    r = run(a, cwd=d)
    led = Path(d) / "o" / "ledger.toml"
    ok = led.exists() and "knows the seed" in led.read_text()
    return a, r, ok, got(r)


# ------------------------------------------------------------------------------------------
# 4. Transactional outputs (teammate area: outputs).

@case("outputs", "--save-event onto an existing file without --force", "exit 2, file unchanged")
def _(d):
    p = write(d, "keep.toml", "precious\n")
    a = ["account", "--noise-multiplier", "1", "--steps", "10", "--delta", "1e-5", "--save-event", p]
    r = run(a, cwd=d)
    return a, r, r.code == 2 and p.read_text() == "precious\n", got(r)


@case("outputs", "--junit onto the input file", "exit 2, input unchanged")
def _(d):
    src = fixture("fixtures/events/dpsgd.toml")
    p = write(d, "ev.toml", src)
    a = ["check", p, "--max-epsilon", "10", "--junit", p]
    r = run(a, cwd=d)
    return a, r, r.code == 2 and p.read_text() == src, got(r)


@case("outputs", "report -o onto a device node with --force", "node kept (written into or refused)")
def _(d):
    node = Path(d) / "nul"
    try:
        os.mknod(node, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except (PermissionError, OSError):
        os.mkfifo(node)
    a = ["report", ROOT / "reports/check-dpsgd-mnist/report.json", "--format", "md", "-o", node, "--force"]
    r = run(a, cwd=d, timeout=20)
    kept = not stat.S_ISREG(os.lstat(node).st_mode)
    return a, r, r.code in (0, 2) and kept, got(r, "node kept" if kept else "node REPLACED by a regular file")


def torn(out):
    """Whether the set in `out` mixes two runs: a visible file not the one its manifest names."""
    import hashlib
    m = out / ".dpaudit-manifest.json"
    if not m.exists():
        return False
    for f in json.loads(m.read_text())["files"]:
        p = out / f["name"]
        if p.exists() and hashlib.sha256(p.read_bytes()).hexdigest() != f["sha256"]:
            return True
    return False


@case("outputs", "SIGKILL during `run dpagg-ti --force`: a torn set is refused, no debris, next run succeeds",
      "every torn set refused by dpaudit (exit 2); no .dpaudit-tmp-*")
def _(d):
    src = fixture("fixtures/runs/dpagg-ti-digits.toml").replace('"../embeddings/', f'"{ROOT}/fixtures/embeddings/')
    p = write(d, "run.toml", src)
    out = Path(d) / "o"
    a = ["run", "dpagg-ti", p, "--out", out, "--force"]
    cmd = [str(BIN), *map(str, a)]
    n_torn, accepted = 0, []
    run(a, cwd=d)
    # Kills timed at random, and injected just before each rename of the set's commit (a kill
    # between two renames is where a torn set can appear).
    attempts = [("kill", x) for x in (0.02, 0.05, 0.1, 0.2)] + [("fault", n) for n in range(1, 9)]
    for how, x in attempts:
        if how == "kill":
            pr = subprocess.Popen(cmd, cwd=d, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            time.sleep(x)
            pr.send_signal(signal.SIGKILL)
            pr.wait()
        else:
            run(a, cwd=d, env={"DPAUDIT_FAULT_AT": str(x)})
        if torn(out):
            n_torn += 1
            rr = run(["report", out / "report.json", "--format", "md"], cwd=d)
            if rr.code != 2:
                accepted.append(f"{how} {x}")
    r = run(a, cwd=d)
    debris = [x.name for x in out.glob(".dpaudit-tmp-*")] if out.exists() else []
    ok = r.code == 0 and not debris and not accepted and not torn(out) and n_torn > 0
    return a, r, ok, got(r, f"{n_torn} torn sets, accepted: {accepted or 'none'}; " + (f"debris {debris}" if debris else "no debris"))


# ------------------------------------------------------------------------------------------
# 5. Re-derive, don't trust (teammate area: outputs).

@case("re-derive", "report: verdict `pass` for ε = 99 > budget 1 in the JSON", "exit 2 or FAIL rendered")
def _(d):
    j = json.loads((ROOT / "reports/check-dpsgd-mnist/report.json").read_text())
    for v in j.get("verdicts", []):
        v["epsilon"] = 99.0
        v["budget"] = 1.0
        v["status"] = "pass"
    p = write(d, "r.json", json.dumps(j))
    a = ["report", p, "--format", "md"]
    r = run(a, cwd=d)
    ok = r.code == 2 or ("**pass**" not in r.out.lower() and "fail" in r.out.lower())
    return a, r, ok, got(r)


# ------------------------------------------------------------------------------------------
# 6. No leaks (this branch).

for target in ["/etc/passwd", "/etc/hostname", "/proc/self/environ"]:

    def _f(d, target=target):
        src = fixture("fixtures/samplers/digits-trajectories.toml").replace("../data/digits.csv.gz", target)
        p = write(d, "leak.toml", src)
        a = ["analyze", p]
        r = run(a, cwd=d)
        try:
            text = Path(target).read_bytes().decode("utf-8", "replace")
        except OSError:
            return a, r, None, "skipped: unreadable"
        pieces = [x.strip() for x in re.split(r"[\n\0]", text) if len(x.strip()) >= 2]
        leaked = [x for x in pieces if x in r.err]
        return a, r, r.code == 2 and not leaked, got(r, f"{len(leaked)} lines quoted")

    case("leak", f"data path → {target}", "exit 2, no line of the file quoted")(_f)


@case("leak", "<script> / =FORMULA in claim fields → md, html, csv", "escaped")
def _(d):
    src = (fixture("fixtures/claims/dpagg-ti.toml")
           .replace('id = "eve-m4-eps0.1"', 'id = "<script>alert(1)</script>"', 1)
           .replace('dataset = "@eveismyname"', 'dataset = "=HYPERLINK(1)"', 1))
    p = write(d, "c.toml", src)
    out = Path(d) / "o"
    a = ["verify", p, "--out", out]
    r = run(a, cwd=d)
    bad = []
    md = (out / "report.md").read_text() if (out / "report.md").exists() else ""
    html = (out / "report.html").read_text() if (out / "report.html").exists() else ""
    if "<script" in md:
        bad.append("md")
    if "<script" in html:
        bad.append("html")
    for f in out.glob("*.csv") if out.exists() else []:
        if re.search(r"(^|,)\"?[=+@]", f.read_text(), re.M):
            bad.append(f.name)
    ok = md != "" and not bad
    return a, r, ok, got(r, f"raw in {bad}" if bad else "escaped")


@case("leak", "report files under umask 022", "mode 0644")
def _(d):
    out = Path(d) / "o"
    a = ["check", ROOT / "fixtures/events/dpsgd.toml", "--max-epsilon", "10", "--out", out]
    r = run(a, cwd=d, prefix="umask 022;")
    modes = {oct(f.stat().st_mode & 0o777) for f in out.iterdir()} if out.exists() else set()
    return a, r, modes == {"0o644"}, got(r, f"modes {sorted(modes)}")


# ------------------------------------------------------------------------------------------
# 7. No crash, no abort, no unbounded work (this branch).

for eps in ["1e300", "1e7"]:

    def _f(d, eps=eps):
        p = write(d, "ed.toml", event_toml('[event]\ntype = "self_composed"\ncount = 10\n[event.event]\n'
                                           f'type = "epsilon_delta"\nepsilon = {eps}\ndelta = 1e-7\n'))
        a = ["account", "--event", p]
        r = run(a, cwd=d)
        return a, r, r.code == 0 and not crashed(r), got(r, f"pld ε = {eps_from(r.out, 'pld')}")

    case("crash", f"(ε, δ) leaf with ε = {eps}", "exit 0, no panic/abort")(_f)


@case("crash", "non-UTF-8 file name", "exit 0, no panic")
def _(d):
    name = os.fsencode(d) + b"/ev\xff.toml"
    with open(name, "wb") as f:
        f.write((ROOT / "fixtures/events/dpsgd.toml").read_bytes())
    t = time.time()
    p = subprocess.run([str(BIN).encode(), b"check", name, b"--max-epsilon", b"10"], cwd=d, capture_output=True)
    r = Result(p.returncode, p.stdout.decode(), p.stderr.decode("utf-8", "replace"), time.time() - t)
    return ["check", "…/ev\\xff.toml", "--max-epsilon", "10"], r, r.code == 0 and not crashed(r), got(r)


@case("crash", "stdout on /dev/full", "exit 2, message")
def _(d):
    a = ["account", "--event", ROOT / "fixtures/events/dpsgd.toml"]
    r = run(a, cwd=d, prefix="exec >/dev/full;")
    return a, r, r.code == 2 and not crashed(r), got(r)


@case("crash", "stderr on /dev/full (input error)", "exit 2")
def _(d):
    a = ["account", "--event", "missing.toml"]
    r = run(a, cwd=d, prefix="exec 2>/dev/full;")
    return a, r, r.code == 2, got(r)


@case("crash", "RAYON_NUM_THREADS=5000", "exit 0, thread count lowered")
def _(d):
    a = ["account", "--event", ROOT / "fixtures/events/dpsgd.toml"]
    r = run(a, cwd=d, env={"RAYON_NUM_THREADS": "5000"})
    return a, r, r.code == 0 and not crashed(r), got(r)


def png_declaring(w, h):
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"")) + chunk(b"IEND", b""))


@case("crash", "PNG folder bomb (header declares 60000×60000)", "exit 2 at a stated limit")
def _(d):
    f = Path(d) / "pngs"
    f.mkdir()
    (f / "a.png").write_bytes(png_declaring(60000, 60000))
    a = ["mia", "--checkpoint", "models/mnist-ddpm", "--data", f, "--split", "fixtures/splits/mnist.toml"]
    r = run(a)
    return a, r, r.code == 2 and "limit" in r.err, got(r)


def many_leaves(n):
    s = ['schema_version = 1\ndelta = 1e-5\n[event]\ntype = "composed"\nevents = [\n']
    s += [f'{{type="gaussian",noise_multiplier={1.0 + i * 1e-6!r}}},\n' for i in range(n)]
    s.append("]\n")
    return "".join(s)


@case("unbounded", "10⁶-leaf composed event", "exit 2 at a stated limit (file size)")
def _(d):
    p = write(d, "ev.toml", many_leaves(1_000_000))
    a = ["account", "--event", p]
    r = run(a, cwd=d)
    return a, r, r.code == 2 and "limit" in r.err, got(r)


@case("unbounded", "20,000 distinct leaves with the PLD", "PLD refused at its limit, others answer")
def _(d):
    p = write(d, "ev.toml", many_leaves(20_000))
    a = ["account", "--event", p]
    r = run(a, cwd=d)
    return a, r, r.code == 0 and "distinct PLD leaves" in r.out, got(r)


@case("unbounded", "train --steps 1e18", "exit 2 naming --steps and the limit")
def _(d):
    a = ["train", "--steps", "1000000000000000000", "--out", Path(d) / "m"]
    r = run(a, cwd=d)
    return a, r, r.code == 2 and "--steps" in r.err and "limit" in r.err, got(r)


@case("unbounded", "mia --noise-draws 1e9", "exit 2 naming --noise-draws and the limit")
def _(d):
    a = ["mia", "--checkpoint", "models/mnist-ddpm", "--data", "fixtures/data/mnist/mnist-10k.u8.gz",
         "--split", "fixtures/splits/mnist.toml", "--noise-draws", "1000000000"]
    r = run(a)
    return a, r, r.code == 2 and "--noise-draws" in r.err and "limit" in r.err, got(r)


@case("unbounded", "10⁵-point PLD sweep", "exit 2 naming --points and the limit")
def _(d):
    a = ["sweep", "fixtures/samplers/edm-cifar10-subsampled.toml", "--sigma-min", "0.002..5",
         "--points", "100000", "--accountant", "pld"]
    r = run(a)
    return a, r, r.code == 2 and "--points" in r.err and "limit" in r.err, got(r)


@case("unbounded", "10⁵ claims", "exit 2 naming claims and the limit")
def _(d):
    s = ['schema_version = 1\ntitle = "many"\n']
    s += [f'[[dpagg_ti]]\nid = "c{i}"\nsource = "s"\ndataset = "d"\nn = 158\nm = 4\nepsilon = 1.0\ndelta = 0.006\n'
          for i in range(100_000)]
    p = write(d, "c.toml", "".join(s))
    a = ["verify", p]
    r = run(a, cwd=d)
    return a, r, r.code == 2 and "claims" in r.err and "limit" in r.err, got(r)


# ------------------------------------------------------------------------------------------
# 8. Trust at the edges (issue 48).

MNIST = ["--data", "fixtures/data/mnist/mnist-10k.u8.gz"]


@case("trust", "mia --ledger of other weights", "exit 2 naming --ledger: the ledger of other weights")
def _(d):
    a = ["mia", "--checkpoint", "models/mnist-ddpm", *MNIST, "--split", "fixtures/splits/mnist.toml",
         "--attack", "loss", "--timesteps", "50", "--max-examples", "8", "--bootstrap", "20",
         "--ledger", "models/mnist-dp-ddpm/dpaudit-ledger.toml", "--out", Path(d) / "o"]
    r = run(a)
    return a, r, r.code == 2 and "--ledger" in r.err and "other weights" in r.err, got(r)


@case("trust", "merge of parts whose ε was scaled by 0.1", "exit 0 with the ledger's ε, not the parts'")
def _(d):
    parts = Path(d) / "p"
    for i in range(2):
        run(["mia", "--checkpoint", "models/mnist-dp-ddpm", *MNIST, "--split", "fixtures/splits/mnist-dp.toml",
             "--attack", "loss", "--timesteps", "50", "--max-examples", "8", "--bootstrap", "20",
             "--shard", f"{i}/2", "--out", parts, "-q"])
    truth = run(["merge", *sorted(parts.glob("*.json")), "--format", "json"])
    for f in parts.glob("*.json"):
        v = json.loads(f.read_text())
        for g in v["plan"]["diffusers"]["basis"]["guarantees"]:
            g["epsilon"] *= 0.1
        f.write_text(json.dumps(v))
    a = ["merge", *sorted(parts.glob("*.json")), "--format", "json"]
    r = run(a)
    same = r.code == 0 and json.loads(r.out)["results"] == json.loads(truth.out)["results"]
    return a, r, same, got(r, "results equal the unedited merge" if same else "results differ")


@case("trust", "--scores-out of a =HYPERLINK(…) record id", "the id written as text ('=…)")
def _(d):
    rows = "record_id,member,attack,t,score\n" + "".join(
        f"{'=HYPERLINK(1)' if i == 0 else i},{int(i < 4)},loss,10,{i}\n" for i in range(8))
    p = write(d, "s.csv", rows)
    out = Path(d) / "out.csv"
    a = ["mia", "--scores", p, "--bootstrap", "20", "--scores-out", out, "-q"]
    r = run(a)
    text = out.read_text() if out.exists() else ""
    return a, r, r.code == 0 and "\n'=HYPERLINK(1)," in text, got(r)


@case("trust", "train --unet --checkpoint-every 1 --force with OUT/checkpoint a symlink", "exit 2, target untouched")
def _(d):
    target = Path(d) / "elsewhere"
    target.mkdir()
    (target / "config.json").write_text("keep")
    out = Path(d) / "run"
    out.mkdir()
    os.symlink(target, out / "checkpoint")
    a = ["train", "--unet", "tiny", "--steps", "2", "--batch-size", "4", "--seed", "1", "--checkpoint-every", "1",
         "--force", "--out", out]
    r = run(a)
    ok = r.code == 2 and "symbolic link" in r.err and (target / "config.json").read_text() == "keep"
    return a, r, ok, got(r)


@case("trust", "check --junit /dev/stdout, stdout a file", "exit 0, XML in the file, /dev/stdout still a link")
def _(d):
    cap = Path(d) / "out.txt"
    a = ["check", "fixtures/events/edm-fullbatch-sigmamin0.002.toml", "--max-epsilon", "1e9", "--junit", "/dev/stdout"]
    with open(cap, "wb") as f:
        cmd = " ".join(shlex.quote(str(x)) for x in [BIN, *a])
        p = subprocess.run(["sh", "-c", f"exec {cmd}"], cwd=ROOT, stdout=f, stderr=subprocess.PIPE)
    r = Result(p.returncode, "", p.stderr.decode("utf-8", "replace"), 0)
    ok = r.code == 0 and os.path.islink("/dev/stdout") and "<testsuites" in cap.read_text()
    return a, r, ok, got(r)


@case("trust", "completions bash > /dev/full", "exit 2 naming stdout, no panic")
def _(d):
    a = ["completions", "bash"]
    r = run(a, prefix="exec >/dev/full;")
    return a, r, r.code == 2 and not crashed(r), got(r)


@case("trust", "--unet config with layers_per_block = 10⁴", "exit 2 naming layers_per_block, at once")
def _(d):
    src = ROOT / "fixtures/diffusers/unet-28-c1-attn"
    dst = Path(d) / "deep"
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((dst / "config.json").read_text())
    cfg["layers_per_block"] = 10_000
    (dst / "config.json").write_text(json.dumps(cfg))
    a = ["model", "info", dst]
    r = run(a, timeout=30)
    return a, r, r.code == 2 and "layers_per_block" in r.err, got(r)


@case("trust", "train --canaries 1e9", "exit 2 naming --canaries and the limit")
def _(d):
    a = ["train", "--dp", "--noise-multiplier", "1", "--sample-rate", "0.1", "--steps", "1",
         "--canaries", "1000000000", "--out", Path(d) / "m"]
    r = run(a)
    return a, r, r.code == 2 and "--canaries" in r.err and "limit" in r.err, got(r)


@case("trust", "inf score in --scores", "exit 2 naming the line and field score")
def _(d):
    rows = "record_id,member,attack,t,score\n" + "".join(
        f"{i},{int(i < 4)},loss,10,{'inf' if i == 2 else i}\n" for i in range(8))
    p = write(d, "s.csv", rows)
    a = ["mia", "--scores", p, "--bootstrap", "20"]
    r = run(a)
    return a, r, r.code == 2 and ":4: field `score`" in r.err, got(r)


@case("trust", "verify rapid-scenarios: theorem_1", "no `violated` under theorem_1 (upper bounds only)")
def _(d):
    a = ["verify", "fixtures/claims/rapid-scenarios.toml", "--format", "csv"]
    r = run(a, timeout=600)
    rows = [l for l in r.out.splitlines() if ",theorem_1," in l]
    ok = bool(rows) and not any("violated" in l.split(",")[-1] or ",lower_bound," in l for l in rows)
    return a, r, ok, got(r, f"{len(rows)} theorem_1 rows")


class _Cpu:
    def __init__(self, result, secs):
        self.result, self.secs = result, secs


def cpu_of(f):
    """Runs `f` (one dpaudit run) and measures its CPU time (user + system of the children), so a
    loaded machine does not fail a timing case."""
    import resource
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = f()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return _Cpu(r, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime))


@case("trust", "verify diffusion-sampling: the model named", "every violated and the conclusion name the per-step Gaussian model")
def _(d):
    a = ["verify", "fixtures/claims/diffusion-sampling.toml", "--format", "json"]
    r = run(a, timeout=900)
    try:
        j = json.loads(r.out)
    except ValueError:
        j = {}
    fails = [v for v in j.get("verdicts", []) if v["status"] == "fail"]
    model = "under the per-step Gaussian model of §3"
    labelled = all(model in v["message"] for v in fails)
    concl = j.get("conclusion", {}).get("verdict", "")
    ok = r.code == 1 and fails and labelled and f"{len(fails)} of the FAIL verdicts are verdicts about a stated model" in concl
    return a, r, ok, got(r, f"{len(fails)} violated, all labelled: {labelled}")


@case("trust", "gzip bomb of MNIST records (800 MB of zeros), DPAUDIT_MAX_MEMORY=256M", "exit 2 at the image limit, < 700 MB address space")
def _(d):
    import gzip
    p = Path(d) / "bomb.u8.gz"
    with gzip.open(p, "wb", compresslevel=1) as f:
        z = bytes(1 << 20)
        for _ in range(800):
            f.write(z)
    a = ["mia", "--checkpoint", "models/mnist-ddpm", "--data", p, "--split", "fixtures/splits/mnist.toml", "-q"]
    r = run(a, env={"DPAUDIT_MAX_MEMORY": "256M"}, prefix="ulimit -v 716800;")
    ok = r.code == 2 and "images (pixel values)" in r.err and "decompressed" in r.err and "limit" in r.err
    return a, r, ok, got(r)


for args, flag in [(["train", "--steps", "-1"], "--steps"),
                   (["mia", "--checkpoint", "models/digits-mlp.toml", "--timesteps", "-5"], "--timesteps"),
                   (["sweep", "fixtures/samplers/edm-cifar10-paper.toml", "--sigma-min", "0.002..5", "--points", "-1"], "--points")]:

    def _f(d, args=args, flag=flag):
        r = run(args)
        return args, r, r.code == 2 and flag in r.err and "unexpected argument" not in r.err, got(r)

    case("trust", f"a negative number for {flag}", f"exit 2 naming {flag} (not clap's 'unexpected argument')")(_f)


@case("trust", "train --unet with a non-UTF-8 config path", "exit 0, the folder written")
def _(d):
    odd = Path(os.fsdecode(os.fsencode(d) + b"/cfg-\xff"))
    odd.mkdir()
    (odd / "config.json").write_bytes((ROOT / "fixtures/diffusers/unet-28-c1-attn/config.json").read_bytes())
    out = Path(d) / "out"
    a = ["train", "--unet", odd, "--steps", "1", "--seed", "1", "-q", "--out", out]
    r = run(a, timeout=300)
    return a, r, r.code == 0 and (out / "diffusion_pytorch_model.safetensors").is_file(), got(r)


@case("trust", "train --unet with a config whose in_channels is 3 on MNIST", "exit 2 naming config.json and in_channels")
def _(d):
    cfg = json.loads((ROOT / "fixtures/diffusers/unet-28-c1-attn/config.json").read_text())
    cfg["in_channels"] = cfg["out_channels"] = 3
    p = write(d, "config.json", json.dumps(cfg))
    a = ["train", "--unet", p, "--steps", "1", "-q", "--out", Path(d) / "o"]
    r = run(a)
    return a, r, r.code == 2 and "config.json: field `in_channels`" in r.err, got(r)


@case("trust", "model eval on a NaN pixel", "exit 2 naming the element")
def _(d):
    import struct
    def npy(path, descr, shape, data):
        h = f"{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}"
        h += " " * ((64 - (10 + len(h) + 1) % 64) % 64) + "\n"
        Path(path).write_bytes(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(h)) + h.encode() + data)
    x, t = Path(d) / "x.npy", Path(d) / "t.npy"
    vals = [0.0] * 784
    vals[100] = float("nan")
    npy(x, "<f4", "(1, 1, 28, 28)", struct.pack("<784f", *vals))
    npy(t, "<i8", "(1,)", struct.pack("<q", 10))
    a = ["model", "eval", "--checkpoint", "models/mnist-ddpm", "--input", x, "--timesteps", t, "--out", Path(d) / "y.npy"]
    r = run(a)
    return a, r, r.code == 2 and "NaN" in r.err, got(r)


@case("trust", "mia --ledger with δ = 1", "exit 2 naming delta (as account does)")
def _(d):
    p = write(d, "l.toml", event_toml('[event]\ntype = "gaussian"\nnoise_multiplier = 1.0\n', delta="1.0"))
    a = ["mia", "--checkpoint", "models/mnist-ddpm", *MNIST, "--split", "fixtures/splits/mnist.toml", "--ledger", p,
         "--attack", "loss", "--timesteps", "50", "--max-examples", "4", "-q"]
    r = run(a)
    r2 = run(["account", "--event", p])
    return a, r, r.code == 2 and "delta" in r.err and r2.code == 2, got(r)


@case("trust", "run dpagg-ti on embeddings of ±1e308", "exit 0, the release of the same rows at ±1")
def _(d):
    outs = []
    for name, scale in [("big", "1e308"), ("one", "1")]:
        rows = "".join(",".join(("-" if (i * 7 + j * 3) % 5 < 2 else "") + scale for j in range(16)) + "\n" for i in range(40))
        write(d, f"{name}.csv", rows)
        p = write(d, f"{name}.toml", f'schema_version = 1\nembeddings = "{name}.csv"\nm = 16\nepsilon = 1.0\n'
                  'sigma_rule = "classic"\nreleases = 2\n')
        a = ["run", "dpagg-ti", p, "--seed", "7", "--out", Path(d) / f"o-{name}", "-q"]
        r = run(a, cwd=d)
        f = Path(d) / f"o-{name}" / "outputs.csv"
        outs.append(f.read_text() if f.exists() else None)
    return a, r, r.code == 0 and outs[0] is not None and outs[0] == outs[1], got(r, "same release" if outs[0] == outs[1] else "releases differ")


@case("trust", "analyze a full-batch sampler with 10⁵ levels", "exit 0 in a few seconds (was O(n²): ≈ 10 s)")
def _(d):
    p = write(d, "s.toml", fixture("fixtures/samplers/edm-cifar10-paper.toml").replace("levels = 50", "levels = 100000"))
    a = ["analyze", p, "-q"]
    cpu = cpu_of(lambda: run(a, cwd=d))
    r = cpu.result
    return a, r, r.code == 0 and cpu.secs < 5, got(r, f"{cpu.secs:.1f} s of CPU, {r.secs:.1f} s wall")


@case("trust", "calibrate --solve-for steps at σ = 10⁶", "exit 0 in about a second")
def _(d):
    a = ["calibrate", "--solve-for", "steps", "--noise-multiplier", "1e6", "--target-epsilon", "1", "--delta", "1e-5"]
    cpu = cpu_of(lambda: run(a))
    r = cpu.result
    return a, r, r.code == 0 and cpu.secs < 2, got(r, f"{cpu.secs:.1f} s of CPU, {r.secs:.1f} s wall")


@case("trust", "train --unet --checkpoint-every 1 killed at each commit", "OUT/checkpoint always one whole checkpoint")
def _(d):
    import hashlib
    bad = []
    for n in range(1, 6):
        out = Path(d) / f"r{n}"
        a = ["train", "--unet", "tiny", "--dp", "--noise-multiplier", "1", "--sample-rate", "0.05", "--steps", "4",
             "--checkpoint-every", "1", "--seed", "3", "-q", "--out", out]
        r = run(a, env={"DPAUDIT_FAULT_AT": str(n)}, timeout=300)
        ck = out / "checkpoint"
        if not ck.exists():
            if n > 1:
                bad.append(f"{n}: no checkpoint")
            continue
        m = json.loads((ck / ".dpaudit-manifest.json").read_text())
        names = {f["name"] for f in m["files"]}
        if {x.name for x in ck.iterdir() if not x.name.startswith(".")} != names or any(
                hashlib.sha256((ck / f["name"]).read_bytes()).hexdigest() != f["sha256"] for f in m["files"]):
            bad.append(f"{n}: mixed")
    return a, r, not bad, got(r, f"bad: {bad or 'none'}")


# ------------------------------------------------------------------------------------------

def short_cmd(a):
    s = " ".join(shlex.quote(str(x)) for x in a)
    s = s.replace(str(ROOT) + "/", "")
    s = re.sub(r"/tmp/[^ ']*/", "…/", s)
    return "dpaudit " + (s if len(s) < 110 else s[:107] + "…")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    ap.add_argument("--only", default="", help="comma-separated areas")
    args = ap.parse_args()
    if not BIN.exists():
        sys.exit(f"no binary at {BIN}: build with `cargo test --release --no-run` or set DPAUDIT_BIN")
    only = {x for x in args.only.split(",") if x}
    rows = []
    for area, name, expected, f in CASES:
        if only and area not in only:
            continue
        with tempfile.TemporaryDirectory() as d:
            try:
                a, r, ok, g = f(d)
            except Exception as e:  # a broken case is a failure of the case, not of the campaign
                a, r, ok, g = ["?"], Result("error", "", str(e), 0), False, f"campaign error: {e}"
        status = "SKIP" if ok is None else ("PASS" if ok else "FAIL")
        rows.append((area, name, short_cmd(a), expected, g, status))
        if not args.markdown:
            print(f"[{status}] {area}: {name} — {g}", file=sys.stderr)
    if args.markdown:
        print("| area | case | command | expected | got | result |\n|---|---|---|---|---|---|")
        for area, name, cmd, exp, g, st in rows:
            cells = [area, name, f"`{cmd}`", exp, g.replace("|", "\\|"), f"**{st}**"]
            print("| " + " | ".join(c.replace("\n", " ") for c in cells) + " |")
    else:
        w = max(len(r[1]) for r in rows)
        for area, name, cmd, exp, g, st in rows:
            print(f"{st:4}  {area:12}  {name:<{w}}  {cmd}\n      expected: {exp}\n      got:      {g}")
    n_fail = sum(r[5] == "FAIL" for r in rows)
    print(f"\n{len(rows)} cases: {len(rows) - n_fail - sum(r[5] == 'SKIP' for r in rows)} pass, "
          f"{n_fail} fail, {sum(r[5] == 'SKIP' for r in rows)} skipped", file=sys.stderr)
    sys.exit(1 if n_fail else 0)


if __name__ == "__main__":
    main()
