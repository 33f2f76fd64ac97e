"""An Opacus accountant whose ε is dpaudit's smallest sound bound.

Importing this module registers the mechanism ``"dpaudit"`` with Opacus, so that

>>> from opacus import PrivacyEngine
>>> import dpaudit.opacus
>>> engine = PrivacyEngine(accountant="dpaudit")   # doctest: +SKIP

accounts every optimizer step with :class:`Accountant` (Opacus 1.x builds its accountant from
a registered name; ``engine.accountant = dpaudit.opacus.Accountant()`` works as well).
``engine.get_epsilon(delta)`` then answers with the smallest *sound* ε (exact or upper bound,
by the PLD and RDP accountants; never the CLT estimate).

The history has Opacus' form, a list of ``(noise_multiplier, sample_rate, steps)``, so
``state_dict()``/``load_state_dict()`` and Opacus checkpoints work unchanged.
"""

from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

from opacus.accountants.accountant import IAccountant
from opacus.accountants.registry import _ACCOUNTANTS, register_accountant

from . import Accounting, DpEvent, InputError, account

__all__ = ["Accountant", "MECHANISM"]

#: The name Opacus knows this accountant by.
MECHANISM = "dpaudit"


class Accountant(IAccountant):
    """Opacus ``IAccountant`` backed by dpaudit (``accountants``: which of dpaudit's sound
    accountants to run; the smallest sound ε of them is reported)."""

    def __init__(self, accountants: Sequence[str] = ("pld", "rdp")) -> None:
        super().__init__()
        self.history: List[Tuple[float, float, int]] = []
        self.accountants = list(accountants)

    def step(self, *, noise_multiplier: float, sample_rate: float) -> None:
        """One optimizer step: Poisson(sample_rate) ∘ Gaussian(noise_multiplier)."""
        if self.history and self.history[-1][0] == noise_multiplier and self.history[-1][1] == sample_rate:
            sigma, q, n = self.history[-1]
            self.history[-1] = (sigma, q, n + 1)
        else:
            self.history.append((noise_multiplier, sample_rate, 1))

    def event(self) -> DpEvent:
        """The steps so far as one dpaudit event (one DP-SGD phase per history entry)."""
        phases = [DpEvent.dpsgd(float(s), float(q), int(n)) for s, q, n in self.history]
        return phases[0] if len(phases) == 1 else DpEvent.composed(phases)

    def account(self, delta: float) -> Accounting:
        """Every accountant's answer at ``delta`` (with kinds and skipped accountants)."""
        return account(self.event(), delta=delta, accountants=self.accountants, neighbouring="add_remove")

    def get_epsilon(self, delta: float, *args: Any, **kwargs: Any) -> float:
        """The smallest sound ε at ``delta`` (0 before the first step)."""
        if not self.history:
            return 0.0
        return self.account(delta).epsilon

    def get_privacy_spent(self, *, delta: float, **kwargs: Any) -> Tuple[float, Optional[str]]:
        """(ε, the accountant that gives it); (0, None) before the first step."""
        if not self.history:
            return 0.0, None
        best = self.account(delta).sound()
        if best is None:
            raise InputError("no sound accountant could account the training run")
        return best.epsilon, best.accountant

    def __len__(self) -> int:
        """Optimizer steps so far."""
        return sum(int(n) for _, _, n in self.history)

    @classmethod
    def mechanism(cls) -> str:
        return MECHANISM


if MECHANISM not in _ACCOUNTANTS:
    register_accountant(MECHANISM, Accountant)
