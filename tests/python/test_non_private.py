"""dp_accounting's NonPrivateDpEvent: accepted, accounted ε = ∞ (as dp_accounting answers),
and any finite budget is exceeded."""

import collections
import math

import dpaudit

# dp_accounting's named-tuple form (`to_named_tuple()`), built without dp_accounting.
NonPrivate = collections.namedtuple("NonPrivate", ["class_name"])
Gaussian = collections.namedtuple("Gaussian", ["class_name", "noise_multiplier"])
Composed = collections.namedtuple("Composed", ["class_name", "events"])
Poisson = collections.namedtuple("Poisson", ["class_name", "sampling_probability", "event"])


def events():
    gaussian = Gaussian("GaussianDpEvent", 1.0)
    non_private = NonPrivate("NonPrivateDpEvent")
    yield Composed("ComposedDpEvent", [gaussian, non_private])
    yield Poisson("PoissonSampledDpEvent", 0.001, non_private)
    yield {"class_name": "NonPrivateDpEvent"}


def test_non_private_converts_to_non_private():
    ev = dpaudit.DpEvent.from_dp_accounting(NonPrivate("NonPrivateDpEvent"))
    assert ev.to_dict()["type"] == "non_private"


def test_non_private_accounts_infinite_and_fails_any_budget():
    for raw in events():
        ev = dpaudit.DpEvent.from_dp_accounting(raw)
        acc = dpaudit.account(ev, delta=1e-5)
        assert not acc.skipped, acc.skipped
        assert {r.accountant for r in acc.results} == {"gdp", "clt", "rdp", "pld"}
        for r in acc.results:
            assert math.isinf(r.value) and r.value > 0, r
        assert math.isinf(acc.sound().value)
        d = dpaudit.account(ev, epsilon=1.0)
        assert all(r.value == 1.0 for r in d.results), d.results
        chk = dpaudit.check(ev, 8.0, 1e-5)
        assert chk.verdict.status == "fail" and not chk.holds
        assert math.isinf(chk.verdict.epsilon)
        assert "non-private" in chk.verdict.message


def test_real_dp_accounting_non_private_event():
    from dp_accounting import dp_event as dpe

    ev = dpe.ComposedDpEvent(events=[dpe.GaussianDpEvent(noise_multiplier=1.0), dpe.NonPrivateDpEvent()])
    acc = dpaudit.account(dpaudit.DpEvent.from_dp_accounting(ev), delta=1e-5)
    assert all(math.isinf(r.value) for r in acc.results)
