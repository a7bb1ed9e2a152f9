"""Federated learning as services: the one import package of the fl-services distribution.

Its subpackages are the repository's top-level directories (cloud, edge, client, shared, fedctl), mapped
into it: in a checkout they are links to those directories, in the wheel their files."""
