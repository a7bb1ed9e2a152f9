"""Shamir's t-out-of-n secret sharing over the prime field GF(2^521 - 1) (docs/decisions/ on why it is written
here). Secrets are byte strings of up to 64 bytes (keys and seeds of 32); a share is (x, y) with x = holder + 1."""
from __future__ import annotations

import secrets
from collections.abc import Iterable

PRIME = 2**521 - 1
SHARE_BYTES = 66  # ⌈521 / 8⌉
MAX_SECRET_BYTES = 64


class ShareError(ValueError):
    """Shares that cannot reconstruct a secret (too few, repeated or out of range)."""


def split(secret: bytes, threshold: int, holders: Iterable[int]) -> dict[int, bytes]:
    """Shares of `secret` for each holder id (≥ 0): any `threshold` of them reconstruct it, fewer reveal nothing."""
    if not 1 <= len(secret) <= MAX_SECRET_BYTES:
        raise ValueError(f"a secret is 1 to {MAX_SECRET_BYTES} bytes, got {len(secret)}")
    ids = list(holders)
    if threshold < 1 or threshold > len(ids):
        raise ValueError(f"threshold {threshold} must lie in 1..{len(ids)} (the holders)")
    # A leading 1 byte keeps leading zeros of the secret through the integer round trip.
    coefficients = [int.from_bytes(b"\x01" + secret, "big")] + [secrets.randbelow(PRIME) for _ in range(threshold - 1)]
    shares = {}
    for holder in ids:
        x, y = holder + 1, 0
        for c in reversed(coefficients):  # Horner
            y = (y * x + c) % PRIME
        shares[holder] = y.to_bytes(SHARE_BYTES, "big")
    return shares


def lagrange_at_zero(holders: list[int]) -> list[int]:
    """The coefficients λ_i with f(0) = Σ λ_i f(x_i): one computation serves every secret the same holders share."""
    xs = [h + 1 for h in holders]
    if len(set(xs)) != len(xs) or any(not 0 < x < PRIME for x in xs):
        raise ShareError("shares must come from distinct holders")
    out = []
    for i, xi in enumerate(xs):
        num, den = 1, 1
        for j, xj in enumerate(xs):
            if i != j:
                num = num * xj % PRIME
                den = den * (xj - xi) % PRIME
        out.append(num * pow(den, -1, PRIME) % PRIME)
    return out


def combine(shares: dict[int, bytes], threshold: int, coefficients: list[int] | None = None) -> bytes:
    """The secret from `threshold` of the shares (the first by holder id); ShareError for fewer or malformed ones.
    A wrong share gives a wrong secret: callers check it against what the secret's owner committed to."""
    if len(shares) < threshold:
        raise ShareError(f"{len(shares)} shares cannot reconstruct a secret shared {threshold}-out-of-n")
    holders = sorted(shares)[:threshold]
    lambdas = coefficients or lagrange_at_zero(holders)
    if len(lambdas) != len(holders):
        raise ShareError("the coefficients are not those of these holders")
    total = 0
    for holder, lam in zip(holders, lambdas, strict=True):
        share = shares[holder]
        if len(share) != SHARE_BYTES or (y := int.from_bytes(share, "big")) >= PRIME:
            raise ShareError(f"the share of holder {holder} is malformed")
        total = (total + lam * y) % PRIME
    raw = total.to_bytes((total.bit_length() + 7) // 8, "big")
    if not raw or raw[0] != 1 or len(raw) > MAX_SECRET_BYTES + 1:
        raise ShareError("the shares do not reconstruct a secret (one of them is wrong)")
    return raw[1:]
