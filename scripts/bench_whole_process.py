#!/usr/bin/env python3
"""Whole-process CPU-time ratios: the `dpaudit` binary against dp_accounting (issue 47, item 1).

Each case is one shell command per tool, run as a child process; its CPU time (user + sys of
the child, from wait4) is what is compared, so a machine loaded by other work slows both
without changing the ratio much. The two tools' runs are interleaved (ours, theirs, ours, ...)
`--repeat` times and the medians are compared. dp_accounting's run includes starting Python and
importing dp_accounting (as a script that answers the same question would); dpaudit's includes
starting the binary, parsing and printing.

Equal answers: for every case, dp_accounting's `value_discretization_interval` is the coarsest
of a ladder (1e-2 … 5e-5) whose answer (ε, or the calibrated σ / q / steps) is within 0.1 % of
dpaudit's; that grid is then timed. A case whose ladder never gets there is reported as such.

Usage (repository root, release binary built; dp-accounting installed in this Python):
    python3 scripts/bench_whole_process.py                 # every case, 3 repeats
    python3 scripts/bench_whole_process.py --repeat 5 pld_1e6 calibrate_sigma
    python3 scripts/bench_whole_process.py --list
Prints a Markdown table (the one in docs/pld.md, "Speed: whole process").
"""

import argparse
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
from importlib.metadata import version

BIN = os.environ.get("DPAUDIT_BIN", "target/release/dpaudit")
DELTA = 1e-5
Q, SIGMA = 0.004, 1.1
LADDER = [1e-2, 5e-3, 2e-3, 1e-3, 5e-4, 2e-4, 1e-4, 5e-5]
MEM_LIMIT = 4 << 30  # address space of each dp_accounting child (bytes)
TIMEOUT = 300

PY_PRELUDE = """
import sys
from dp_accounting import dp_event as E
from dp_accounting.pld import pld_privacy_accountant as P
from dp_accounting.rdp import rdp_privacy_accountant as R
from dp_accounting import mechanism_calibration as M
def ev(q, s, t): return E.SelfComposedDpEvent(E.PoissonSampledDpEvent(q, E.GaussianDpEvent(s)), t)
def pld(h): return P.PLDAccountant(value_discretization_interval=h)
"""


def hetero_toml(path):
    """50 distinct Poisson-Gaussian steps × 10⁴ (σ_j = 0.8 + 0.02 j, q_j = 0.001 + 2e-5 j), the
    `hetero(50)` case of scripts/compare_accounting.py and benches/pld.rs, as an event file."""
    lines = ["schema_version = 1", 'neighbouring = "add_remove"', f"delta = {DELTA}", "", "[event]",
             'type = "composed"', ""]
    for j in range(50):
        lines += ["[[event.events]]", 'type = "self_composed"', "count = 10000", "[event.events.event]",
                  'type = "poisson_sampled"', f"q = {0.001 + 2e-5 * j!r}", "[event.events.event.event]",
                  'type = "gaussian"', f"noise_multiplier = {0.8 + 0.02 * j!r}", ""]
    with open(path, "w") as f:
        f.write("\n".join(lines))


HETERO_PY = "E.ComposedDpEvent([ev(0.001 + 2e-5 * j, 0.8 + 0.02 * j, 10000) for j in range(50)])"


def account(steps, acc="pld"):
    return [BIN, "account", "--noise-multiplier", str(SIGMA), "--sample-rate", str(Q), "--steps", str(steps),
            "--delta", str(DELTA), "--accountant", acc]


def cases(tmp):
    ev_file = os.path.join(tmp, "hetero50.toml")
    hetero_toml(ev_file)
    c = {}
    for t in (10_000, 100_000, 1_000_000, 10_000_000):
        name = f"pld_1e{len(str(t)) - 1}"
        c[name] = dict(
            what=f"PLD, T = {t:,} (q {Q}, σ {SIGMA}, δ {DELTA})", ours=account(t), answer="eps",
            theirs=lambda h, t=t: f"a=pld({h}); a.compose(ev({Q}, {SIGMA}, {t})); print(a.get_epsilon({DELTA}))")
    c["pld_hetero50"] = dict(
        what="PLD, 50 distinct steps × 10⁴", ours=[BIN, "account", "--event", ev_file, "--accountant", "pld"],
        answer="eps",
        theirs=lambda h: f"a=pld({h}); a.compose({HETERO_PY}); print(a.get_epsilon({DELTA}))")
    c["rdp_1e6"] = dict(
        what="RDP, T = 10⁶", ours=account(1_000_000, "rdp"), answer="eps", grid=False,
        theirs=lambda h: f"a=R.RdpAccountant(); a.compose(ev({Q}, {SIGMA}, 1000000)); print(a.get_epsilon({DELTA}))")
    # Calibration: target ε 8 at δ 1e-5 (DP-SGD q 0.004, 10⁴ steps), solving for one of the three.
    cal = [BIN, "calibrate", "--target-epsilon", "8", "--delta", str(DELTA), "--accountant", "pld"]
    c["calibrate_sigma"] = dict(
        what="calibrate σ (ε 8, q 0.004, T 10⁴)", ours=cal + ["--sample-rate", str(Q), "--steps", "10000"],
        answer="sigma",
        theirs=lambda h: ("print(M.calibrate_dp_mechanism(lambda: pld(%g), lambda s: ev(%r, s, 10000), 8, %r, "
                          "bracket_interval=M.LowerEndpointAndGuess(0.3, 1.0), tol=1e-4))" % (h, Q, DELTA)))
    c["calibrate_sigma_rdp"] = dict(
        what="calibrate σ (ε 8, q 0.004, T 10⁴), RDP", answer="sigma", grid=False,
        ours=[BIN, "calibrate", "--target-epsilon", "8", "--delta", str(DELTA), "--accountant", "rdp",
              "--sample-rate", str(Q), "--steps", "10000"],
        theirs=lambda h: ("print(M.calibrate_dp_mechanism(R.RdpAccountant, lambda s: ev(%r, s, 10000), 8, %r, "
                          "bracket_interval=M.LowerEndpointAndGuess(0.3, 1.0), tol=1e-7))" % (Q, DELTA)))
    c["calibrate_q"] = dict(
        what="calibrate q (ε 8, σ 1.1, T 10⁴)", ours=cal + ["--noise-multiplier", str(SIGMA), "--steps", "10000", "--solve-for", "sample-rate"],
        answer="q",
        theirs=lambda h: ("print(M.calibrate_dp_mechanism(lambda: pld(%g), lambda q: ev(q, %r, 10000), 8, %r, "
                          "bracket_interval=M.ExplicitBracketInterval(1e-4, 1.0), tol=1e-7))" % (h, SIGMA, DELTA)))
    c["calibrate_steps"] = dict(
        what="calibrate steps (ε 8, q 0.004, σ 1.1)",
        ours=cal + ["--noise-multiplier", str(SIGMA), "--sample-rate", str(Q)], answer="steps",
        theirs=lambda h: ("print(M.calibrate_dp_mechanism(lambda: pld(%g), lambda t: ev(%r, %r, int(t)), 8, %r, "
                          "bracket_interval=M.ExplicitBracketInterval(1, 10**6), discrete=True))" % (h, Q, SIGMA, DELTA)))
    return c


def run_cpu(cmd, limit_mem=False):
    """(CPU seconds of the child, stdout) or (None, reason)."""
    def pre():
        if limit_mem:
            resource.setrlimit(resource.RLIMIT_AS, (MEM_LIMIT, MEM_LIMIT))
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    with tempfile.TemporaryFile() as out:
        p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.DEVNULL, preexec_fn=pre, env=env)
        try:
            _, status, ru = os.wait4(p.pid, 0)
        except KeyboardInterrupt:
            p.kill()
            raise
        out.seek(0)
        text = out.read().decode()
    if status != 0:
        return None, f"exit status {status}"
    return ru.ru_utime + ru.ru_stime, text


def ours_answer(kind, text):
    if kind == "eps":
        m = re.search(r"Headline \(smallest sound ε\): ε = ([0-9.e+-]+)", text)
    elif kind == "sigma":
        m = re.search(r"noise-multiplier = ([0-9.e+-]+)", text)
    elif kind == "q":
        m = re.search(r"sample-rate = ([0-9.e+-]+)", text)
    else:
        m = re.search(r"steps = ([0-9]+)", text)
    if not m:
        raise SystemExit(f"cannot read dpaudit's {kind} from:\n{text}")
    return float(m.group(1).replace(",", ""))


def theirs_cmd(code):
    return [sys.executable, "-c", PY_PRELUDE + code]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="*")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--list", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        all_cases = cases(tmp)
        if a.list:
            print("\n".join(all_cases))
            return
        names = a.cases or list(all_cases)
        print(f"dp-accounting {version('dp-accounting')}; load average {os.getloadavg()[0]:.1f} on "
              f"{os.cpu_count()} cores; CPU time (user + sys) of each process, median of {a.repeat}, interleaved")
        print()
        print("| case | dpaudit answer | dp_accounting grid: answer | dpaudit CPU s | dp_accounting CPU s | ratio |")
        print("|---|---|---|---|---|---|")
        for n in names:
            c = all_cases[n]
            cpu, text = run_cpu(c["ours"])
            if cpu is None:
                print(f"| {c['what']} | dpaudit failed: {text} | | | | |", flush=True)
                continue
            mine = ours_answer(c["answer"], text)
            chosen = None
            for h in (LADDER if c.get("grid", True) else [None]):
                t, out = run_cpu(theirs_cmd(c["theirs"](h)), limit_mem=True)
                if t is None:
                    continue
                theirs = float(out.split()[-1])
                if abs(theirs - mine) <= 1e-3 * abs(mine):
                    chosen = (h, theirs)
                    break
            if chosen is None:
                print(f"| {c['what']} | {mine:.6g} | no grid of the ladder within 0.1 % (or out of memory) | | | |",
                      flush=True)
                continue
            h, theirs = chosen
            ts_o, ts_t = [], []
            for _ in range(a.repeat):
                ts_o.append(run_cpu(c["ours"])[0])
                ts_t.append(run_cpu(theirs_cmd(c["theirs"](h)), limit_mem=True)[0])
            mo, mt = statistics.median(ts_o), statistics.median(ts_t)
            grid = "RDP" if h is None else f"{h:g}"
            print(f"| {c['what']} | {mine:.6g} | {grid}: {theirs:.6g} | {mo:.4f} | {mt:.3f} | {mt / mo:.0f}× |",
                  flush=True)


if __name__ == "__main__":
    main()
