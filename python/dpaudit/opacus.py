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

import secrets
from typing import Any, Dict, List, Optional, Sequence, Tuple

from opacus.accountants.accountant import IAccountant
from opacus.accountants.registry import _ACCOUNTANTS, register_accountant

from . import Accounting, DpEvent, InputError, _call, account

__all__ = ["Accountant", "MECHANISM", "WhiteBoxAuditor"]

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


#: A gradient canary's per-sample gradient norm as a multiple of ``max_grad_norm``: a correct
#: DP-SGD clips it to exactly C; one that skips clipping lets 2C through.
CANARY_NORM = 2.0


class WhiteBoxAuditor:
    """White-box one-run audit of an Opacus training loop (threat model: every noisy update seen;
    Nasr et al. 2023, Steinke et al. 2023): the same Dirac gradient canaries and estimators as
    ``dpaudit train --canary-kind gradient`` / ``dpaudit mia --audit one-run``.

    ``m`` canaries, each on its own parameter coordinate (at least one per tensor), each included
    with probability ½ (the secret); every step, each included canary is Poisson-sampled at
    ``sample_rate`` and its per-sample gradient (``CANARY_NORM``·C on its coordinate) is appended
    to the batch's per-sample gradients *before* Opacus clips them; after Opacus adds its noise
    and scales, the noisy gradient at every canary's coordinate is recorded (in units of C). The
    ledger the run is audited against is what the optimizer claims when the auditor attaches
    (its ``noise_multiplier``) with ``sample_rate`` (``1 / len(data_loader)`` for Opacus'
    Poisson loader) and the number of steps observed.

    >>> auditor = WhiteBoxAuditor(optimizer, canaries=1000, sample_rate=1 / len(loader))  # doctest: +SKIP
    >>> ... train ...                                                                  # doctest: +SKIP
    >>> auditor.audit(delta=1e-5)["verdict"]                                           # doctest: +SKIP
    'consistent'
    """

    def __init__(self, optimizer: Any, canaries: int, *, sample_rate: float, seed: Optional[int] = None) -> None:
        import torch

        self.optimizer = optimizer
        self.noise_multiplier = float(optimizer.noise_multiplier)
        self.clip = float(optimizer.max_grad_norm)
        self.sample_rate = float(sample_rate)
        if not (0.0 < self.sample_rate <= 1.0):
            raise InputError(f"sample_rate: must be in (0, 1], got {sample_rate}")
        params = [p for p in optimizer.params if p.requires_grad]
        total = sum(p.numel() for p in params)
        if not 2 <= canaries <= total:
            raise InputError(f"canaries: need 2 to {total} (one distinct coordinate each), got {canaries}")
        # Secret randomness (the OS CSPRNG) unless seeded.
        self._gen = torch.Generator().manual_seed(seed if seed is not None else secrets.randbits(63))
        coords: List[Tuple[int, int]] = []
        taken = set()
        for k, p in enumerate(params[:canaries]):
            j = int(torch.randint(p.numel(), (1,), generator=self._gen))
            coords.append((k, j))
            taken.add((k, j))
        offsets = [0]
        for p in params:
            offsets.append(offsets[-1] + p.numel())
        while len(coords) < canaries:
            g = int(torch.randint(total, (1,), generator=self._gen))
            k = max(i for i in range(len(params)) if offsets[i] <= g)
            c = (k, g - offsets[k])
            if c not in taken:
                taken.add(c)
                coords.append(c)
        self.params = params
        self.coords = coords
        self.included: List[bool] = [bool(b) for b in (torch.rand(canaries, generator=self._gen) < 0.5).tolist()]
        self.observations: List[float] = []
        self.steps = 0
        self._by_param: Dict[int, List[Tuple[int, int]]] = {}
        for i, (k, j) in enumerate(coords):
            self._by_param.setdefault(k, []).append((i, j))
        self._clip_and_accumulate = optimizer.clip_and_accumulate
        self._scale_grad = optimizer.scale_grad
        optimizer.clip_and_accumulate = self._inject
        optimizer.scale_grad = self._observe

    def _inject(self, *args: Any, **kwargs: Any) -> Any:
        import torch

        sampled = [
            i
            for i, inc in enumerate(self.included)
            if inc and float(torch.rand((), generator=self._gen)) < self.sample_rate
        ]
        if sampled:
            row = {i: r for r, i in enumerate(sampled)}
            for k, p in enumerate(self.params):
                gs = p.grad_sample
                if isinstance(gs, list):
                    gs = torch.cat(gs, dim=0)
                extra = torch.zeros((len(sampled),) + tuple(p.shape), dtype=gs.dtype, device=gs.device)
                flat = extra.view(len(sampled), -1)
                for i, j in self._by_param.get(k, []):
                    if i in row:
                        flat[row[i], j] = CANARY_NORM * self.clip
                p.grad_sample = torch.cat([gs, extra], dim=0)
        return self._clip_and_accumulate(*args, **kwargs)

    def _observe(self, *args: Any, **kwargs: Any) -> Any:
        out = self._scale_grad(*args, **kwargs)
        opt = self.optimizer
        scale = 1.0 / self.clip
        if getattr(opt, "loss_reduction", "mean") == "mean":
            scale *= float(opt.expected_batch_size) * float(getattr(opt, "accumulated_iterations", 1))
        row = [0.0] * len(self.coords)
        for k, p in enumerate(self.params):
            flat = p.grad.detach().reshape(-1)
            for i, j in self._by_param.get(k, []):
                row[i] = float(flat[j]) * scale
        self.observations.extend(row)
        self.steps += 1
        return out

    def audit(self, delta: float, confidence: float = 0.95) -> Dict[str, Any]:
        """The white-box audit of the steps observed so far: ``verdict`` (``violated`` when an
        estimator's ε lower bound exceeds the ledger's smallest sound ε, else ``consistent``),
        ``ledger_epsilon``, and ``audit`` with every estimator's result and its threat model."""
        return _call(
            "white_box_audit",
            {
                "observations": self.observations,
                "included": self.included,
                "noise_multiplier": self.noise_multiplier,
                "sample_rate": self.sample_rate,
                "steps": self.steps,
                "delta": delta,
                "confidence": confidence,
            },
        )

    def detach(self) -> None:
        """Restores the optimizer's own methods."""
        self.optimizer.clip_and_accumulate = self._clip_and_accumulate
        self.optimizer.scale_grad = self._scale_grad


if MECHANISM not in _ACCOUNTANTS:
    register_accountant(MECHANISM, Accountant)
