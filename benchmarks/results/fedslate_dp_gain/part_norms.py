"""Measure the norms of the local and server parts of every unit gradient under sums (a
measurement script: it wraps LocalDPSGD.step_joint and unit_sums to record the norms; the
run itself is the ordinary one). ``python part_norms.py EPISODES``; output: part_norms.txt."""

import sys
import time

import numpy as np

import securefed.rl.fedslate as fs
from securefed.rl.fedslate import FedSlateConfig, run_fedslate

rec = []
orig_step = fs.LocalDPSGD.step_joint
orig_sums = fs.unit_sums
state = {}


def step_joint(self, run, p, *a, **k):
    state["p"] = p
    state["nl"] = sum(t[0].numel() for t in self.network.parameters())
    return orig_step(self, run, p, *a, **k)


def unit_sums(rows, units):
    out = orig_sums(rows, units)
    if "nl" in state:
        nl = state["nl"]
        loc = out[..., :nl].norm(dim=-1)
        srv = out[..., nl:].norm(dim=-1)
        nz = (loc + srv) > 0
        rec.append((state["p"], loc[nz].numpy(), srv[nz].numpy()))
    return out


fs.LocalDPSGD.step_joint = step_joint
fs.unit_sums = unit_sums
c = FedSlateConfig(
    num_candidates=10,
    slate_size=3,
    episodes=int(sys.argv[1]),
    members=1,
    burn_in=600,
    eps_decay=0.9997,
    fusion="dp",
    dp_epsilon=8.0,
    dp_acting="own",
    dp_local_clip=0.1,
    dp_learning="sums",
    seed=0,
)
t = time.process_time()
run_fedslate(c)
print("cpu", time.process_time() - t)
for p in (0, 1):
    L = np.concatenate([r[1] for r in rec if r[0] == p])
    S = np.concatenate([r[2] for r in rec if r[0] == p])
    print(
        "platform",
        p,
        "units",
        L.size,
        "local median",
        np.median(L),
        "server median",
        np.median(S),
        "server/local median ratio",
        np.median(S / L),
        "server share of sq norm",
        np.median(S**2 / (S**2 + L**2)),
    )
    print(
        "  quantiles local",
        np.quantile(L, [0.1, 0.5, 0.9]),
        "server",
        np.quantile(S, [0.1, 0.5, 0.9]),
    )
print("n params local", state["nl"])
