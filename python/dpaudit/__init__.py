"""dpaudit in Python: sound privacy accounting from dpaudit's Rust core.

Every number says what kind of number it is: ``exact`` (the true value, rounded to the safe
side), ``upper_bound`` (never below the truth) or ``estimate`` (the GDP central limit theorem;
may be *below* the truth, never used for a verdict). The computations are the ones of the
``dpaudit`` command line (same accountants, same messages): ``account`` is ``dpaudit account``,
``check`` is ``dpaudit check``, ``calibrate`` is ``dpaudit calibrate``, ``analyze`` is
``dpaudit analyze``.

>>> import dpaudit
>>> ev = dpaudit.DpEvent.dpsgd(noise_multiplier=1.1, sample_rate=0.004, steps=14062)
>>> r = dpaudit.account(ev, delta=1e-5, accountants=["pld", "rdp"])
>>> r.sound().accountant
'pld'

Bad input raises :class:`InputError` (a ``ValueError``) whose message is the CLI's
(``file:line: field `x`: message``), with ``.field``, ``.file`` and ``.line``.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _native

__all__ = [
    "InputError",
    "DpEvent",
    "Result",
    "Accounting",
    "Verdict",
    "Check",
    "Calibration",
    "Analysis",
    "EventLike",
    "account",
    "check",
    "calibrate",
    "analyze",
    "SOUND_KINDS",
]

__version__: str = _native.__version__

#: The kinds a budget may be checked against (an estimate never is).
SOUND_KINDS = frozenset({"exact", "upper_bound"})


class InputError(ValueError):
    """Invalid input: the message is the CLI's; ``field``, ``file`` and ``line`` locate it."""

    def __init__(
        self,
        message: str,
        field: Optional[str] = None,
        file: Optional[str] = None,
        line: Optional[int] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.field = field
        self.file = file
        self.line = line

    def __str__(self) -> str:
        return self.message


_TOO_DEEP = "the input is nested too deeply (deeper than Python's recursion limit); an event tree this deep is not a DP event dpaudit can account"


def _call(op: str, request: Mapping[str, Any]) -> Any:
    try:
        text = json.dumps(request, allow_nan=True)
    except (TypeError, ValueError) as e:
        raise InputError(f"request is not JSON-serialisable: {e}") from None
    except RecursionError:
        raise InputError(_TOO_DEEP) from None
    try:
        answer = _native.call(op, text)
    except ValueError as e:
        if len(e.args) == 4:
            raise InputError(*e.args) from None
        raise
    return json.loads(answer)


def _f(x: Any) -> float:
    """A number from the native JSON (non-finite values come as "inf", "-inf", "nan")."""
    return float(x)


def _num(x: Optional[float]) -> Any:
    if x is None:
        return None
    x = float(x)
    if math.isfinite(x):
        return x
    return "nan" if math.isnan(x) else ("inf" if x > 0 else "-inf")


# --------------------------------------------------------------------------------------------
# Events
# --------------------------------------------------------------------------------------------

_DP_ACCOUNTING = {
    "GaussianDpEvent",
    "LaplaceDpEvent",
    "PoissonSampledDpEvent",
    "SampledWithoutReplacementDpEvent",
    "SelfComposedDpEvent",
    "ComposedDpEvent",
    "EpsilonDeltaDpEvent",
    "NoOpDpEvent",
    "NonPrivateDpEvent",
}


class DpEvent:
    """An immutable, validated dpaudit event tree (what ran).

    Build one with the constructors (:meth:`gaussian`, :meth:`poisson_sampled`, ...), from an
    event file (:meth:`from_file`), from its dict/JSON form (:meth:`from_dict`,
    :meth:`from_json`) or from a dp_accounting ``DpEvent`` (:meth:`from_dp_accounting`).
    ``neighbouring`` and ``delta`` are the defaults an event file states (``account`` uses
    them when not given).
    """

    __slots__ = ("_tree", "neighbouring", "delta")

    def __init__(self, tree: Mapping[str, Any], *, neighbouring: str = "add_remove", delta: Optional[float] = None) -> None:
        ans = _call("validate", {"event": tree})
        self._tree: Dict[str, Any] = ans["event"]
        self.neighbouring = neighbouring
        self.delta = delta

    @classmethod
    def _trusted(cls, tree: Dict[str, Any], neighbouring: str = "add_remove", delta: Optional[float] = None) -> "DpEvent":
        ev = cls.__new__(cls)
        ev._tree = tree
        ev.neighbouring = neighbouring
        ev.delta = delta
        return ev

    # Constructors --------------------------------------------------------------------------
    @classmethod
    def no_op(cls) -> "DpEvent":
        """Nothing that touches private data."""
        return cls({"type": "no_op"})

    @classmethod
    def gaussian(cls, noise_multiplier: float) -> "DpEvent":
        """Gaussian mechanism, noise std = noise_multiplier × L2 sensitivity."""
        return cls({"type": "gaussian", "noise_multiplier": _num(noise_multiplier)})

    @classmethod
    def laplace(cls, noise_multiplier: float) -> "DpEvent":
        """Laplace mechanism, scale b = noise_multiplier × L1 sensitivity."""
        return cls({"type": "laplace", "noise_multiplier": _num(noise_multiplier)})

    @classmethod
    def epsilon_delta(cls, epsilon: float, delta: float) -> "DpEvent":
        """A mechanism known only to be (ε, δ)-DP."""
        return cls({"type": "epsilon_delta", "epsilon": _num(epsilon), "delta": _num(delta)})

    @classmethod
    def poisson_sampled(cls, q: float, event: "EventLike") -> "DpEvent":
        """``event`` on a Poisson sample: each record independently with probability q."""
        return cls({"type": "poisson_sampled", "q": _num(q), "event": _as_event(event)._tree})

    @classmethod
    def sampled_without_replacement(cls, n: int, m: int, event: "EventLike") -> "DpEvent":
        """``event`` on a uniformly random subset of exactly m of the n records."""
        return cls({"type": "sampled_without_replacement", "n": n, "m": m, "event": _as_event(event)._tree})

    @classmethod
    def self_composed(cls, event: "EventLike", count: int) -> "DpEvent":
        """``event`` run ``count`` times."""
        return cls({"type": "self_composed", "event": _as_event(event)._tree, "count": count})

    @classmethod
    def composed(cls, events: Sequence["EventLike"]) -> "DpEvent":
        """The events, one after another (adaptively)."""
        return cls({"type": "composed", "events": [_as_event(e)._tree for e in events]})

    @classmethod
    def dpsgd(cls, noise_multiplier: float, sample_rate: float, steps: int) -> "DpEvent":
        """DP-SGD: ``steps`` × Poisson(sample_rate) ∘ Gaussian(noise_multiplier)."""
        step: Dict[str, Any] = {"type": "gaussian", "noise_multiplier": _num(noise_multiplier)}
        if sample_rate != 1:
            step = {"type": "poisson_sampled", "q": _num(sample_rate), "event": step}
        return cls({"type": "self_composed", "event": step, "count": steps})

    @classmethod
    def from_file(cls, path: Union[str, "os.PathLike[str]"]) -> "DpEvent":
        """An event file or a sampler config, read as ``dpaudit account``/``check`` read it."""
        ans = _call("load", {"path": os.fspath(path)})
        return cls._trusted(ans["event"], ans["neighbouring"], None if ans["delta"] is None else _f(ans["delta"]))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, name: str = "<dict>") -> "DpEvent":
        """The dict form: an event tree (``{"type": "gaussian", ...}``, as in event files), a
        whole event file (``schema_version``, ``neighbouring``, ``delta``, ``event``), or
        dp_accounting's named-tuple form (``class_name`` keys, nested as dicts)."""
        if "class_name" in d:
            return cls.from_dp_accounting(d)
        try:
            value = _plain(d)
        except RecursionError:
            raise InputError(_TOO_DEEP) from None
        ans = _call("from_value", {"value": value, "name": name})
        return cls._trusted(ans["event"], ans["neighbouring"], None if ans["delta"] is None else _f(ans["delta"]))

    @classmethod
    def from_json(cls, text: str) -> "DpEvent":
        """:meth:`from_dict` of a JSON text (dpaudit's form or dp_accounting's named-tuple form)."""
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise InputError(f"not JSON: {e}") from None
        except RecursionError:
            raise InputError(_TOO_DEEP) from None
        if not isinstance(d, dict):
            raise InputError("an event in JSON must be an object")
        return cls.from_dict(d, name="<json>")

    @classmethod
    def from_dp_accounting(cls, event: Any) -> "DpEvent":
        """Converts a dp_accounting ``DpEvent`` (or its named tuple, or that as a dict):
        Gaussian, Laplace, PoissonSampled, SampledWithoutReplacement, SelfComposed, Composed,
        EpsilonDelta, NoOp and NonPrivate events (a non-private part makes ε = ∞ at every
        δ < 1, as dp_accounting answers). Others have no dpaudit equivalent and raise
        :class:`InputError` naming the sub-event's path."""
        try:
            tree = _from_dp_accounting(event, "event")
        except RecursionError:
            raise InputError(_TOO_DEEP) from None
        return cls(tree)

    # Forms ---------------------------------------------------------------------------------
    def to_dict(self) -> Dict[str, Any]:
        """The event tree as a dict (the JSON form of event files' ``[event]``)."""
        return json.loads(json.dumps(self._tree))

    def to_json(self) -> str:
        """:meth:`to_dict` as JSON text."""
        return json.dumps(self._tree)

    @property
    def type(self) -> str:
        """The node's type (``gaussian``, ``composed``, ...)."""
        return str(self._tree["type"])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, DpEvent) and self._tree == other._tree

    def __hash__(self) -> int:
        return hash(json.dumps(self._tree, sort_keys=True))

    def __repr__(self) -> str:
        return f"DpEvent({self.to_json()})"


def _plain(x: Any) -> Any:
    """Converts floats to the native JSON convention (non-finite as strings)."""
    if isinstance(x, Mapping):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, float):
        return _num(x)
    return x


def _fields_of(ev: Any) -> Tuple[str, Dict[str, Any]]:
    """(class name, fields) of a dp_accounting event, named tuple or dict form."""
    if isinstance(ev, Mapping):
        d = dict(ev)
        return str(d.pop("class_name", "")), d
    if hasattr(ev, "_asdict") and hasattr(ev, "class_name"):
        d = dict(ev._asdict())
        name = d.pop("class_name")
        return (name.decode() if isinstance(name, bytes) else str(name)), d
    if hasattr(ev, "__attrs_attrs__"):
        return type(ev).__name__, {a.name: getattr(ev, a.name) for a in ev.__attrs_attrs__}
    return type(ev).__name__, {}


def _from_dp_accounting(ev: Any, path: str) -> Dict[str, Any]:
    name, f = _fields_of(ev)

    def need(key: str) -> Any:
        if key not in f:
            raise InputError(
                f"field `{path}.{key}`: {name} without `{key}`", field=f"{path}.{key}"
            )
        return f[key]

    if name == "GaussianDpEvent":
        return {"type": "gaussian", "noise_multiplier": _num(need("noise_multiplier"))}
    if name == "LaplaceDpEvent":
        return {"type": "laplace", "noise_multiplier": _num(need("noise_multiplier"))}
    if name == "EpsilonDeltaDpEvent":
        return {"type": "epsilon_delta", "epsilon": _num(need("epsilon")), "delta": _num(need("delta"))}
    if name == "NoOpDpEvent":
        return {"type": "no_op"}
    if name == "NonPrivateDpEvent":
        return {"type": "non_private"}
    if name == "PoissonSampledDpEvent":
        return {
            "type": "poisson_sampled",
            "q": _num(need("sampling_probability")),
            "event": _from_dp_accounting(need("event"), f"{path}.event"),
        }
    if name == "SampledWithoutReplacementDpEvent":
        return {
            "type": "sampled_without_replacement",
            "n": need("source_dataset_size"),
            "m": need("sample_size"),
            "event": _from_dp_accounting(need("event"), f"{path}.event"),
        }
    if name == "SelfComposedDpEvent":
        return {
            "type": "self_composed",
            "event": _from_dp_accounting(need("event"), f"{path}.event"),
            "count": need("count"),
        }
    if name == "ComposedDpEvent":
        return {
            "type": "composed",
            "events": [_from_dp_accounting(e, f"{path}.events[{i}]") for i, e in enumerate(need("events"))],
        }
    supported = ", ".join(sorted(_DP_ACCOUNTING))
    raise InputError(
        f"field `{path}`: dp_accounting's {name or 'object'} has no dpaudit equivalent (supported: {supported})",
        field=path,
    )


#: What ``account``/``check`` accept as an event: a :class:`DpEvent`, a path to an event file
#: or sampler config, a dict (dpaudit's or dp_accounting's form) or a dp_accounting event.
EventLike = Union[DpEvent, str, "os.PathLike[str]", Mapping[str, Any], Any]


def _as_event(x: EventLike) -> DpEvent:
    if isinstance(x, DpEvent):
        return x
    if isinstance(x, (str, os.PathLike)):
        return DpEvent.from_file(x)
    if isinstance(x, Mapping):
        return DpEvent.from_dict(x)
    if hasattr(x, "__attrs_attrs__") or hasattr(x, "_asdict"):
        return DpEvent.from_dp_accounting(x)
    raise InputError(f"field `event`: expected a DpEvent, a path, a dict or a dp_accounting event, got {type(x).__name__}", field="event")


def _accountants(a: Union[str, Sequence[str]]) -> Union[str, List[str]]:
    return a if isinstance(a, str) else [str(x) for x in a]


# --------------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Result:
    """One accountant's answer. ``value`` is ε for an ε(δ) question, δ for a δ(ε) one."""

    accountant: str
    value: float
    kind: str
    epsilon: float
    delta: float
    details: Dict[str, float] = field(default_factory=dict)
    diagnostics: List[Dict[str, Any]] = field(default_factory=list)

    @property
    def sound(self) -> bool:
        """True for ``exact`` and ``upper_bound`` (never for an estimate)."""
        return self.kind in SOUND_KINDS

    @classmethod
    def _from(cls, d: Mapping[str, Any], question: str) -> "Result":
        eps, delta = _f(d["epsilon"]), _f(d["delta"])
        return cls(
            accountant=d["accountant"],
            value=eps if question == "epsilon" else delta,
            kind=d["kind"],
            epsilon=eps,
            delta=delta,
            details={k: _f(v) for k, v in d.get("details", {}).items()},
            diagnostics=list(d.get("diagnostics", [])),
        )


@dataclass(frozen=True)
class Accounting:
    """Every requested accountant's answer, the ones that could not answer (``skipped``:
    accountant → reason) and the warnings, as ``dpaudit account`` reports them."""

    question: str
    results: List[Result]
    skipped: Dict[str, str]
    warnings: List[Dict[str, Any]]
    report: Dict[str, Any]

    def sound(self) -> Optional[Result]:
        """The smallest sound answer (exact or upper bound; never an estimate), or None."""
        ok = [r for r in self.results if r.sound]
        return min(ok, key=lambda r: r.value) if ok else None

    @property
    def epsilon(self) -> float:
        """The smallest sound ε (ε(δ) questions); raises InputError when none is sound."""
        s = self.sound()
        if s is None:
            raise InputError("no sound accountant (exact or upper bound) could account this event: " + "; ".join(f"{k}: {v}" for k, v in self.skipped.items()))
        return s.epsilon

    def __getitem__(self, accountant: str) -> Result:
        for r in self.results:
            if r.accountant == accountant:
                return r
        raise KeyError(accountant)

    @classmethod
    def _from(cls, rep: Mapping[str, Any], question: str) -> "Accounting":
        return cls(
            question=question,
            results=[Result._from(r, question) for r in rep.get("results", [])],
            skipped={s["accountant"]: s["reason"] for s in rep.get("skipped", [])},
            warnings=list(rep.get("warnings", [])),
            report=dict(rep),
        )


@dataclass(frozen=True)
class Verdict:
    """A budget verdict. ``status``: ``pass`` (a sound ε is within the budget) or ``fail`` (the
    smallest sound ε exceeds it); with no sound number, :func:`check` raises :class:`InputError`
    as ``dpaudit check`` exits 2. The evidence: the sound
    ε, its accountant and kind, δ and the margin budget − ε."""

    status: str
    budget: float
    epsilon: Optional[float]
    delta: Optional[float]
    accountant: Optional[str]
    kind: Optional[str]
    margin: Optional[float]
    message: str

    @property
    def holds(self) -> bool:
        """True only when a sound bound shows the budget holds."""
        return self.status == "pass"


@dataclass(frozen=True)
class Check:
    """``check``'s answer: the verdict and the accounting it rests on."""

    verdict: Verdict
    accounting: Accounting

    @property
    def holds(self) -> bool:
        return self.verdict.holds


@dataclass(frozen=True)
class Calibration:
    """``calibrate``'s answer: the calibrated value (on the safe side), the accountant's result
    at it, the calibrated event, a note when another sound accountant had to answer, and the
    warnings and report of ``dpaudit calibrate`` (a CLT estimate is warned about there and here)."""

    solve_for: str
    value: float
    result: Result
    event: DpEvent
    evaluations: int
    note: Optional[str]
    warnings: List[Dict[str, Any]] = field(default_factory=list)
    report: Dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Analysis:
    """``analyze``'s answer: the accountants' totals (``accounting``), the detailed per-step
    record (``detail``: what ``analyze.json`` holds) and the report."""

    accounting: Accounting
    detail: Dict[str, Any]
    report: Dict[str, Any]


# --------------------------------------------------------------------------------------------
# Operations
# --------------------------------------------------------------------------------------------


def account(
    event: EventLike,
    *,
    delta: Optional[float] = None,
    epsilon: Optional[float] = None,
    accountants: Union[str, Sequence[str]] = "all",
    neighbouring: Optional[str] = None,
) -> Accounting:
    """ε at ``delta`` (or δ at ``epsilon``) by each accountant (``gdp``, ``clt``, ``rdp``,
    ``pld``, or ``all``), as ``dpaudit account``. δ defaults to the event file's."""
    ev = _as_event(event)
    if epsilon is None and delta is None:
        delta = ev.delta
        if delta is None:
            raise InputError(
                "field `delta`: no δ given: pass delta (or set `delta` in the file), or epsilon to ask for δ",
                field="delta",
            )
    rep = _call(
        "account",
        {
            "event": ev._tree,
            "neighbouring": neighbouring or ev.neighbouring,
            "delta": _num(delta),
            "epsilon": _num(epsilon),
            "accountants": _accountants(accountants),
        },
    )
    return Accounting._from(rep, "delta" if epsilon is not None else "epsilon")


def check(
    event: EventLike,
    max_epsilon: float,
    delta: Optional[float] = None,
    *,
    accountants: Union[str, Sequence[str]] = "all",
    neighbouring: Optional[str] = None,
) -> Check:
    """The smallest sound ε at ``delta`` against the budget ``max_epsilon``, by the same chain
    as ``dpaudit check`` (an estimate never decides). A path is read as the CLI reads it (its δ,
    neighbouring relation and input warnings). Where the CLI exits 2 (no sound accountant
    applies, so the budget cannot be checked) this raises :class:`InputError` with its message."""
    ev = _as_event(event)
    if delta is None:
        delta = ev.delta
    if delta is None:
        raise InputError("field `delta`: no δ given: pass delta or set `delta` in the file", field="delta")
    req: Dict[str, Any] = {
        "delta": _num(delta),
        "max_epsilon": _num(max_epsilon),
        "accountants": _accountants(accountants),
    }
    if isinstance(event, (str, os.PathLike)) and neighbouring is None:
        req["path"] = os.fspath(event)
    else:
        req["event"] = ev._tree
        req["neighbouring"] = neighbouring or ev.neighbouring
    rep = _call("check", req)
    v = rep["verdicts"][0]
    opt = lambda k: None if v.get(k) is None else _f(v[k])  # noqa: E731
    verdict = Verdict(
        status=v["status"],
        budget=_f(v["budget"]),
        epsilon=opt("epsilon"),
        delta=opt("delta"),
        accountant=v.get("accountant"),
        kind=v.get("bound"),
        margin=opt("margin"),
        message=v["message"],
    )
    return Check(verdict=verdict, accounting=Accounting._from(rep, "epsilon"))


def calibrate(
    target_epsilon: float,
    delta: float,
    *,
    noise_multiplier: Optional[float] = None,
    sample_rate: Optional[float] = None,
    steps: Optional[int] = None,
    solve_for: Optional[str] = None,
    accountant: str = "pld",
    neighbouring: str = "add_remove",
) -> Calibration:
    """DP-SGD calibration, as ``dpaudit calibrate``: give two of noise_multiplier,
    sample_rate (default 1) and steps; the missing one (or ``solve_for``) is solved so that
    ε(δ) ≤ target_epsilon, landing on the safe side."""
    if solve_for is None:
        missing = [k for k, v in (("noise_multiplier", noise_multiplier), ("steps", steps)) if v is None]
        if len(missing) != 1:
            raise InputError(
                "field `solve_for`: give solve_for, or leave out exactly one of noise_multiplier and steps",
                field="solve_for",
            )
        solve_for = missing[0]
    ans = _call(
        "calibrate",
        {
            "target_epsilon": _num(target_epsilon),
            "delta": _num(delta),
            "noise_multiplier": _num(noise_multiplier),
            "sample_rate": _num(sample_rate),
            "steps": steps,
            "solve_for": solve_for,
            "accountant": accountant,
            "neighbouring": neighbouring,
        },
    )
    return Calibration(
        solve_for=ans["solve_for"],
        value=_f(ans["value"]),
        result=Result._from(ans["result"], "epsilon"),
        event=DpEvent._trusted(ans["event"], neighbouring, delta),
        evaluations=int(ans["evaluations"]),
        note=ans.get("note"),
        warnings=list(ans.get("warnings", [])),
        report=dict(ans.get("report", {})),
    )


def analyze(
    config: Union[str, "os.PathLike[str]", Mapping[str, Any]],
    *,
    accountants: Union[str, Sequence[str]] = "all",
    delta: Optional[float] = None,
) -> Analysis:
    """Diffusion sampling analysis of a sampler configuration (a TOML path, or the same as a
    dict), as ``dpaudit analyze``: per-step μ_t, totals by accountant with their kinds."""
    req: Dict[str, Any] = {"accountants": _accountants(accountants), "delta": _num(delta)}
    if isinstance(config, Mapping):
        req["config"] = _plain(config)
    else:
        req["path"] = os.fspath(config)
    ans = _call("analyze", req)
    rep = ans["report"]
    return Analysis(accounting=Accounting._from(rep, "epsilon"), detail=ans["analysis"], report=rep)
