"""Code the cloud, edge and client services share: wire schemas, tensors, models, data, algorithms."""
