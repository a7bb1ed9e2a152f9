"""Secure aggregation's cost at one edge: time and bytes per round against plain aggregation, at 10, 100 and 500
devices, with no dropout and with 10% of the devices dropping after key sharing.

The protocol runs in process (shared/core/secagg/protocol.py, the code the services run), one device after another
on one core: a device's time is its own work in one round (keys, shares, fixed-point encoding and masking, unmasking
shares), as it would spend it on its own CPU; the edge's time is its work (closing the steps, rebuilding the
secrets, removing the masks, decoding). Bytes are the JSON and safetensors bodies the services send for each step
(shared/wire/secagg.py), not counting HTTP headers. Plain aggregation: each device uploads its update as float32
safetensors and the edge sums them in float64 (aggregate.reduce, what FedAvg's edge_aggregate runs). The update is
a logistic regression on MNIST (784·10 + 10 = 7,850 parameters) unless --params says otherwise; k = 64, f = 20,
t = 60% of the devices. Writes docs/benchmarks/secagg.{md,json}.

    ./fl python bench/secagg.py [--devices 10 100 500] [--params 7850]
    ./fl python bench/secagg.py --render        the page again from docs/benchmarks/secagg.json
"""
from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import BENCHMARKS, earlier_stamp, stamp, stamped  # noqa: E402

from fl_services.shared.core.algorithms import aggregate  # noqa: E402
from fl_services.shared.core.records import encode  # noqa: E402
from fl_services.shared.core.secagg import fixedpoint  # noqa: E402
from fl_services.shared.core.secagg.protocol import AggregatorSession, DeviceSession  # noqa: E402
from fl_services.shared.core.secagg.sites import MASKED  # noqa: E402
from fl_services.shared.wire import secagg as wire  # noqa: E402
from fl_services.shared.wire.client_edge import ClientResultHeader  # noqa: E402

BITS, SCALE_BITS, CLIP, THRESHOLD = 64, 20, 1000.0, 0.6


def one_round(n: int, d: int, dropout: float, seed: int = 0) -> dict[str, float]:
    torch.manual_seed(seed)
    updates = [{"model": {"w": torch.randn(d, dtype=torch.float32) * 0.01}} for _ in range(n)]
    weights = [int(w) for w in torch.randint(50, 500, (n,))]
    dropped = set(range(0, n, round(1 / dropout))) if dropout else set()
    context = secrets.token_bytes(16)
    device_s = [0.0] * n
    up = [0] * n
    down = [0] * n

    def timed(u, fn, *args):
        started = time.perf_counter()
        out = fn(*args)
        device_s[u] += time.perf_counter() - started
        return out

    edge_s = [0.0]

    def at_edge(fn, *args):
        started = time.perf_counter()
        out = fn(*args)
        edge_s[0] += time.perf_counter() - started
        return out

    agg = at_edge(AggregatorSession, list(range(n)), THRESHOLD, d, context, BITS)
    devices = [timed(u, DeviceSession, u, context, BITS) for u in range(n)]
    for u, dev in enumerate(devices):
        c_pk, s_pk = timed(u, dev.keys)
        header = ClientResultHeader(task_id=f"t{u}", client_id=u, num_samples=weights[u], loss=0.5)
        up[u] += len(wire.SecAggKeys(result=header, c_pk=c_pk, s_pk=s_pk).model_dump_json())
        at_edge(agg.add_keys, u, c_pk, s_pk)
    roster = at_edge(agg.close_keys)
    relayed = len(wire.SecAggStep(step="roster", threshold=agg.t, keys=roster, weights=dict(enumerate(weights)))
                  .model_dump_json())
    for u, dev in enumerate(devices):
        down[u] += relayed
        commitment, ciphertexts = timed(u, dev.share, roster, agg.t)
        up[u] += len(wire.SecAggShares(commitment=commitment, ciphertexts=ciphertexts).model_dump_json())
        at_edge(agg.add_shares, u, commitment, ciphertexts)
    survivors = at_edge(agg.close_shares)
    for u, dev in enumerate(devices):
        inbox = agg.inbox(u)
        down[u] += len(wire.SecAggStep(step="inbox", threshold=agg.t, survivors=survivors, ciphertexts=inbox)
                       .model_dump_json())
        if u in dropped:
            continue
        vector = timed(u, fixedpoint.encode, updates[u], weights[u], CLIP, SCALE_BITS, BITS)
        masked = timed(u, dev.mask, vector, inbox, survivors)
        up[u] += len(encode({MASKED: {MASKED: torch.from_numpy(masked.view(np.int64).copy())}},
                            wire.SecAggMaskedHeader(task_id=f"t{u}", client_id=u)))
        at_edge(agg.add_masked, u, masked)
    remaining = at_edge(agg.close_masked)
    for u in remaining:
        down[u] += len(wire.SecAggStep(step="remaining", threshold=agg.t, remaining=remaining).model_dump_json())
        s_shares, b_shares = timed(u, devices[u].unmask, remaining)
        up[u] += len(wire.SecAggUnmask(s_shares=s_shares, b_shares=b_shares).model_dump_json())
        at_edge(agg.add_unmask, u, s_shares, b_shares)
    total = at_edge(agg.total)
    sums = at_edge(fixedpoint.decode, total, fixedpoint.layout({"model": {"w": ((d,), torch.float32)}}), SCALE_BITS,
                   BITS)

    # Plain: float32 uploads, the edge's float64 weighted sum.
    plain_up = [len(encode(updates[u], ClientResultHeader(task_id=f"t{u}", client_id=u, num_samples=weights[u],
                                                          loss=0.5))) for u in remaining]
    started = time.perf_counter()
    plain = aggregate.reduce((float(weights[u]), updates[u]) for u in remaining)
    plain_edge_s = time.perf_counter() - started
    error = float((sums["model"]["w"] - plain.sums["model"]["w"]).abs().max()) / plain.weight
    kept = [u for u in range(n) if u not in dropped]
    return {"devices": n, "params": d, "dropped": len(dropped), "threshold": agg.t,
            "device_s_mean": float(np.mean([device_s[u] for u in kept])),
            "device_s_max": float(np.max([device_s[u] for u in kept])),
            "edge_s": edge_s[0], "plain_edge_s": plain_edge_s,
            "up_bytes_per_device": float(np.mean([up[u] for u in kept])),
            "down_bytes_per_device": float(np.mean([down[u] for u in kept])),
            "plain_up_bytes_per_device": float(np.mean(plain_up)),
            "mean_error": error, "error_bound": 2.0 ** -(SCALE_BITS + 1)}


def render(rows: list[dict[str, float]], line: str) -> str:
    out = ["# Secure aggregation at the edge: time and bytes per round", "",
           "One edge round of SecAgg (shared/core/secagg/) against plain aggregation, by `bench/secagg.py` (its "
           "docstring says how). Device time: one device's own work in the round; edge time: the edge's. Bytes per "
           "device: request and answer bodies of the protocol's steps (uploads: keys, shares, masked input, "
           "unmasking shares; downloads: the roster, the inbox, the remaining devices), against the one float32 "
           "upload of plain aggregation (the task's download is the same for both and left out).", "",
           "| devices | dropped | t | device s (mean / max) | edge s | plain edge s | up KiB / device | "
           "plain up KiB | down KiB / device | mean's max error (bound) |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['devices']} | {r['dropped']} | {r['threshold']} | {r['device_s_mean']:.3f} / "
                   f"{r['device_s_max']:.3f} | {r['edge_s']:.3f} | {r['plain_edge_s']:.4f} | "
                   f"{r['up_bytes_per_device'] / 1024:.1f} | {r['plain_up_bytes_per_device'] / 1024:.1f} | "
                   f"{r['down_bytes_per_device'] / 1024:.1f} | {r['mean_error']:.2e} ({r['error_bound']:.2e}) |")
    out += ["", "## Reading it", "",
            "- A device's cost grows with the devices of its edge: it agrees a key with, encrypts shares for and "
            "expands a mask for every other one (SecAgg's complete graph), so its time and its uploads grow "
            "linearly in n, and the edge's work in all devices together quadratically. Uploads are also 2× plain "
            "ones from the start: a masked word is 64 bits (k = 64) where plain sends float32; k = 32 halves that "
            "where W·clip·2^f fits in 2^31.",
            "- Dropouts cost the edge most: for each device that drops after sharing, it rebuilds its key and "
            "recomputes its pairwise mask with every remaining device, which is what the 10% rows add.",
            "- The mean's error stays below the fixed-point bound 2^-(f+1) at every size.",
            "- Flower's SecAgg+ (`SecAggPlusWorkflow`, described in Li et al., *Secure Aggregation for Federated "
            "Learning in Flower*, 2021) bounds a client's work by masking with k neighbours of a sparse graph "
            "instead of all n. The paper reports that its measured costs follow SecAgg(+)'s complexities; this "
            "project found no absolute per-round figures of Flower's to set beside these (searched 2026-11-27), so "
            "the comparison is of growth only: SecAgg+ would replace n by k ≈ O(log n) in every per-device column "
            "here, the way past a few hundred devices per edge."]
    return stamped("\n".join(out) + "\n", line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--devices", type=int, nargs="+", default=[10, 100, 500])
    parser.add_argument("--params", type=int, default=7850)
    parser.add_argument("--out", type=Path, default=BENCHMARKS)
    parser.add_argument("--render", action="store_true", help="rewrite the page from the stored figures")
    args = parser.parse_args()
    if args.render:
        page = args.out / "secagg.md"
        page.write_text(render(json.loads((args.out / "secagg.json").read_text()), earlier_stamp(page)))
        return
    torch.set_num_threads(1)
    line = stamp()
    rows = []
    for n in args.devices:
        for dropout in (0.0, 0.1):
            row = one_round(n, args.params, dropout)
            print(json.dumps(row), flush=True)
            rows.append(row)
    (args.out / "secagg.json").write_text(json.dumps(rows, indent=1) + "\n")
    (args.out / "secagg.md").write_text(render(rows, line))
    print(render(rows, line))


if __name__ == "__main__":
    main()
