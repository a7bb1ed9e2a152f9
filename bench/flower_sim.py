"""The task of bench/scale.py in Flower's simulation engine, written as a Flower user writes an app.

Runs in a venv of its own (bench/scale.py builds it from bench/flower-requirements.txt), never in the
project's. bench/scale.py writes a cache directory first: one file per partition (`part-K.npz`, the very rows
our client K trains), the test set (`test.npz`) and our run's initial weights (`initial.npz`); this script is
then given that directory. Nothing of the data travels in the apps: the ClientApp loads its partition from
the cache by the partition id Flower gives its node, as Flower's quickstarts load theirs, so each message
Ray carries is the model and a few numbers.

Flower's current Message API (flwr 1.42): a ClientApp whose `train` trains Flower's quickstart CNN (our
`flower_cnn`, the same parameter names) with plain SGD or Nesterov, a DataLoader over the partition
(shuffled), and a ServerApp running Flower's FedAvg (weighted by samples) from our initial weights, evaluated
centrally on our test set after every round, as our cloud does. Two Ray workers of one CPU each, as our two
client processes; Ray's workers at nice 0 (`RAY_worker_niceness`: Ray's default of 15 would starve them
against other processes where ours run at 0).

Prints one JSON line: the time each round ended (time.monotonic), the accuracy after it, and the start.

    V/bin/python bench/flower_sim.py CACHE --clients N --rounds 3 --lr 0.05 --batch-size 8 --epochs 1
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg
from flwr.simulation import run_simulation
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

# Where the cache and the run's settings are, for the apps in Ray's workers (which inherit the environment):
# `flwr run` would hand them over as the run config, which run_simulation does not take.
SETTINGS = "FLOWER_BENCH_SETTINGS"


class Net(nn.Module):
    """Flower's quickstart CNN for 1×28×28 inputs (our `flower_cnn`)."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 4 * 4, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc3(F.relu(self.fc2(F.relu(self.fc1(x.flatten(1))))))


def settings() -> dict:
    return json.loads(os.environ[SETTINGS])


def load_partition(cache: str, partition_id: int) -> TensorDataset:
    with np.load(Path(cache) / f"part-{partition_id}.npz") as part:
        return TensorDataset(torch.from_numpy(part["x"]), torch.from_numpy(part["y"]).long())


app = ClientApp()


@app.train()
def train(msg: Message, context: Context) -> Message:
    torch.set_num_threads(1)
    config = settings()
    model = Net()
    model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    data = load_partition(config["cache"], int(context.node_config["partition-id"]))
    loader = DataLoader(data, batch_size=config["batch_size"], shuffle=True)
    if config["optimizer"] == "nesterov":
        optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=config["momentum"], nesterov=True)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    model.train()
    losses = []
    for _ in range(config["epochs"]):
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    metrics = MetricRecord({"train_loss": float(np.mean(losses)), "num-examples": len(data)})
    return Message(content=RecordDict({"arrays": ArrayRecord(model.state_dict()), "metrics": metrics}),
                   reply_to=msg)


server = ServerApp()
ENDED: list[float] = []
ACCURACY: list[float] = []


@server.main()
def main(grid: Grid, context: Context) -> None:
    config = settings()
    with np.load(Path(config["cache"]) / "test.npz") as test:
        x_test, y_test = torch.from_numpy(test["x"]), torch.from_numpy(test["y"]).long()
    with np.load(Path(config["cache"]) / "initial.npz") as initial:
        weights = {name: torch.from_numpy(initial[name]) for name in initial.files}

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = Net()
        model.load_state_dict(arrays.to_torch_state_dict())
        model.eval()
        with torch.no_grad():
            logits = model(x_test)
        accuracy = float((logits.argmax(1) == y_test).float().mean())
        if server_round > 0:
            ENDED.append(time.monotonic())
            ACCURACY.append(accuracy)
        return MetricRecord({"accuracy": accuracy, "loss": float(F.cross_entropy(logits, y_test))})

    clients = config["clients"]
    strategy = FedAvg(fraction_train=config["fraction"], fraction_evaluate=0.0,
                      min_train_nodes=max(1, int(config["fraction"] * clients)), min_available_nodes=clients)
    strategy.start(grid=grid, initial_arrays=ArrayRecord(weights), num_rounds=config["rounds"],
                   train_config=ConfigRecord({}), evaluate_fn=evaluate)


def run() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("cache")
    parser.add_argument("--clients", type=int, required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fraction", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--optimizer", choices=["sgd", "nesterov"], default="sgd")
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    os.environ[SETTINGS] = json.dumps({
        "cache": str(Path(args.cache).resolve()), "clients": args.clients, "rounds": args.rounds,
        "fraction": args.fraction, "lr": args.lr, "batch_size": args.batch_size, "epochs": args.epochs,
        "optimizer": args.optimizer, "momentum": args.momentum})
    os.environ["RAY_worker_niceness"] = "0"  # Ray's own setting (RayConfig worker_niceness); its default is 15
    torch.set_num_threads(1)
    started = time.monotonic()
    run_simulation(server_app=server, client_app=app, num_supernodes=args.clients,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": args.workers, "include_dashboard": False}})
    print(json.dumps({"clients": args.clients, "started": started, "ended": ENDED, "accuracy": ACCURACY}))


if __name__ == "__main__":
    run()
