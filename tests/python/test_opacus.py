"""dpaudit.opacus.Accountant in a real Opacus training loop on a tiny model: ε within 1 % of
Opacus' PRV accountant on the same steps and never below PRV's lower bound."""

import math

import pytest

import torch  # noqa: E402
from opacus import PrivacyEngine  # noqa: E402
from opacus.accountants import PRVAccountant, RDPAccountant  # noqa: E402

import dpaudit  # noqa: E402
import dpaudit.opacus  # noqa: E402

DELTA = 1e-5


def train(engine: PrivacyEngine, epochs: int = 3, sigma: float = 1.0):
    torch.manual_seed(0)
    x = torch.randn(256, 4)
    y = (x[:, 0] > 0).long()
    data = torch.utils.data.TensorDataset(x, y)
    loader = torch.utils.data.DataLoader(data, batch_size=32)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, loader = engine.make_private(
        module=model, optimizer=opt, data_loader=loader, noise_multiplier=sigma, max_grad_norm=1.0, poisson_sampling=True
    )
    eps = []
    for _ in range(epochs):
        for xb, yb in loader:
            if len(xb) == 0:
                continue
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
        eps.append(engine.get_epsilon(DELTA))
    return eps


def test_training_loop_epsilon_is_within_1_percent_of_prv_and_above_its_lower_bound():
    engine = PrivacyEngine(accountant="dpaudit")
    acc = engine.accountant
    assert isinstance(acc, dpaudit.opacus.Accountant) and acc.mechanism() == "dpaudit"
    eps = train(engine)
    assert len(acc) > 0 and sum(n for _, _, n in acc.history) == len(acc)
    assert eps == sorted(eps) and eps[0] > 0
    prv = PRVAccountant()
    prv.history = list(acc.history)
    eps_prv = prv.get_epsilon(DELTA)  # Opacus' PRV ε (its upper end, eps_error 0.01)
    lower, _, upper = prv._get_dprv(eps_error=0.01, delta_error=DELTA / 1000).compute_epsilon(DELTA, DELTA / 1000, 0.01)
    assert upper == eps_prv
    ours = eps[-1]
    assert abs(ours - eps_prv) <= 0.01 * eps_prv, (ours, eps_prv)
    assert ours >= lower, (ours, lower)
    # The smallest sound bound: PLD here, and never above RDP's (Opacus' RDP is also a bound).
    e, which = acc.get_privacy_spent(delta=DELTA)
    assert e == ours and which == "pld"
    rdp = RDPAccountant()
    rdp.history = list(acc.history)
    assert ours <= rdp.get_epsilon(DELTA)
    assert acc.account(DELTA).epsilon == ours


def test_state_dict_round_trips_and_checks_mechanism():
    a = dpaudit.opacus.Accountant()
    for _ in range(5):
        a.step(noise_multiplier=1.0, sample_rate=0.01)
    a.step(noise_multiplier=2.0, sample_rate=0.02)
    assert a.history == [(1.0, 0.01, 5), (2.0, 0.02, 1)] and len(a) == 6
    b = dpaudit.opacus.Accountant()
    b.load_state_dict(a.state_dict())
    assert b.history == a.history and b.get_epsilon(DELTA) == a.get_epsilon(DELTA)
    with pytest.raises(ValueError):
        b.load_state_dict(RDPAccountant().state_dict() | {"history": []})
    assert dpaudit.opacus.Accountant().get_epsilon(DELTA) == 0.0
    ev = a.event()
    assert ev == dpaudit.DpEvent.composed([dpaudit.DpEvent.dpsgd(1.0, 0.01, 5), dpaudit.DpEvent.dpsgd(2.0, 0.02, 1)])


def test_make_private_with_epsilon_calibrates_with_the_dpaudit_accountant():
    from opacus.accountants.utils import get_noise_multiplier

    sigma = get_noise_multiplier(target_epsilon=2.0, target_delta=DELTA, sample_rate=1 / 8, epochs=3, accountant="dpaudit", epsilon_tolerance=0.01)
    a = dpaudit.opacus.Accountant()
    a.history = [(sigma, 1 / 8, int(3 * 8))]
    assert a.get_epsilon(DELTA) <= 2.0
    assert not math.isnan(sigma)


def audited_run(halve_noise: bool, seed: int = 0):
    """A full-batch Opacus DP-SGD run (q = 1: one Poisson batch of all 64 rows per step, 16
    steps, C = 1, σ = 4.3247: ε = 4 at δ = 1e-5) of a small MLP with 2,000 white-box gradient
    canaries; optionally the optimizer's noise multiplier is halved after the auditor attached
    (a silent bug: Opacus' own accountant would then record the halved σ)."""
    torch.manual_seed(seed)
    x = torch.randn(64, 4)
    y = (x[:, 0] > 0).long()
    data = torch.utils.data.TensorDataset(x, y)
    loader = torch.utils.data.DataLoader(data, batch_size=64)
    model = torch.nn.Sequential(torch.nn.Linear(4, 512), torch.nn.ReLU(), torch.nn.Linear(512, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    engine = PrivacyEngine(accountant="dpaudit")
    model, opt, loader = engine.make_private(
        module=model, optimizer=opt, data_loader=loader, noise_multiplier=4.3247, max_grad_norm=1.0, poisson_sampling=True
    )
    auditor = dpaudit.opacus.WhiteBoxAuditor(opt, canaries=2000, sample_rate=1 / len(loader), seed=seed)
    if halve_noise:
        opt.noise_multiplier = opt.noise_multiplier / 2
    for _ in range(16):
        for xb, yb in loader:
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
    return auditor.audit(delta=DELTA)


def test_white_box_auditor_finds_a_correct_opacus_run_consistent():
    r = audited_run(halve_noise=False)
    assert r["verdict"] == "consistent", r
    a = r["audit"]
    assert a["threat_model"] == "white-box" and a["steps"] == 16 and a["canaries"] == 2000
    assert 3.99 <= r["ledger_epsilon"] <= 4.0
    assert a["epsilon_lower"] <= r["ledger_epsilon"]
    assert a["gaussian"]["kind"] == "lower_bound" and a["gaussian"]["epsilon_lower"] > 2.0, a["gaussian"]


def test_white_box_auditor_catches_a_silently_halved_noise_multiplier():
    r = audited_run(halve_noise=True)
    assert r["verdict"] == "violated", r
    assert r["audit"]["epsilon_lower"] > r["ledger_epsilon"]
