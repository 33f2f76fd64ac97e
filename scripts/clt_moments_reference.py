"""Reference values of the per-step CLT functionals of the p-subsampled Gaussian trade-off
C_p(G_mu) (Dong-Roth-Su 2022, Lemma 5.5; as written in diffusion-sampling-privacy Appendix A):
kl, kappa2, kappa3 (uncentred, Thm 3.5 condition 4) and kappa3_bar (centred, Thm 3.4).

Computed with mpmath at 40 digits, integrating over [mu/2, inf) split at every point where the
integrand changes regime (the Z transition, the Gaussian centre, the |Z - kl| kink).
Run: python3 scripts/clt_moments_reference.py > fixtures/reference/clt_moments_mpmath.csv
Not part of CI.
"""
import mpmath as mp

mp.mp.dps = 30


def functionals(mu, p):
    mu = mp.mpf(mu)
    p = mp.mpf(p)
    sq = mp.sqrt(2 * mp.pi)

    def phi_shift(x):  # phi(x - mu)
        return mp.exp(-(x - mu) ** 2 / 2) / sq

    def phi(x):
        return mp.exp(-x * x / 2) / sq

    def Z(x):
        t = mu * (x - mu / 2)
        return mp.log1p(p * mp.expm1(t))  # no cancellation for tiny p·t

    a = mu / 2
    x0 = a + mp.log((1 - p) / p) / mu if p < mp.mpf(1) / 2 else a
    hi = max(mu, min(x0, 4 * mu)) + 15
    pts = {a, hi}
    for j in (0.25, 0.5, 1, 2, 4, 8, 16, 32, 64):
        pts.add(a + j / mu)
        pts.add(x0 + j / mu)
        pts.add(x0 - j / mu)
    for k in range(1, 31):
        pts.add(a + k)
    for c in (mu, 2 * mu, 3 * mu, 4 * mu, x0):
        for k in range(-15, 16):
            pts.add(c + k)
    pts = sorted(x for x in pts if a <= x <= hi)
    pts.append(mp.inf)
    def quad(f, points):
        # mpmath's quad stops on an absolute error estimate: scale the integrand to O(1) first,
        # or integrals of size 1e-45 come back with only ~9 correct digits.
        probe = [x for x in (a + mp.mpf(1) / 4, a + 1, mu, (a + hi) / 2) if x < hi]
        scale = max(abs(f(x)) for x in probe) or mp.mpf(1)
        return scale * mp.quad(lambda x: f(x) / scale, points)

    kl = p * quad(lambda x: Z(x) * (phi_shift(x) - phi(x)), pts)
    k2 = quad(lambda x: Z(x) ** 2 * (p * phi_shift(x) + (2 - p) * phi(x)), pts)
    k3 = quad(lambda x: Z(x) ** 3 * (p * phi_shift(x) + (2 - p) * phi(x)), pts)
    # kink of |Z - kl| at Z(x_c) = kl
    xc = a + mp.log(1 + mp.expm1(kl) / p) / mu
    pts2 = sorted(set(pts[:-1] + [xc] if xc < hi else pts[:-1])) + [mp.inf]
    k3b = quad(lambda x: abs(Z(x) - kl) ** 3 * (p * phi_shift(x) + (1 - p) * phi(x)), pts2) + quad(
        lambda x: (Z(x) + kl) ** 3 * phi(x), pts2
    )
    return kl, k2, k3, k3b


if __name__ == "__main__":
    print(f"# mpmath {mp.__version__}, dps 30; scripts/clt_moments_reference.py")
    print("mu,p,kl,kappa2,kappa3,kappa3_bar")
    mus = ["1e-6", "0.001", "0.05", "0.3", "1", "2", "4", "8", "15", "30", "60", "150", "400", "1000"]
    ps = ["1e-9", "2e-5", "0.001", "0.01", "0.2", "0.5", "0.9", "1"]
    for m in mus:
        for q in ps:
            kl, k2, k3, k3b = functionals(m, q)
            print(f"{m},{q},{mp.nstr(kl, 20)},{mp.nstr(k2, 20)},{mp.nstr(k3, 20)},{mp.nstr(k3b, 20)}")
