#!/usr/bin/env python3
"""Writes serverless.csv and serverless.sizes.csv: the simulator's replayed trace.

It is synthetic, not a recording. Its shape follows what published serverless and
model-serving traces report (Shahrad et al., "Serverless in the Wild", ATC 2020, on Azure
Functions), which the simulator's own generator (Zipf ranks that drift) does not have:

- popularity is heavy-tailed per model (Pareto rates): a few percent of the models take most
  requests, and most models are asked for a few times a day;
- a day/night cycle: the rate of every interactive model rises and falls by a factor of 3
  over 24 hours, each team's peak a few hours from the others';
- timer-triggered models: a fifth of them are called in a batch every 5, 15 or 60 minutes;
- models come and go: each lives for a random part of the day (a deploy, a retirement);
- sizes depend on the model's kind (small classifiers, medium encoders, a few large
  generative models), and popular models are not smaller than the rest.

Deterministic: `python3 serverless.py` always writes the same files.
"""

import math
import random

rng = random.Random(33)
MODELS = 2000
DAY = 24 * 3600.0
TARGET = 150_000  # requests, about 1.7 a second

MIB = 1 << 20
kinds = [  # (share, median MiB, sigma, max MiB)
    (0.55, 96, 0.7, 1024),
    (0.35, 512, 0.6, 4096),
    (0.10, 3072, 0.5, 8192),
]

sizes = []
for m in range(MODELS):
    u, acc = rng.random(), 0.0
    for share, median, sigma, top in kinds:
        acc += share
        if u <= acc:
            break
    mib = int(min(top, max(16, median * math.exp(sigma * rng.gauss(0, 1)))))
    sizes.append(mib * MIB)

requests = []
weights = [rng.paretovariate(0.9) for _ in range(MODELS)]
scale = TARGET / DAY / sum(weights) * 0.8
for m in range(MODELS):
    start = rng.random() * DAY * 0.5 if rng.random() < 0.3 else 0.0
    end = DAY - (rng.random() * DAY * 0.5 if rng.random() < 0.3 else 0.0)
    if rng.random() < 0.2:
        period = rng.choice([300.0, 900.0, 3600.0])
        batch = max(1, int(weights[m] * scale * period * 0.25))
        phase = rng.random() * period
        t = start + phase
        while t < end:
            for i in range(min(batch, 50)):
                requests.append((int((t + i * 0.2) * 1000), m))
            t += period
        continue
    rate = weights[m] * scale
    peak = rng.random() * DAY
    t = start
    # Thinning: candidates at the peak rate (3x the trough), kept by the cycle's height.
    top = rate * 1.5
    while True:
        t += rng.expovariate(top)
        if t >= end:
            break
        height = 1.0 + 0.5 * math.cos(2 * math.pi * (t - peak) / DAY)
        if rng.random() < height / 1.5:
            requests.append((int(t * 1000), m))

requests.sort()
with open("serverless.csv", "w") as f:
    f.write("# synthetic, serverless-shaped: see serverless.py\ntime_ms,model\n")
    for at, m in requests:
        f.write(f"{at},f{m}\n")
with open("serverless.sizes.csv", "w") as f:
    f.write("model,bytes\n")
    for m, b in enumerate(sizes):
        f.write(f"f{m},{b}\n")
print(len(requests), "requests,", sum(sizes) / (1 << 40), "TiB of models")
