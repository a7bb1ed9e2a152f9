"""The client: pulls tasks from an edge, trains on local data, pushes results. Outbound calls only."""
