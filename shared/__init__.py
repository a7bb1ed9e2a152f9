"""What the services share, in three layers an import may only run down:

- ``core``: federated learning itself (algorithms, models, data, local training, the edge and cloud rounds,
  the in-process reference runner). No HTTP, no Redis.
- ``wire``: what crosses a process boundary (messages by peer, the task bundle, header names and device
  tokens, the HTTP client with its retries and TLS). Imports core only.
- ``server``: the toolkit both servers are built with (app factory, auth, bounded bodies, quotas, errors,
  offline docs, metrics, long-polls, serving). Imports wire and core, never a service.

``runtime``, beneath them all, holds what every process needs whatever it does (settings' sources, logging,
durable files); it imports no other layer.
"""
