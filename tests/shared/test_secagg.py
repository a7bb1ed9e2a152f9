"""The secure-aggregation core (shared/core/secagg/): masks cancel, shares rebuild their secret, a tampered
ciphertext is refused, the fixed-point encoding keeps its bound, and the protocol's sum is exact with dropouts."""
from __future__ import annotations

import base64
import itertools
import secrets

import numpy as np
import pytest
import torch

from fl_services.shared.core.algorithms import registry
from fl_services.shared.core.algorithms.base import Contribution
from fl_services.shared.core.config import RunConfig
from fl_services.shared.core.secagg import fixedpoint, primitives, shamir, sites
from fl_services.shared.core.secagg.protocol import AggregatorSession, DeviceSession, ProtocolViolation, SecAggAbort

BITS = 48
MOD = np.uint64(2**BITS - 1)


def protocol(n: int, length: int, drop_before_mask: set[int] = frozenset(), threshold: float = 0.6,
             tamper=None):
    """One round in memory: the devices' inputs and the aggregator's total."""
    context = secrets.token_bytes(8)
    devices = {u: DeviceSession(u, context, BITS) for u in range(n)}
    agg = AggregatorSession(list(range(n)), threshold, length, context, BITS)
    for u, d in devices.items():
        agg.add_keys(u, *d.keys())
    roster = agg.close_keys()
    for u, d in devices.items():
        commitment, ciphertexts = d.share(roster, agg.t)
        agg.add_shares(u, commitment, ciphertexts)
    survivors = agg.close_shares()
    inputs = {u: np.random.default_rng(u).integers(0, 2**BITS, length, dtype=np.uint64) for u in range(n)}
    for u, d in devices.items():
        if u not in drop_before_mask:
            agg.add_masked(u, d.mask(inputs[u], agg.inbox(u), survivors))
    remaining = agg.close_masked()
    for u in remaining:
        s_shares, b_shares = devices[u].unmask(remaining)
        if tamper is not None:
            s_shares, b_shares = tamper(u, s_shares, b_shares)
        agg.add_unmask(u, s_shares, b_shares)
    expected = np.zeros(length, dtype=np.uint64)
    for u in remaining:
        expected = (expected + inputs[u]) & MOD
    return agg, expected


def test_masks_cancel_and_the_sum_is_exact():
    agg, expected = protocol(6, 300)
    assert np.array_equal(agg.total(), expected)


def test_a_masked_input_reveals_nothing_of_the_input_alone():
    context = b"ctx"
    a, b = DeviceSession(0, context, BITS), DeviceSession(1, context, BITS)
    roster = {0: a.keys(), 1: b.keys()}
    _, to = a.share(roster, 2)
    _, back = b.share(roster, 2)
    zeros = np.zeros(1000, dtype=np.uint64)
    y = a.mask(zeros, {0: to[0], 1: back[0]}, [0, 1])
    # A zero input comes out as words spread over the whole ring, not zeros.
    assert np.count_nonzero(y) > 990 and float(y.mean()) / 2**BITS == pytest.approx(0.5, abs=0.05)


@pytest.mark.parametrize("dropped", [{1}, {0, 4}])
def test_devices_dropping_after_key_sharing_are_recovered(dropped):
    agg, expected = protocol(7, 100, drop_before_mask=dropped)
    assert sorted(agg.remaining) == sorted(set(range(7)) - dropped)
    assert np.array_equal(agg.total(), expected)


def test_below_the_threshold_the_round_aborts():
    with pytest.raises(SecAggAbort, match="sent masked inputs"):
        protocol(5, 10, drop_before_mask={0, 1, 2})


def test_a_wrong_share_is_detected_never_a_wrong_sum():
    def tamper(u, s_shares, b_shares):
        if u == 2:
            b_shares = {v: (int.from_bytes(s, "big") ^ 1).to_bytes(len(s), "big") for v, s in b_shares.items()}
        return s_shares, b_shares

    agg, _ = protocol(5, 10, tamper=tamper)
    with pytest.raises(SecAggAbort, match="malformed shares"):
        agg.total()


def test_a_wrong_share_of_a_dropped_key_is_detected():
    def tamper(u, s_shares, b_shares):
        if u == 0:
            s_shares = {v: shamir.split(b"\x01" * 32, 2, [0, 1])[0] for v in s_shares}
        return s_shares, b_shares

    agg, _ = protocol(5, 10, drop_before_mask={4}, tamper=tamper)
    with pytest.raises(SecAggAbort, match="malformed shares"):
        agg.total()


def test_shares_rebuild_from_any_threshold_and_not_from_fewer():
    secret = secrets.token_bytes(32)
    shares = shamir.split(secret, 3, range(6))
    for subset in itertools.combinations(range(6), 3):
        assert shamir.combine({h: shares[h] for h in subset}, 3) == secret
    with pytest.raises(shamir.ShareError):
        shamir.combine({0: shares[0], 1: shares[1]}, 3)
    # One foreign share among three: no secret of the right form, or another secret (which callers check against
    # the owner's commitment), never this one.
    other = {0: shares[0], 1: shares[1], 2: shamir.split(secrets.token_bytes(32), 3, range(6))[2]}
    try:
        assert shamir.combine(other, 3) != secret
    except shamir.ShareError:
        pass


def test_a_tampered_ciphertext_is_refused():
    key = secrets.token_bytes(32)
    sealed = primitives.encrypt(key, b"share", b"ctx|0|1", secrets.token_bytes(12))
    assert primitives.decrypt(key, sealed, b"ctx|0|1") == b"share"
    flipped = sealed[:-1] + bytes([sealed[-1] ^ 1])
    for bad, associated in [(flipped, b"ctx|0|1"), (sealed, b"ctx|0|2"), (sealed[:10], b"ctx|0|1")]:
        with pytest.raises(primitives.DecryptionFailed):
            primitives.decrypt(key, bad, associated)


def test_a_device_drops_shares_it_cannot_decrypt():
    context = b"ctx"
    devices = {u: DeviceSession(u, context, BITS) for u in range(3)}
    roster = {u: d.keys() for u, d in devices.items()}
    sent = {u: d.share(roster, 2)[1] for u, d in devices.items()}
    inbox = {u: sent[u][0] for u in range(3)}
    inbox[1] = inbox[1][:-1] + bytes([inbox[1][-1] ^ 1])
    devices[0].mask(np.zeros(4, dtype=np.uint64), inbox, [0, 1, 2])
    assert sorted(devices[0].received) == [0, 2]


def test_a_device_refuses_to_reveal_both_secrets_or_a_foreign_roster():
    context = b"ctx"
    devices = {u: DeviceSession(u, context, BITS) for u in range(3)}
    roster = {u: d.keys() for u, d in devices.items()}
    with pytest.raises(ProtocolViolation):
        devices[0].share({**roster, 0: devices[1].keys()}, 2)
    with pytest.raises(ProtocolViolation, match="exceed half"):
        devices[0].share(roster, 1)
    devices[0].share(roster, 2)
    devices[0].mask(np.zeros(4, dtype=np.uint64), {}, [0, 1])
    with pytest.raises(ProtocolViolation):
        devices[0].unmask([0, 2])  # 2 was no survivor: its seed and key are not the aggregator's to ask for


def test_the_fixed_point_round_trip_errs_by_at_most_half_a_step_of_the_mean():
    rng = torch.Generator().manual_seed(0)
    f, bits = 10, 48
    updates = [{"model": {"w": torch.randn(50, generator=rng), "b": torch.randn(3, generator=rng)}} for _ in range(4)]
    weights = [3, 1, 7, 2]
    total = np.zeros(53, dtype=np.uint64)
    for update, weight in zip(updates, weights, strict=True):
        total = (total + fixedpoint.encode(update, weight, 100.0, f, bits)) & fixedpoint.ring_mask(bits)
    spec = fixedpoint.layout({"model": {"w": ((50,), torch.float32), "b": ((3,), torch.float32)}})
    sums = fixedpoint.decode(total, spec, f, bits)
    for name in ("w", "b"):
        exact = sum(w * u["model"][name].to(torch.float64) for u, w in zip(updates, weights, strict=True))
        error = (sums["model"][name] - exact).abs() / sum(weights)
        assert float(error.max()) <= 2.0 ** -(f + 1)


def test_clipping_and_capacity():
    update = {"model": {"w": torch.tensor([5.0, -5.0, 0.25])}}
    words = fixedpoint.encode(update, 1, 1.0, 4, 16)
    spec = fixedpoint.layout({"model": {"w": ((3,), torch.float32)}})
    assert fixedpoint.decode(words, spec, 4, 16)["model"]["w"].tolist() == [1.0, -1.0, 0.25]
    fixedpoint.check_capacity(1000, 1.0, 4, 16)
    with pytest.raises(fixedpoint.CapacityExceeded):
        fixedpoint.check_capacity(3000, 1.0, 4, 16)


def test_the_mask_generator_is_deterministic_and_seeded():
    seed = secrets.token_bytes(32)
    assert np.array_equal(primitives.expand(seed, 100, 32), primitives.expand(seed, 100, 32))
    assert not np.array_equal(primitives.expand(seed, 100, 32), primitives.expand(secrets.token_bytes(32), 100, 32))
    assert int(primitives.expand(seed, 1000, 32).max()) < 2**32


def test_the_sites_total_is_refused_where_staleness_would_weigh_a_site():
    """A masked site sum cannot be scaled by its own s(τ): the cloud's total takes every site once, all weights 1."""
    config = RunConfig(name="sites", model={"name": "logreg"}, topology={"num_edges": 2},
                       secure_aggregation={"cloud": True})
    algorithm = registry.create(config)
    global_ = {"model": {"w": torch.zeros(3, dtype=torch.float64)}}
    keys = [primitives.new_private_key() for _ in range(2)]
    config = config.model_copy(update={"secure_aggregation": config.secure_aggregation.model_copy(update={
        "site_keys": {e: base64.b64encode(primitives.public_bytes(k)).decode() for e, k in enumerate(keys)}})})
    sums = [{"model": {"w": torch.full((3,), e + 1.0, dtype=torch.float64)}} for e in range(2)]
    contributions = [Contribution(e, 0, sites.mask(config, "r", 0, e, primitives.private_bytes(k), sums[e]), 1.0)
                     for e, k in enumerate(keys)]
    total = sites.unmasked_total(algorithm, global_, contributions, (1.0, 1.0))
    assert torch.equal(total.tensors["model"]["w"], torch.full((3,), 3.0, dtype=torch.float64))
    assert total.weight == 2.0
    with pytest.raises(ValueError, match="staleness weights"):
        sites.unmasked_total(algorithm, global_, contributions, (1.0, 0.5))
