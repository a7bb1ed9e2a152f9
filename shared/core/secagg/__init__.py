"""Secure aggregation (SecAgg, Bonawitz et al., CCS 2017) as pure functions and state machines: no I/O.

`fixedpoint` maps model steps into the ring Z_{2^bits}; `shamir` shares seeds and keys; `primitives` wraps the
`cryptography` package (X25519, HKDF, AES-GCM, a ChaCha20 keystream as the mask generator); `protocol` holds a
device's side (`DeviceSession`) and the aggregator's side (`AggregatorSession`) of one round. The services carry
the messages (edge/secagg.py, client/secagg.py)."""
