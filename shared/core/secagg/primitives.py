"""The cryptographic primitives SecAgg needs, all from the `cryptography` package: X25519 key agreement, HKDF-SHA256
key derivation, AES-256-GCM for the shares one device sends another through the aggregator, ChaCha20's
keystream to expand a 32-byte seed into a mask, SHA-256 for commitments."""
from __future__ import annotations

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat, PublicFormat

from fl_services.shared.core.secagg.fixedpoint import ring_mask

KEY_BYTES = 32
NONCE_BYTES = 12


class DecryptionFailed(ValueError):
    """A ciphertext that is not what its sender encrypted for this recipient (tampered, or not addressed here)."""


def new_private_key() -> X25519PrivateKey:
    return X25519PrivateKey.generate()


def private_bytes(key: X25519PrivateKey) -> bytes:
    return key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())


def private_key(raw: bytes) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(raw)


def public_bytes(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)


def agree(own: X25519PrivateKey, peer_public: bytes, context: bytes) -> bytes:
    """A 32-byte key both ends derive alike: HKDF-SHA256 over the X25519 shared secret, bound to `context`."""
    shared = own.exchange(X25519PublicKey.from_public_bytes(peer_public))
    return HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES, salt=None, info=context).derive(shared)


def encrypt(key: bytes, plaintext: bytes, associated: bytes, nonce: bytes) -> bytes:
    """AES-256-GCM; the nonce travels in front. Each key encrypts one message, so a fixed nonce would do, but
    the caller's random one costs nothing."""
    return nonce + AESGCM(key).encrypt(nonce, plaintext, associated)


def decrypt(key: bytes, ciphertext: bytes, associated: bytes) -> bytes:
    if len(ciphertext) < NONCE_BYTES + 16:
        raise DecryptionFailed("the ciphertext is too short")
    try:
        return AESGCM(key).decrypt(ciphertext[:NONCE_BYTES], ciphertext[NONCE_BYTES:], associated)
    except InvalidTag as exc:
        raise DecryptionFailed("the ciphertext fails authentication") from exc


def expand(seed: bytes, length: int, bits: int) -> np.ndarray:
    """`length` pseudo-random elements of Z_{2^bits} from a 32-byte seed: ChaCha20's keystream read as little-endian
    uint64 words, reduced modulo 2^bits (a power of two: uniform)."""
    encryptor = Cipher(algorithms.ChaCha20(seed, b"\x00" * 16), mode=None).encryptor()
    words = np.frombuffer(encryptor.update(bytes(8 * length)), dtype="<u8").astype(np.uint64)
    return words & ring_mask(bits)


def commitment(secret: bytes, context: bytes) -> bytes:
    """SHA-256 of the secret in its context: published before the secret is shared, checked after it is rebuilt."""
    digest = hashes.Hash(hashes.SHA256())
    digest.update(context + b"\x00" + secret)
    return digest.finalize()
