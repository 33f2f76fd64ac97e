"""dpaudit against PyTorch + diffusers on the membership attacks of `dpaudit mia` (loss, SecMI,
PIA; src/attacks/mia.rs), on the CPU with the same number of threads or on a CUDA GPU at each
precision, interleaved so that both sides see the same load on a shared machine. Outside CI.

Models:
* mnist: models/mnist-ddpm (diffusers UNet2DModel, 176,849 parameters) on the MNIST split;
* cifar: the DDPM-CIFAR10 architecture (google/ddpm-cifar10-32's config: blocks 128-256-256-256,
  attention at 16x16, 35.7M parameters) with seeded random weights, on seeded random 32x32 images
  (a temporary folder; speed does not depend on the weights).

Each round runs, for every (model, attack), `dpaudit mia --scores-out` as a subprocess and the
same computation in PyTorch in this process, alternating which goes first. dpaudit's time is its
whole process (start-up, loading and checking the weights, metrics included); PyTorch's is its
scoring loop only (the model is loaded once). Throughput is images (members + non-members) per
second of wall time; the CPU column is the ratio of CPU seconds (user + sys). The process ratio
is the headline (it charges dpaudit for start-up and loading, PyTorch for neither); the
attack-only column divides PyTorch's loop time by dpaudit's own scoring loop (the `timing:` line
of `DPAUDIT_TIMING=phases`, scores back on the host, no metrics): the same work on each side.
SecMI and PIA are deterministic, so their scores are compared record by record (largest
relative difference); the loss attack draws its noise from each side's own generator, so only
its timing compares.

    /work/pyvenv/bin/python scripts/compare_attacks_torch.py --threads 1,2 --rounds 2

prints one table (both models, loss/SecMI/PIA, each thread count) and the largest relative score
difference over every SecMI and PIA record compared.

On a GPU (a dpaudit built with `--features cudnn` or `cuda`; ../shared/GPU.md):

    python3 scripts/compare_attacks_torch.py --device cuda --precisions fp32,tf32,bf16 \
        --dpaudit target-cuda/release/dpaudit --n-mnist 1024 --n-cifar 256 --batch 256

compares dpaudit `--precision fp32` with PyTorch with TF32 off (cuDNN and matmul), `tf32` with
PyTorch's defaults (TF32 convolutions, fp32 matmul), `bf16` with the PyTorch model in bfloat16.
A first round per row is a warm-up (not counted: CUDA/cuDNN start-up, kernel JIT caches). Two
throughputs are given for dpaudit: its whole process, and its scoring (the report's elapsed_s,
weights loaded and CUDA started, the metrics included), and its attack alone (the `timing:` line
of `DPAUDIT_TIMING=phases`: the scoring loop with the scores back on the host, no metrics: the
same work as PyTorch's timed loop); `--fixed-cost` adds a fourth,
its steady-state throughput once the per-run costs that PyTorch's warm-up pays are subtracted
(measured on 2 + 2 images). With more than 128 MNIST
images per side the split is made of the data file's first rows (and the model folder copied
without training.json, whose members hash would refuse that split): speed only. For SecMI and
PIA at tf32/bf16 the largest score difference is against PyTorch at the same setting; the AUC
of each precision is printed with fp32's bootstrap interval.

Under load, PyTorch's OpenMP regions wait on descheduled threads at every operator, while
dpaudit's batch-parallel forward joins once per forward: compare the 1-thread rows (and the CPU
column) before reading a 2-thread ratio as an idle-machine figure.
"""
import argparse
import csv
import gzip
import hashlib
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib

import numpy as np
import torch
from diffusers import DDPMScheduler, UNet2DModel

CIFAR_CONFIG = dict(
    sample_size=32, in_channels=3, out_channels=3, layers_per_block=2,
    block_out_channels=(128, 256, 256, 256),
    down_block_types=("DownBlock2D", "AttnDownBlock2D", "DownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "UpBlock2D", "AttnUpBlock2D", "UpBlock2D"),
    attention_head_dim=None, downsample_padding=0, flip_sin_to_cos=False, freq_shift=1,
    norm_eps=1e-6, norm_num_groups=32, act_fn="silu", mid_block_scale_factor=1,
    center_input_sample=False, time_embedding_type="positional",
)


def sha(b):
    return hashlib.sha256(b).hexdigest()


def ix_sha(ix):
    return sha(",".join(str(i) for i in ix).encode())


def cifar_setup(tmp, n):
    torch.manual_seed(0)
    model = UNet2DModel(**CIFAR_CONFIG).eval()
    ck = os.path.join(tmp, "ddpm-cifar10-random")
    model.save_pretrained(ck, safe_serialization=True)
    DDPMScheduler(num_train_timesteps=1000, beta_start=1e-4, beta_end=0.02,
                  beta_schedule="linear").save_pretrained(ck)
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(2 * n, 3, 32, 32)).astype(np.float32)
    data = os.path.join(tmp, "cifar-random.npy")
    np.save(data, x)
    members, nonmembers = list(range(n)), list(range(n, 2 * n))
    split = os.path.join(tmp, "cifar-split.toml")
    with open(split, "w") as f:
        f.write(
            f'schema_version = 1\ndata = "{data}"\ndata_sha256 = "{sha(open(data, "rb").read())}"\n'
            f'seed = 0\nmembers_sha256 = "{ix_sha(members)}"\nnonmembers_sha256 = "{ix_sha(nonmembers)}"\n'
            f'public_sha256 = "{ix_sha([])}"\nmembers = {members}\nnonmembers = {nonmembers}\npublic = []\n'
        )
    return ck, data, split, torch.from_numpy(x), members + nonmembers


def mnist_setup(root, n, tmp):
    split = os.path.join(root, "fixtures/splits/mnist.toml")
    s = tomllib.load(open(split, "rb"))
    data = os.path.join(root, s["data"])
    raw = gzip.decompress(open(data, "rb").read())
    rec = np.frombuffer(raw, dtype=np.uint8).reshape(-1, 785)
    x = (rec[:, 1:].astype(np.float32) / 127.5 - 1.0).reshape(-1, 1, 28, 28)
    ck = os.path.join(root, "models/mnist-ddpm")
    if n <= min(len(s["members"]), len(s["nonmembers"])):
        ix = s["members"][:n] + s["nonmembers"][:n]
        return ck, data, split, torch.from_numpy(x[ix]), ix
    # Speed only: the first 2n rows as members and non-members, the model without its record.
    copy = os.path.join(tmp, "mnist-ddpm")
    os.makedirs(copy, exist_ok=True)
    for f in ("config.json", "diffusion_pytorch_model.safetensors", "scheduler_config.json"):
        shutil.copy(os.path.join(ck, f), copy)
    members, nonmembers = list(range(n)), list(range(n, 2 * n))
    split = os.path.join(tmp, "mnist-speed-split.toml")
    with open(split, "w") as f:
        f.write(
            f'schema_version = 1\ndata = "{data}"\ndata_sha256 = "{s["data_sha256"]}"\n'
            f'seed = 0\nmembers_sha256 = "{ix_sha(members)}"\nnonmembers_sha256 = "{ix_sha(nonmembers)}"\n'
            f'public_sha256 = "{ix_sha([])}"\nmembers = {members}\nnonmembers = {nonmembers}\npublic = []\n'
        )
    return copy, data, split, torch.from_numpy(x[: 2 * n]), members + nonmembers


def set_torch_precision(precision):
    """fp32: TF32 off everywhere; tf32: PyTorch's defaults (TF32 convolutions, fp32 matmul)."""
    if torch.cuda.is_available():
        torch.backends.cudnn.allow_tf32 = precision != "fp32"
        torch.backends.cuda.matmul.allow_tf32 = False


class Torch:
    """The attacks of src/attacks/mia.rs in PyTorch (DDIM arithmetic in float64 as dpaudit's)."""

    def __init__(self, ck, device="cpu"):
        self.device = torch.device(device)
        self.model = UNet2DModel.from_pretrained(ck).eval().to(self.device)
        self.model_bf16 = None
        self.dtype = torch.float32
        self.abar = DDPMScheduler.from_pretrained(ck).alphas_cumprod.double().to(self.device)

    def set_precision(self, precision):
        set_torch_precision(precision)
        if precision == "bf16" and self.model_bf16 is None:
            import copy
            self.model_bf16 = copy.deepcopy(self.model).to(torch.bfloat16)
        self.dtype = torch.bfloat16 if precision == "bf16" else torch.float32

    def eps(self, x, s):
        ts = torch.full((x.shape[0],), s, dtype=torch.int64, device=self.device)
        if self.dtype == torch.bfloat16:
            return self.model_bf16(x.to(torch.bfloat16), ts).sample.float()
        return self.model(x, ts).sample

    def ddim(self, x, s, t):
        e = self.eps(x, s).double()
        x0 = (x.double() - (1 - self.abar[s]).sqrt() * e) / self.abar[s].sqrt()
        return (self.abar[t].sqrt() * x0 + (1 - self.abar[t]).sqrt() * e).float()

    def noisy(self, x0, e, t):
        return (self.abar[t].sqrt() * x0.double() + (1 - self.abar[t]).sqrt() * e.double()).float()

    def scores(self, attack, x, t, k, draws, p, batch):
        out = []
        with torch.no_grad():
            for b in range(0, x.shape[0], batch):
                xs = x[b:b + batch].to(self.device)
                if attack == "secmi":
                    target, s = t - k, 0
                    while s < target:
                        nxt = min(s + k, target)
                        xs = self.ddim(xs, s, nxt)
                        s = nxt
                    back = self.ddim(self.ddim(xs, target, t), t, target)
                    sc = -((back.double() - xs.double()) ** 2).flatten(1).mean(1)
                elif attack == "pia":
                    e0 = self.eps(xs, 0)
                    pred = self.eps(self.noisy(xs, e0, t), t)
                    sc = -((e0.double() - pred.double()).abs() ** p).flatten(1).mean(1)
                else:  # loss: own noise draws
                    g = torch.Generator(device=self.device).manual_seed(b)
                    sc = torch.zeros(xs.shape[0], dtype=torch.float64, device=self.device)
                    for _ in range(draws):
                        e = torch.randn(xs.shape, generator=g, device=self.device)
                        pred = self.eps(self.noisy(xs, e, t), t)
                        sc -= ((e.double() - pred.double()) ** 2).flatten(1).mean(1)
                    sc /= draws
                out.extend(sc.tolist())
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        return out


def cpu_seconds(who):
    r = resource.getrusage(who)
    return r.ru_utime + r.ru_stime


def run_dpaudit(exe, ck, data, split, attack, t, k, n, batch, threads, tmp, device="cpu", precision=None,
                bootstrap=10):
    """Runs `dpaudit mia`; returns (wall s, CPU s, scores by record, mia.json)."""
    out = os.path.join(tmp, f"scores-{attack}.csv")
    rep = os.path.join(tmp, f"report-{attack}")
    for f in (out, os.path.join(rep, "mia.json"), os.path.join(rep, "mia.csv")):
        if os.path.exists(f):
            os.remove(f)
    cmd = [exe, "mia", "--checkpoint", ck, "--data", data, "--split", split, "--attack", attack,
           "--timesteps", str(t), "--secmi-k", str(k), "--max-examples", str(n),
           "--bootstrap", str(bootstrap), "--device", device, "--quiet",
           "--scores-out", out, "--out", rep, "--force"]
    if batch:
        cmd += ["--batch-size", str(batch)]
    if precision:
        cmd += ["--precision", precision]
    # `phases`: stderr says how long the attack's scoring took (no wait after each forward).
    env = dict(os.environ, RAYON_NUM_THREADS=str(threads), DPAUDIT_TIMING="phases")
    c0, w0 = cpu_seconds(resource.RUSAGE_CHILDREN), time.perf_counter()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - w0, cpu_seconds(resource.RUSAGE_CHILDREN) - c0
    if r.returncode != 0:
        sys.exit(f"dpaudit failed ({r.returncode}): {' '.join(cmd)}\n{r.stderr}")
    scores = {int(row["record_id"]): float(row["score"]) for row in csv.DictReader(open(out))}
    report = json.load(open(os.path.join(rep, "mia.json")))
    # "timing: pia at t = 100, 10000 records: 0.5123 s": the scoring alone, as PyTorch's loop.
    spent = [float(line.rsplit(": ", 1)[1].split()[0]) for line in r.stderr.splitlines()
             if line.startswith(f"timing: {attack} at t = ")]
    report["_attack_s"] = sum(spent) if spent else None
    return wall, cpu, scores, report


def auc_of(report):
    r = [x for x in report.get("results", []) if not x.get("shuffled_labels")]
    if not r:
        return None, None
    ci = r[0].get("auc_interval") or r[0].get("auc_ci")
    if isinstance(ci, dict):
        ci = [ci.get("lo", ci.get("lower")), ci.get("hi", ci.get("upper"))]
    return r[0]["auc"], ci


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dpaudit", default="target/release/dpaudit")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (each side; CPU)")
    ap.add_argument("--precisions", default="fp32", help="comma-separated, CUDA: fp32,tf32,bf16")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=None, help="uncounted first rounds (default: 1 on CUDA)")
    ap.add_argument("--models", default="mnist,cifar")
    ap.add_argument("--attacks", default="loss,secmi,pia")
    ap.add_argument("--t", type=int, default=100)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--n-mnist", type=int, default=64, help="members and non-members each")
    ap.add_argument("--n-cifar", type=int, default=8, help="members and non-members each")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--bootstrap", type=int, default=10, help="dpaudit's AUC bootstrap resamples")
    ap.add_argument("--json", help="also write the rows here")
    ap.add_argument("--fixed-cost", action="store_true",
                    help="CUDA: also time dpaudit on 2 + 2 images (its fixed cost per run: first use of each "
                         "cuDNN/cuBLAS kernel and shape, candle's kernel modules, the metrics) and give its "
                         "steady-state throughput, (images - 4) / (scoring time - fixed cost)")
    a = ap.parse_args()
    if min(a.n_mnist, a.n_cifar) < 2:
        sys.exit("--n-mnist and --n-cifar must be >= 2 (dpaudit's held-out metrics need 2 of each)")
    cuda = a.device == "cuda"
    warmup = a.warmup if a.warmup is not None else (1 if cuda else 0)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    exe = os.path.abspath(os.path.join(root, a.dpaudit) if not os.path.isabs(a.dpaudit) else a.dpaudit)
    threads = [int(t) for t in a.threads.split(",")] if not cuda else [torch.get_num_threads()]
    precisions = a.precisions.split(",") if cuda else [None]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in a.models.split(","):
            n = a.n_mnist if name == "mnist" else a.n_cifar
            ck, data, split, x, ids = (mnist_setup(root, n, tmp) if name == "mnist" else cifar_setup(tmp, n))
            tm = Torch(ck, a.device)
            for th in threads:
                if not cuda:
                    torch.set_num_threads(th)
                for prec in precisions:
                    tm.set_precision(prec or "fp32")
                    for attack in a.attacks.split(","):
                        runs = []
                        for r in range(warmup + a.rounds):
                            order = ["dpaudit", "torch"] if r % 2 == 0 else ["torch", "dpaudit"]
                            res = {}
                            for side in order:
                                if side == "dpaudit":
                                    res[side] = run_dpaudit(exe, ck, data, split, attack, a.t, a.k, n, a.batch, th,
                                                            tmp, a.device, prec, a.bootstrap)
                                else:
                                    c0, w0 = cpu_seconds(resource.RUSAGE_SELF), time.perf_counter()
                                    sc = tm.scores(attack, x, a.t, a.k, 4, 4.0, a.batch)
                                    res[side] = (time.perf_counter() - w0, cpu_seconds(resource.RUSAGE_SELF) - c0,
                                                 dict(zip(ids, sc)))
                            if r >= warmup:
                                runs.append(res)
                        imgs = len(ids)
                        ratio = [r["torch"][0] / r["dpaudit"][0] for r in runs]
                        cpu_ratio = [r["torch"][1] / r["dpaudit"][1] for r in runs]
                        inproc = [r["dpaudit"][3].get("elapsed_s") for r in runs]
                        rel = None
                        if attack != "loss":
                            # `--max-examples` takes a seeded random subset of each part (not the
                            # first rows), so the records both sides scored are compared.
                            rel = max((abs(r["dpaudit"][2][i] - r["torch"][2][i]) / max(abs(r["torch"][2][i]), 1e-30)
                                       for r in runs for i in ids if i in r["dpaudit"][2]), default=None)
                        auc, ci = auc_of(runs[-1]["dpaudit"][3])
                        row = dict(model=name, attack=attack, t=a.t, k=a.k if attack == "secmi" else None,
                                   images=imgs, threads=th, device=a.device, precision=prec or "fp32",
                                   batch=a.batch,
                                   dpaudit_img_s=statistics.median(imgs / r["dpaudit"][0] for r in runs),
                                   dpaudit_scoring_img_s=statistics.median(imgs / e for e in inproc) if all(inproc) else None,
                                   torch_img_s=statistics.median(imgs / r["torch"][0] for r in runs),
                                   ratio_median=statistics.median(ratio), ratio_min=min(ratio), ratio_max=max(ratio),
                                   cpu_ratio_median=statistics.median(cpu_ratio), max_rel_score_diff=rel,
                                   auc=auc, auc_interval=ci,
                                   precision_note=runs[-1]["dpaudit"][3].get("precision"))
                        att = [r["dpaudit"][3].get("_attack_s") for r in runs]
                        if all(att):
                            row["dpaudit_attack_img_s"] = statistics.median(imgs / e for e in att)
                            row["attack_ratio_median"] = statistics.median(
                                (imgs / e) / (imgs / r["torch"][0]) for e, r in zip(att, runs))
                        if row["dpaudit_scoring_img_s"]:
                            row["scoring_ratio_median"] = statistics.median(
                                (imgs / e) / (imgs / r["torch"][0]) for e, r in zip(inproc, runs))
                        if a.fixed_cost and cuda and all(inproc):
                            fixed = [run_dpaudit(exe, ck, data, split, attack, a.t, a.k, 2, a.batch, th, tmp,
                                                 a.device, prec, a.bootstrap)[3]["elapsed_s"] for _ in range(2)]
                            f = min(fixed)
                            row["dpaudit_fixed_s"] = f
                            row["dpaudit_steady_img_s"] = (imgs - 4) / max(statistics.median(inproc) - f, 1e-9)
                            row["steady_ratio"] = row["dpaudit_steady_img_s"] / row["torch_img_s"]
                        rows.append(row)
                        print(json.dumps(row), file=sys.stderr, flush=True)
    gpu = torch.cuda.get_device_name(0) if cuda else None
    if cuda:
        print(f"\nCUDA {gpu}, {a.rounds} interleaved rounds after {warmup} warm-up; torch {torch.__version__}; "
              f"SecMI t = {a.t}, k = {a.k}; PIA and loss at t = {a.t}; batch {a.batch}; PyTorch fp32 = TF32 off, "
              f"tf32 = PyTorch's default (TF32 convolutions), bf16 = model in bfloat16\n")
        fx = a.fixed_cost
        print("| model | attack | precision | images | dpaudit img/s (process) | dpaudit img/s (scoring) | "
              "dpaudit img/s (attack) | PyTorch img/s | "
              "dpaudit/PyTorch process (median [min, max]) | scoring ratio | attack ratio | "
              + ("dpaudit fixed cost s | steady-state ratio | " if fx else "")
              + "largest relative score difference | AUC |")
        print("|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if fx else "") + "---|---|")
        for r in rows:
            diff = "– (own noise draws)" if r["max_rel_score_diff"] is None else f"{r['max_rel_score_diff']:.1e}"
            sc = f"{r['dpaudit_scoring_img_s']:.1f}" if r["dpaudit_scoring_img_s"] else "–"
            sr = f"{r['scoring_ratio_median']:.2f}×" if r.get("scoring_ratio_median") else "–"
            at = f"{r['dpaudit_attack_img_s']:.1f}" if r.get("dpaudit_attack_img_s") else "–"
            ar = f"{r['attack_ratio_median']:.2f}×" if r.get("attack_ratio_median") else "–"
            auc = f"{r['auc']:.4f}" if r["auc"] is not None else "–"
            st = (f"{r['dpaudit_fixed_s']:.2f} | {r['steady_ratio']:.2f}× | " if "steady_ratio" in r
                  else ("– | – | " if fx else ""))
            print(f"| {r['model']} | {r['attack']} | {r['precision']} | {r['images']} | {r['dpaudit_img_s']:.1f} | {sc} | "
                  f"{at} | {r['torch_img_s']:.1f} | {r['ratio_median']:.2f}× [{r['ratio_min']:.2f}, {r['ratio_max']:.2f}] | "
                  f"{sr} | {ar} | {st}{diff} | {auc} |")
        for r in rows:
            if r["precision"] == "fp32" or r["auc"] is None:
                continue
            base = next((b for b in rows if b["model"] == r["model"] and b["attack"] == r["attack"]
                         and b["precision"] == "fp32"), None)
            if base and base["auc_interval"]:
                lo, hi = base["auc_interval"]
                inside = lo <= r["auc"] <= hi
                print(f"{r['model']} {r['attack']} {r['precision']}: AUC {r['auc']:.4f} "
                      f"{'within' if inside else 'OUTSIDE'} fp32's interval [{lo:.4f}, {hi:.4f}]; "
                      f"dpaudit's own check: {r['precision_note']}")
    else:
        print(f"\nCPU, same threads each side, {a.rounds} interleaved rounds; torch {torch.__version__}; "
              f"SecMI t = {a.t}, k = {a.k}; PIA and loss at t = {a.t}; batch {a.batch}\n")
        print("| threads | model | attack | images | dpaudit img/s | PyTorch img/s | dpaudit/PyTorch (median [min, max]) | CPU-time ratio | attack-only ratio | largest relative score difference |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            diff = "– (own noise draws)" if r["max_rel_score_diff"] is None else f"{r['max_rel_score_diff']:.1e}"
            ar = f"{r['attack_ratio_median']:.2f}×" if r.get("attack_ratio_median") else "–"
            print(f"| {r['threads']} | {r['model']} | {r['attack']} | {r['images']} | {r['dpaudit_img_s']:.2f} | "
                  f"{r['torch_img_s']:.2f} | {r['ratio_median']:.2f}× [{r['ratio_min']:.2f}, {r['ratio_max']:.2f}] | "
                  f"{r['cpu_ratio_median']:.2f}× | {ar} | {diff} |")
    diffs = [r["max_rel_score_diff"] for r in rows if r["max_rel_score_diff"] is not None and r["precision"] == "fp32"]
    if diffs:
        print(f"\nlargest relative score difference at fp32 (SecMI, PIA; every record of every round): {max(diffs):.1e}")
    worst = min(rows, key=lambda r: r["ratio_median"])
    print(f"lowest median throughput ratio (process): {worst['ratio_median']:.2f}× ({worst['threads']} threads, "
          f"{worst['model']} {worst['attack']} {worst['precision']})")
    if cuda:
        for line in gpu_acceptance(rows):
            print(line)
    if a.json:
        json.dump(dict(gpu=gpu, torch=torch.__version__, rows=rows), open(a.json, "w"), indent=1)


def gpu_acceptance(rows):
    """The issue's GPU targets per row, on the attack column (the same work as PyTorch's timed
    loop) and on the scoring column: fp32 >= 1.0x PyTorch fp32, tf32 >= 0.9x PyTorch's default."""
    need = {"fp32": 1.0, "tf32": 0.9}
    out = ["", "GPU targets (fp32 >= 1.0x, tf32 >= 0.9x; attack column, then scoring column):"]
    for r in rows:
        if r["precision"] not in need:
            continue
        t = need[r["precision"]]
        att, sco = r.get("attack_ratio_median"), r.get("scoring_ratio_median")
        mark = lambda v: "–" if v is None else f"{v:.2f}x {'ok' if v >= t else 'BELOW'}"
        out.append(f"  {r['model']} {r['attack']} {r['precision']}: attack {mark(att)}, scoring {mark(sco)}")
    return out


if __name__ == "__main__":
    main()
