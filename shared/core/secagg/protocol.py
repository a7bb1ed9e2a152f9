"""One round of SecAgg (Bonawitz et al., CCS 2017, the semi-honest variant) between an aggregator and its devices.

    0 advertise   device u → aggregator: two X25519 public keys, c_u (to encrypt shares) and s_u (to agree masks)
                  aggregator → devices: the roster U1 of those who advertised (at least t)
    1 share       u → aggregator: t-out-of-|U1| Shamir shares of s_u's private key and of a fresh mask seed b_u,
                  each encrypted (AES-GCM under KA(c_u, c_v)) for its holder v, and a commitment to b_u
                  aggregator → each v: the ciphertexts addressed to it, and U2 (those who shared, at least t)
    2 mask        u → aggregator: y_u = x_u + PRG(b_u) + Σ_{v∈U2, v≠u} ±PRG(KA(s_u, s_v)) mod 2^bits (+ if u < v)
                  aggregator → devices: U3 (those who sent y, at least t)
    3 unmask      u → aggregator: its shares of b_v for v ∈ U3 and of s_v for v ∈ U2 \\ U3 (never both for one v)
                  aggregator: Σ y_u − Σ PRG(b_u) ∓ the pairwise masks of the dropped, from at least t responses

The pairwise masks of two devices that both sent y cancel in the sum; those of a device that dropped after step 1
are rebuilt from its s key. The aggregator never holds both secrets of one device, so it learns Σ_{u∈U3} x_u and
nothing of a single x_u, provided fewer than t devices collude with it. Rebuilt secrets are checked (b_u against
its commitment, s_u against its public key): a device sending wrong shares makes the round fail, never a wrong
sum. Not covered: an aggregator that lies to devices about U2/U3 (the consistency round and signatures of the
malicious variant), and a device's own input, which may be any vector (docs/explanation-security.md)."""
from __future__ import annotations

import secrets
import struct
from dataclasses import dataclass, field

import numpy as np

from fl_services.shared.core.secagg import primitives, shamir
from fl_services.shared.core.secagg.fixedpoint import ring_mask

_PAIR = struct.Struct(">II")


class SecAggAbort(Exception):
    """The round cannot produce a correct sum (too few devices left, or inconsistent shares): it fails."""


class ProtocolViolation(ValueError):
    """A message that breaks the protocol (refused, changes nothing)."""


def minimum(threshold: float, n: int) -> int:
    """t for `n` devices: the share of them (threshold, > 1/2) whose shares rebuild a secret, at least 2."""
    return max(2, -(-int(threshold * 1_000_000) * n // 1_000_000))


def _mask_sign(u: int, v: int) -> int:
    return 1 if u < v else -1


def _associated(context: bytes, sender: int, recipient: int) -> bytes:
    return context + b"|share|" + _PAIR.pack(sender, recipient)


@dataclass
class DeviceSession:
    """A device's side of one round: it holds its secrets and the shares others sent it."""

    client_id: int
    context: bytes  # names the round: every key and ciphertext is bound to it
    bits: int
    _c: object = field(default_factory=primitives.new_private_key, repr=False)
    _s: object = field(default_factory=primitives.new_private_key, repr=False)
    _b: bytes = field(default_factory=lambda: secrets.token_bytes(32), repr=False)
    roster: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)
    threshold: int = 0
    survivors: list[int] = field(default_factory=list)
    received: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)  # sender -> (share of s, share of b)

    def keys(self) -> tuple[bytes, bytes]:
        return primitives.public_bytes(self._c), primitives.public_bytes(self._s)  # type: ignore[arg-type]

    def share(self, roster: dict[int, tuple[bytes, bytes]], threshold: int) -> tuple[bytes, dict[int, bytes]]:
        """Step 1: the commitment to b_u and one ciphertext per roster member."""
        if roster.get(self.client_id) != self.keys():
            raise ProtocolViolation("the roster does not hold this device's keys")
        if not len(roster) // 2 < threshold <= len(roster):
            raise ProtocolViolation(f"threshold {threshold} of {len(roster)} devices must exceed half of them")
        self.roster, self.threshold = dict(roster), threshold
        holders = sorted(roster)
        s_shares = shamir.split(primitives.private_bytes(self._s), threshold, holders)  # type: ignore[arg-type]
        b_shares = shamir.split(self._b, threshold, holders)
        out = {}
        for v in holders:
            key = primitives.agree(self._c, roster[v][0], self.context + b"|c")  # type: ignore[arg-type]
            plain = _PAIR.pack(self.client_id, v) + s_shares[v] + b_shares[v]
            out[v] = primitives.encrypt(key, plain, _associated(self.context, self.client_id, v),
                                        secrets.token_bytes(primitives.NONCE_BYTES))
        return primitives.commitment(self._b, self.context), out

    def mask(self, vector: np.ndarray, inbox: dict[int, bytes], survivors: list[int]) -> np.ndarray:
        """Step 2: the masked input. Shares that fail to decrypt are dropped (their sender's secrets then need the
        other holders' shares); survivors outside the roster, or fewer than t, refuse the step."""
        if self.client_id not in survivors or not set(survivors) <= set(self.roster):
            raise ProtocolViolation("the survivors must be roster members, this device among them")
        if len(set(survivors)) < self.threshold:
            raise ProtocolViolation(f"{len(set(survivors))} survivors are fewer than the threshold {self.threshold}")
        self.survivors = sorted(set(survivors))
        for u in self.survivors:
            ciphertext = inbox.get(u)
            if ciphertext is None:
                continue
            key = primitives.agree(self._c, self.roster[u][0], self.context + b"|c")  # type: ignore[arg-type]
            try:
                plain = primitives.decrypt(key, ciphertext, _associated(self.context, u, self.client_id))
            except primitives.DecryptionFailed:
                continue
            if len(plain) != _PAIR.size + 2 * shamir.SHARE_BYTES or _PAIR.unpack(plain[:_PAIR.size]) != (
                    u, self.client_id):
                continue
            body = plain[_PAIR.size:]
            self.received[u] = (body[:shamir.SHARE_BYTES], body[shamir.SHARE_BYTES:])
        mod = ring_mask(self.bits)
        y = (vector.astype(np.uint64) + primitives.expand(self._b, len(vector), self.bits)) & mod
        for v in self.survivors:
            if v == self.client_id:
                continue
            seed = primitives.agree(self._s, self.roster[v][1], self.context + b"|s")  # type: ignore[arg-type]
            pad = primitives.expand(seed, len(vector), self.bits)
            y = (y + pad if _mask_sign(self.client_id, v) > 0 else y - pad) & mod
        return y

    def unmask(self, remaining: list[int]) -> tuple[dict[int, bytes], dict[int, bytes]]:
        """Step 3: shares of s_v for the survivors that sent no input, of b_v for those that did."""
        left = set(remaining)
        if self.client_id not in left or not left <= set(self.survivors) or len(left) < self.threshold:
            raise ProtocolViolation("the remaining devices must be at least t survivors, this device among them")
        dropped = [v for v in self.survivors if v not in left]
        return ({v: self.received[v][0] for v in dropped if v in self.received},
                {v: self.received[v][1] for v in sorted(left) if v in self.received})


@dataclass
class AggregatorSession:
    """The aggregator's side of one round: it relays what devices send each other, and unmasks only the sum."""

    members: list[int]  # the devices asked to take part (the round's selection)
    threshold: float  # the share of the advertised devices needed (> 1/2)
    length: int  # elements of a masked vector
    context: bytes
    bits: int
    keys: dict[int, tuple[bytes, bytes]] = field(default_factory=dict)  # U1
    roster: dict[int, tuple[bytes, bytes]] | None = None
    commitments: dict[int, bytes] = field(default_factory=dict)
    ciphertexts: dict[int, dict[int, bytes]] = field(default_factory=dict)  # sender -> holder -> ciphertext (U2)
    survivors: list[int] | None = None
    masked: dict[int, np.ndarray] = field(default_factory=dict)  # U3
    remaining: list[int] | None = None
    responses: dict[int, tuple[dict[int, bytes], dict[int, bytes]]] = field(default_factory=dict)

    @property
    def t(self) -> int:
        return minimum(self.threshold, len(self.roster if self.roster is not None else self.members))

    def _enough(self, count: int, step: str) -> None:
        if count < self.t:
            raise SecAggAbort(f"only {count} devices {step}; secure aggregation needs {self.t}")

    # ---- step 0
    def add_keys(self, u: int, c_pk: bytes, s_pk: bytes) -> None:
        if u not in self.members or self.roster is not None:
            raise ProtocolViolation(f"device {u} cannot advertise keys now")
        if len(c_pk) != 32 or len(s_pk) != 32:
            raise ProtocolViolation("an X25519 public key is 32 bytes")
        if u in self.keys and self.keys[u] != (c_pk, s_pk):
            raise ProtocolViolation(f"device {u} already advertised other keys")
        self.keys[u] = (c_pk, s_pk)

    def close_keys(self) -> dict[int, tuple[bytes, bytes]]:
        self.roster = dict(sorted(self.keys.items()))
        self._enough(len(self.roster), "advertised keys")
        return self.roster

    # ---- step 1
    def add_shares(self, u: int, commitment: bytes, ciphertexts: dict[int, bytes]) -> None:
        if self.roster is None or u not in self.roster or self.survivors is not None:
            raise ProtocolViolation(f"device {u} cannot share keys now")
        if set(ciphertexts) != set(self.roster) or len(commitment) != 32:
            raise ProtocolViolation("shares must go to every roster member, with a 32-byte commitment")
        self.commitments[u] = commitment
        self.ciphertexts[u] = dict(ciphertexts)

    def close_shares(self) -> list[int]:
        self.survivors = sorted(self.ciphertexts)
        self._enough(len(self.survivors), "shared their keys")
        return self.survivors

    def inbox(self, v: int) -> dict[int, bytes]:
        """The ciphertexts addressed to `v`, by sender."""
        assert self.survivors is not None
        return {u: self.ciphertexts[u][v] for u in self.survivors}

    # ---- step 2
    def add_masked(self, u: int, y: np.ndarray) -> None:
        if self.survivors is None or u not in self.survivors or self.remaining is not None:
            raise ProtocolViolation(f"device {u} cannot send a masked input now")
        if y.dtype != np.uint64 or y.shape != (self.length,) or (
                self.bits < 64 and bool((y >> np.uint64(self.bits)).any())):
            raise ProtocolViolation(f"a masked input is {self.length} elements of Z_2^{self.bits}")
        self.masked[u] = y

    def close_masked(self) -> list[int]:
        self.remaining = sorted(self.masked)
        self._enough(len(self.remaining), "sent masked inputs")
        return self.remaining

    # ---- step 3
    def add_unmask(self, u: int, s_shares: dict[int, bytes], b_shares: dict[int, bytes]) -> None:
        if self.remaining is None or u not in self.remaining:
            raise ProtocolViolation(f"device {u} cannot send unmasking shares now")
        assert self.survivors is not None
        dropped = set(self.survivors) - set(self.remaining)
        if not set(s_shares) <= dropped or not set(b_shares) <= set(self.remaining):
            raise ProtocolViolation("shares of s only for dropped devices, of b only for remaining ones")
        self.responses[u] = (dict(s_shares), dict(b_shares))

    def total(self) -> np.ndarray:
        """Σ_{u∈U3} x_u mod 2^bits; SecAggAbort with fewer than t responses, or shares that rebuild a wrong secret."""
        assert self.survivors is not None and self.remaining is not None and self.roster is not None
        self._enough(len(self.responses), "sent unmasking shares")
        mod = ring_mask(self.bits)
        total = np.zeros(self.length, dtype=np.uint64)
        for y in self.masked.values():
            total = (total + y) & mod
        lagrange: dict[tuple[int, ...], list[int]] = {}
        for v in self.remaining:
            b = self._rebuild(v, 1, lagrange)
            if primitives.commitment(b, self.context) != self.commitments[v]:
                raise SecAggAbort(f"the shares of device {v}'s mask seed rebuild a value it did not commit to: a "
                                  "device sent malformed shares")
            total = (total - primitives.expand(b, self.length, self.bits)) & mod
        for v in sorted(set(self.survivors) - set(self.remaining)):
            raw = self._rebuild(v, 0, lagrange)
            try:
                key = primitives.private_key(raw)
            except ValueError as exc:
                raise SecAggAbort(f"the shares of device {v}'s key rebuild no key: a device sent malformed "
                                  "shares") from exc
            if primitives.public_bytes(key) != self.roster[v][1]:
                raise SecAggAbort(f"the shares of device {v}'s key rebuild another key than it advertised: a "
                                  "device sent malformed shares")
            for u in self.remaining:
                seed = primitives.agree(key, self.roster[u][1], self.context + b"|s")
                pad = primitives.expand(seed, self.length, self.bits)
                # u added +pad when u < v: remove it; u subtracted it when u > v: add it back.
                total = (total - pad if _mask_sign(u, v) > 0 else total + pad) & mod
        return total

    def _rebuild(self, v: int, which: int, lagrange: dict[tuple[int, ...], list[int]]) -> bytes:
        shares = {u: response[which][v] for u, response in sorted(self.responses.items()) if v in response[which]}
        if len(shares) < self.t:
            raise SecAggAbort(f"only {len(shares)} shares of device {v}'s secret arrived; {self.t} are needed")
        holders = tuple(sorted(shares)[:self.t])
        if holders not in lagrange:
            lagrange[holders] = shamir.lagrange_at_zero(list(holders))
        try:
            return shamir.combine({h: shares[h] for h in holders}, self.t, lagrange[holders])
        except shamir.ShareError as exc:
            raise SecAggAbort(f"device {v}'s secret cannot be rebuilt ({exc}): a device sent malformed shares") from exc
