"""Secure aggregation between sites: each edge masks its contribution (its weighted sums) with pairwise masks agreed
with every other site of the run, so that the cloud, summing all of them, learns only their total.

Site e adds PRG(KA(e, f)) for every other site f > e and subtracts it for f < e, modulo 2^bits; the seeds come from
X25519 between e's private key and f's public key (the cloud relays the public keys in the run's config), bound by
HKDF to the run and version. The masks cancel only in the sum over every site of the run: the cloud update must
take all of them (B = L, RunConfig checks it), and a site that never contributes holds the version up, as it does
without masking. The sums are encoded in fixed point with `scale_bits` fractional bits, each coordinate clipped to
the site's share of the ring, ±(2^(bits-1) − 1) / (L·2^f), so that the total cannot wrap."""
from __future__ import annotations

import base64
from dataclasses import replace

import numpy as np
import torch

from fl_services.shared.core.algorithms.base import Algorithm, Contribution
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.records import Record
from fl_services.shared.core.secagg import fixedpoint, primitives
from fl_services.shared.core.tensors import InvalidContent

MASKED = "masked"  # a masked record's one group and tensor: int64 words of Z_2^bits


def context(run_id: str, version: int) -> bytes:
    return f"{run_id}:v{version}:sites".encode()


def public_key(raw: str) -> bytes:
    return base64.b64decode(raw.encode("ascii"), validate=True)


def site_clip(config: RunConfig) -> float:
    sa = config.secure_aggregation
    return (2.0 ** (sa.bits - 1) - 1) / (len(config.edge_ids()) * 2.0**sa.scale_bits)


def mask(config: RunConfig, run_id: str, version: int, edge_id: int, private: bytes, sums: Record) -> Record:
    """The site's contribution sums as the cloud receives them: fixed point, masked; ValueError if the run's key for
    this site is not this site's key (it lost its key: it cannot contribute to this run)."""
    sa = config.secure_aggregation
    keys = sa.site_keys or {}
    own = primitives.private_key(private)
    if keys.get(edge_id) is None or public_key(keys[edge_id]) != primitives.public_bytes(own):
        raise ValueError(f"the run's public key for edge {edge_id} is not this edge's: it registered another key "
                         "before the run was created (its key file is lost?); this run cannot use its contributions")
    words = fixedpoint.encode(sums, 1, site_clip(config), sa.scale_bits, sa.bits)
    modulus = fixedpoint.ring_mask(sa.bits)
    bound = context(run_id, version)
    for other, key in sorted(keys.items()):
        if other == edge_id:
            continue
        pad = primitives.expand(primitives.agree(own, public_key(key), bound), len(words), sa.bits)
        words = (words + pad if edge_id < other else words - pad) & modulus
    return {MASKED: {MASKED: torch.from_numpy(words.view(np.int64).copy())}}


def is_masked(tensors: Record) -> bool:
    return set(tensors) == {MASKED}


def check_masked(algorithm: Algorithm, global_: Record, clients: list[int], tensors: Record) -> None:
    """Raises InvalidContent unless `tensors` is a masked contribution of the right length (its values cannot be
    checked: they are uniform in the ring)."""
    length = fixedpoint.length(fixedpoint.layout(algorithm.contribution_spec(global_, clients)))
    words = tensors.get(MASKED, {}).get(MASKED)
    if not is_masked(tensors) or set(tensors[MASKED]) != {MASKED} or words is None or words.dtype != torch.int64 \
            or tuple(words.shape) != (length,):
        raise InvalidContent(f"a run with secure_aggregation.cloud takes a masked contribution: one int64 vector "
                             f"{MASKED}/{MASKED} of {length} words")


def unmasked_total(algorithm: Algorithm, global_: Record, contributions: list[Contribution],
                   scales: tuple[float | None, ...] = ()) -> Contribution:
    """The one contribution the cloud may see: the sum over every site (their masks cancel), decoded, with their
    total weight, every site's participation and members. `scales`: each site's staleness weight s(τ) in this
    update (staleness.weights), which must all be 1: a masked site's sum cannot be scaled on its own, and the
    masks cancel only if every site counts once (RunConfig refuses B < L, so every τ is 0). The sites'
    evaluations are not in it: the history reads them off the contributions as they came."""
    if any(s != 1.0 for s in scales):
        raise ValueError(f"secure aggregation between sites sums every site's contribution once; staleness weights "
                         f"{scales} would scale some of them (it needs topology.buffer_size = num_edges)")
    sa = algorithm.config.secure_aggregation
    clients = [k for c in contributions for k in c.clients]
    spec = fixedpoint.layout(algorithm.contribution_spec(global_, clients))
    modulus = fixedpoint.ring_mask(sa.bits)
    total = np.zeros(fixedpoint.length(spec), dtype=np.uint64)
    for c in contributions:
        total = (total + c.tensors[MASKED][MASKED].numpy().view(np.uint64)) & modulus
    first = min(contributions, key=lambda c: c.edge_id)
    declared = [c.members for c in contributions if c.members is not None]
    return replace(first, tensors=fixedpoint.decode(total, spec, sa.scale_bits, sa.bits),
                   weight=sum(c.weight for c in contributions),
                   participation=tuple(p for c in contributions for p in c.participation),
                   failures=tuple(f for c in contributions for f in c.failures),
                   members=tuple(m for ms in declared for m in ms) if declared else None, evaluation=None)
