"""An example of bringing your own model and data: `models.make_net` and `data.load`."""
