"""dp_accounting's events converted by dpaudit give the same ε as `dpaudit account` on the same
event file, for every event file in fixtures/events."""

import json
import math
import tomllib

import pytest
from dp_accounting import dp_event as dpe

import dpaudit
from conftest import BAD_EVENTS, EVENTS, ROOT, cli, cli_json


def to_dp_accounting(t: dict) -> dpe.DpEvent:
    """The test's own translation of an event file's tree into dp_accounting objects."""
    k = t["type"]
    if k == "gaussian":
        return dpe.GaussianDpEvent(noise_multiplier=t["noise_multiplier"])
    if k == "laplace":
        return dpe.LaplaceDpEvent(noise_multiplier=t["noise_multiplier"])
    if k == "poisson_sampled":
        return dpe.PoissonSampledDpEvent(sampling_probability=t["q"], event=to_dp_accounting(t["event"]))
    if k == "sampled_without_replacement":
        return dpe.SampledWithoutReplacementDpEvent(
            source_dataset_size=t["n"], sample_size=t["m"], event=to_dp_accounting(t["event"])
        )
    if k == "self_composed":
        return dpe.SelfComposedDpEvent(event=to_dp_accounting(t["event"]), count=t["count"])
    if k == "composed":
        return dpe.ComposedDpEvent(events=[to_dp_accounting(e) for e in t["events"]])
    raise AssertionError(f"no dp_accounting form for {k}")


def named_tuple_dict(nt) -> dict:
    """dp_accounting's named-tuple form, nested as dicts (its JSON form)."""
    d = nt._asdict()
    for k, v in d.items():
        if hasattr(v, "_asdict"):
            d[k] = named_tuple_dict(v)
        elif isinstance(v, list):
            d[k] = [named_tuple_dict(x) if hasattr(x, "_asdict") else x for x in v]
    return d


def test_every_fixture_is_covered():
    assert len(EVENTS) >= 6, EVENTS


@pytest.mark.parametrize("path", EVENTS, ids=lambda p: p.name)
def test_dp_accounting_event_accounts_as_the_cli(path):
    spec = tomllib.loads(path.read_text())
    delta = spec["delta"]
    neighbouring = spec.get("neighbouring", "add_remove")
    native = to_dp_accounting(spec["event"])
    rel = str(path.relative_to(ROOT))
    want = cli_json("account", "--event", rel, "--accountant", "all")
    want_eps = {r["accountant"]: r for r in want["results"]}
    want_skipped = {s["accountant"] for s in want["skipped"]}
    as_json = json.dumps(named_tuple_dict(native.to_named_tuple()))
    for ev in (
        dpaudit.DpEvent.from_dp_accounting(native),
        dpaudit.DpEvent.from_dp_accounting(native.to_named_tuple()),
        dpaudit.DpEvent.from_json(as_json),
    ):
        assert ev == dpaudit.DpEvent.from_file(path), rel
        got = dpaudit.account(ev, delta=delta, neighbouring=neighbouring)
        assert set(got.skipped) == want_skipped, (rel, got.skipped)
        assert [r.accountant for r in got.results] == [r["accountant"] for r in want["results"]]
        for r in got.results:
            w = want_eps[r.accountant]
            # The same event and the same code: the same double, not merely close.
            assert r.epsilon == float(w["epsilon"]), (rel, r.accountant, r.epsilon, w["epsilon"])
            assert r.kind == w["kind"] and r.delta == float(w["delta"])
        # The headline: the smallest sound ε, as the CLI's verdict-free report states it.
        sound = [float(w["epsilon"]) for w in want["results"] if w["kind"] in ("exact", "upper_bound")]
        assert got.epsilon == min(sound)


@pytest.mark.parametrize("path", EVENTS, ids=lambda p: p.name)
def test_file_round_trips_through_dict_form(path):
    ev = dpaudit.DpEvent.from_file(path)
    again = dpaudit.DpEvent.from_dict(ev.to_dict())
    assert again == ev
    spec = tomllib.loads(path.read_text())
    whole = dpaudit.DpEvent.from_dict(spec)
    assert whole == ev and whole.delta == spec["delta"]


def test_delta_at_epsilon_matches_the_cli():
    rel = "fixtures/events/dpsgd.toml"
    want = cli_json("account", "--event", rel, "--epsilon", "2", "--accountant", "rdp,pld")
    got = dpaudit.account(ROOT / rel, epsilon=2.0, accountants=["rdp", "pld"])
    assert got.question == "delta"
    for r, w in zip(got.results, want["results"]):
        assert (r.accountant, r.value, r.kind) == (w["accountant"], float(w["delta"]), w["kind"])
        assert r.value == r.delta and r.epsilon == 2.0


def test_builders_make_the_fixture_event():
    built = dpaudit.DpEvent.composed(
        [
            dpaudit.DpEvent.dpsgd(1.0, 0.01, 2000),
            dpaudit.DpEvent.self_composed(dpaudit.DpEvent.poisson_sampled(0.05, dpaudit.DpEvent.gaussian(2.5)), 500),
            dpaudit.DpEvent.self_composed(dpaudit.DpEvent.gaussian(20.0), 5),
        ]
    )
    assert built == dpaudit.DpEvent.from_file(ROOT / "fixtures/events/heterogeneous.toml")


def test_laplace_epsilon_delta_and_without_replacement_convert():
    native = dpe.ComposedDpEvent(
        events=[
            dpe.LaplaceDpEvent(noise_multiplier=2.0),
            dpe.SampledWithoutReplacementDpEvent(
                source_dataset_size=1000, sample_size=10, event=dpe.GaussianDpEvent(noise_multiplier=3.0)
            ),
        ]
    )
    ev = dpaudit.DpEvent.from_dp_accounting(native)
    assert ev.to_dict() == {
        "type": "composed",
        "events": [
            {"type": "laplace", "noise_multiplier": 2.0},
            {"type": "sampled_without_replacement", "n": 1000, "m": 10, "event": {"type": "gaussian", "noise_multiplier": 3.0}},
        ],
    }
    # dp_accounting 0.6 has no (ε, δ) event class; its named-tuple dict form is accepted.
    ed = dpaudit.DpEvent.from_dict({"module_name": "dp_accounting.dp_event", "class_name": "EpsilonDeltaDpEvent", "epsilon": 1.0, "delta": 1e-6})
    assert ed == dpaudit.DpEvent.epsilon_delta(1.0, 1e-6)
    r = dpaudit.account(dpaudit.DpEvent.self_composed(ed, 3), delta=1e-5, accountants="pld")
    assert r.sound() is not None and r.epsilon >= 1.0


def test_check_verdict_and_evidence_match_the_cli():
    rel = "fixtures/events/dpsgd.toml"
    for budget, status in ((1.0, "fail"), (3.0, "pass")):
        p = cli("check", rel, "--max-epsilon", str(budget), "--format", "json", ok=False)
        assert p.returncode == (0 if status == "pass" else 1)
        want = json.loads(p.stdout)["verdicts"][0]
        got = dpaudit.check(ROOT / rel, max_epsilon=budget)
        v = got.verdict
        assert v.status == want["status"] == status
        assert v.holds == (status == "pass")
        assert (v.epsilon, v.accountant, v.kind, v.delta) == (want["epsilon"], want["accountant"], want["bound"], want["delta"])
        assert math.isclose(v.margin, budget - v.epsilon) and v.message == want["message"]
        assert v.epsilon == got.accounting.epsilon


def test_check_never_decides_on_an_estimate():
    # CLT only: an estimate is not evidence, so the budget cannot be checked; as the CLI exits 2
    # (test_same_as_cli.py), Python raises instead of returning a verdict.
    with pytest.raises(dpaudit.InputError, match="no sound accountant could account this pipeline"):
        dpaudit.check(dpaudit.DpEvent.dpsgd(1.1, 0.004, 14062), max_epsilon=100.0, delta=1e-5, accountants="clt")


def test_calibrate_matches_the_cli():
    want = cli_json("calibrate", "--target-epsilon", "1", "--delta", "1e-5", "--sample-rate", "0.004", "--steps", "14062")
    got = dpaudit.calibrate(1.0, 1e-5, sample_rate=0.004, steps=14062)
    assert got.solve_for == "noise_multiplier"
    assert got.result.sound and got.result.epsilon <= 1.0
    assert got.value == want["answers"]["noise_multiplier"], want["answers"]
    again = dpaudit.account(got.event, delta=1e-5, accountants="pld")
    assert again.epsilon == got.result.epsilon


def test_analyze_matches_the_cli():
    rel = "fixtures/samplers/edm-cifar10-paper.toml"
    want = cli_json("analyze", rel)
    got = dpaudit.analyze(ROOT / rel)
    assert [(r.accountant, r.epsilon, r.kind) for r in got.accounting.results] == [
        (w["accountant"], float(w["epsilon"]), w["kind"]) for w in want["results"]
    ]
    assert got.detail["full_batch_mu"] == pytest.approx(787.6, rel=1e-3)
    as_dict = tomllib.loads((ROOT / rel).read_text())
    assert [r.epsilon for r in dpaudit.analyze(as_dict).accounting.results] == [r.epsilon for r in got.accounting.results]
