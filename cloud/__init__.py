"""The cloud service: control API for runs, the Redis-backed contribution buffer, the cloud update."""
