"""`check` and `calibrate` from Python run the CLI's own chain (`audit::check`, `audit::calibrate`):
the same verdict, numbers, kinds and warnings as `target/release/dpaudit` on the same inputs, and
an exception where the CLI exits 2."""

import json

import pytest

import dpaudit
from conftest import ROOT, cli, cli_json

# Event files and sampler configs with their own δ, each checked under and over its sound ε.
CHECKED = [
    "fixtures/events/dpsgd.toml",
    "fixtures/events/full_batch.toml",
    "fixtures/events/heterogeneous.toml",
    "fixtures/samplers/edm-cifar10-subsampled.toml",
]

VERDICT_KEYS = ["status", "budget", "epsilon", "delta", "accountant", "bound", "margin", "message"]


def check_json(path: str, budget: str):
    """The CLI's JSON report of `check` and its exit code (0 within budget, 1 over)."""
    p = cli("check", path, "--max-epsilon", budget, "--no-plots", "--format", "json", ok=False)
    assert p.returncode in (0, 1), f"exit {p.returncode}: {p.stderr}"
    return json.loads(p.stdout), p.returncode


@pytest.mark.parametrize("path", CHECKED)
@pytest.mark.parametrize("budget", ["0.5", "50"])
def test_check_gives_the_cli_verdict_and_warnings(path, budget):
    rep, code = check_json(path, budget)
    py = dpaudit.check(ROOT / path, max_epsilon=float(budget))
    v = rep["verdicts"][0]
    pv = py.accounting.report["verdicts"][0]
    # The subject names the input as each was given (a relative and an absolute path).
    assert pv["subject"].endswith(path) and v["subject"].endswith(path)
    for k in VERDICT_KEYS:
        assert pv.get(k) == v.get(k), (k, pv.get(k), v.get(k))
    assert py.verdict.status == v["status"]
    assert py.holds == (code == 0)
    # The same warnings (a sampler config's input warnings included), in the same order.
    assert [(w["code"], w["message"], w["severe"]) for w in py.accounting.warnings] == [
        (w["code"], w["message"], w["severe"]) for w in rep["warnings"]
    ]
    assert [(r["accountant"], r["epsilon"], r["kind"]) for r in py.accounting.report["results"]] == [
        (r["accountant"], r["epsilon"], r["kind"]) for r in rep["results"]
    ]


def test_check_of_an_event_object_gives_the_cli_verdict():
    path = "fixtures/events/dpsgd.toml"
    rep, _ = check_json(path, "1")
    ev = dpaudit.DpEvent.from_file(ROOT / path)
    py = dpaudit.check(ev, max_epsilon=1.0)
    v = rep["verdicts"][0]
    for k in ["status", "epsilon", "accountant", "bound", "margin"]:
        assert py.accounting.report["verdicts"][0][k] == v[k], k


def test_check_without_a_sound_accountant_raises_where_the_cli_exits_2():
    # The CLT alone gives an estimate: the budget cannot be checked (the CLI exits 2; Python used
    # to return an `inconclusive` verdict instead).
    path = "fixtures/events/dpsgd.toml"
    p = cli("check", path, "--max-epsilon", "1", "--accountant", "clt", ok=False)
    assert p.returncode == 2, p
    cli_error = [l for l in p.stderr.splitlines() if l.startswith("error: ")]
    assert len(cli_error) == 1, p.stderr
    with pytest.raises(dpaudit.InputError) as e:
        dpaudit.check(path, max_epsilon=1.0, accountants=["clt"])
    assert str(e.value) == cli_error[0].removeprefix("error: ")
    assert "no sound accountant" in str(e.value)


CALIBRATIONS = [
    # (Python keyword arguments, CLI flags)
    (dict(sample_rate=0.01, steps=10000), ["--sample-rate", "0.01", "--steps", "10000"]),
    (dict(noise_multiplier=1.1, sample_rate=0.004, solve_for="steps"), ["--noise-multiplier", "1.1", "--sample-rate", "0.004", "--solve-for", "steps"]),
    # The CLT gives an estimate: both warn that it is not a guarantee.
    (dict(sample_rate=0.01, steps=1000, accountant="clt"), ["--sample-rate", "0.01", "--steps", "1000", "--accountant", "clt"]),
]


@pytest.mark.parametrize("kwargs, flags", CALIBRATIONS, ids=["sigma", "steps", "clt"])
def test_calibrate_gives_the_cli_answer_and_warnings(kwargs, flags):
    target, delta = 3.0, 1e-5
    rep = cli_json("calibrate", "--target-epsilon", str(target), "--delta", str(delta), *flags)
    py = dpaudit.calibrate(target, delta, **kwargs)
    solve_for = py.solve_for
    assert py.value == rep["answers"][solve_for]
    r = rep["results"][0]
    assert (py.result.accountant, py.result.epsilon, py.result.kind) == (r["accountant"], r["epsilon"], r["kind"])
    assert py.result.epsilon <= target or py.result.kind == "estimate"
    assert [(w["code"], w["message"], w["severe"]) for w in py.warnings] == [
        (w["code"], w["message"], w["severe"]) for w in rep["warnings"]
    ]
    if kwargs.get("accountant") == "clt":
        assert py.result.kind == "estimate"
        assert any(w["code"] == "estimate_not_a_bound" and w["severe"] for w in py.warnings), py.warnings
    else:
        assert not any(w["code"] == "estimate_not_a_bound" for w in py.warnings)
    assert py.report["answers"] == rep["answers"]
