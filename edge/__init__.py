"""The edge service: clients register and pull work here; the edge runs rounds and reports to the cloud."""
