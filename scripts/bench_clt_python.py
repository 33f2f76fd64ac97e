"""Python anchor for benches/accountants.rs: the DRS Lemma 5.5 per-step kl and kappa2 with
scipy.integrate.quad (split at the regime changes so that it stays correct for large mu), for the
same 50 heterogeneous steps as the criterion bench (mu = 1e-3 * 5e5^(i/49), p = 0.01), and
GDP eps(delta) with scipy brentq. Not part of CI.
Run: python3 scripts/bench_clt_python.py
"""
import math
import time

import numpy as np
from scipy import integrate, optimize, special


def functionals(p, mu):
    def Z(x):
        t = mu * (x - mu / 2)
        return np.log1p(p * np.expm1(t)) if t < 30 else t + np.log(p + (1 - p) * np.exp(-t))

    phi = lambda x: math.exp(-x * x / 2) / math.sqrt(2 * math.pi)
    a = mu / 2
    pts = [a, mu, mu + 10]
    if p < 0.5:
        pts.append(a + math.log((1 - p) / p) / mu)
    pts = sorted(x for x in set(pts) if x >= a)
    kl = k2 = 0.0
    for lo, hi in zip(pts, pts[1:] + [math.inf]):
        kl += integrate.quad(lambda x: Z(x) * (phi(x - mu) - phi(x)), lo, hi, epsabs=0, epsrel=1e-10)[0]
        k2 += integrate.quad(lambda x: Z(x) ** 2 * (p * phi(x - mu) + (2 - p) * phi(x)), lo, hi, epsabs=0, epsrel=1e-10)[0]
    return p * kl, k2


def gdp_eps(mu, delta):
    def f(e):
        return special.ndtr(-e / mu + mu / 2) - math.exp(e) * special.ndtr(-e / mu - mu / 2) - delta

    return optimize.brentq(f, 0, 500, xtol=1e-14)


steps = [(0.01, 1e-3 * (5e5) ** (i / 49)) for i in range(50)]
n = 5
t = time.perf_counter()
for _ in range(n):
    K = s2 = 0.0
    for p, mu in steps:
        kl, k2 = functionals(p, mu)
        K += kl
        s2 += k2
dt = (time.perf_counter() - t) / n
print(f"scipy quad CLT, 50 steps: {dt * 1e3:.2f} ms ({dt / 50 * 1e6:.1f} us/step), mu_clt = {2 * K / math.sqrt(s2):.12g}")
t = time.perf_counter()
m = 200
for _ in range(m):
    gdp_eps(1.0, 1e-5)
dt = (time.perf_counter() - t) / m
print(f"scipy brentq GDP eps(delta), mu = 1: {dt * 1e6:.1f} us")
