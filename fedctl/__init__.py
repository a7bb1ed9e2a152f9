"""fedctl: the operator's tool. Starts a local topology (Redis, cloud, edges, clients as processes),
drives runs through the cloud's REST API and shows their progress."""
