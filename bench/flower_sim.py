"""The task of bench/scale.py in Flower's simulation engine, for a side-by-side figure measured in one run.

Runs in a venv of its own with Flower (`python3.11 -m venv V && V/bin/pip install torch==2.13.0
'flwr[simulation]'`), never in the project's: bench/scale.py (`--flower V/bin/python`) writes the very
shards its own run trains (the same rows per client, no hold-out) to an .npz and calls this once per size.
The model is Flower's PyTorch quickstart CNN, which is our `flower_cnn` (shared/core/models); the optimiser is
plain SGD (E = 1, B = 32, lr from the command line), the server FedAvg weighted by samples, evaluated
centrally on the same test set after every round, as our cloud does. Two Ray workers of one CPU each: the
two client processes of our run.

Prints one JSON line: the time at which each round ended, the accuracy after it, and the peak RSS summed
over this process and its children (Ray's processes).

    V/bin/python bench/flower_sim.py shards.npz --rounds 3 --fraction 1 --lr 0.05
"""
from __future__ import annotations

import argparse
import json
import threading
import time
from collections import OrderedDict

import numpy as np
import psutil
import torch
import torch.nn.functional as F
from flwr.client import ClientApp, NumPyClient
from flwr.common import Context, ndarrays_to_parameters
from flwr.server import ServerApp, ServerAppComponents, ServerConfig
from flwr.server.strategy import FedAvg
from flwr.simulation import run_simulation
from torch import nn


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


def get_weights(net: nn.Module) -> list[np.ndarray]:
    return [v.cpu().numpy() for v in net.state_dict().values()]


def set_weights(net: nn.Module, weights: list[np.ndarray]) -> None:
    net.load_state_dict(OrderedDict((k, torch.tensor(v)) for k, v in zip(net.state_dict(), weights, strict=True)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("shards")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fraction", type=float, default=1.0)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    data = np.load(args.shards)
    x, y, owner = data["x"], data["y"], data["client"]
    x_test, y_test = torch.from_numpy(data["x_test"]), torch.from_numpy(data["y_test"]).long()
    num_clients = int(owner.max()) + 1
    rows = [np.flatnonzero(owner == k) for k in range(num_clients)]

    class Client(NumPyClient):
        def __init__(self, k: int):
            self.k = k

        def fit(self, parameters, config):
            torch.set_num_threads(1)
            net = Net()
            set_weights(net, parameters)
            xs, ys = torch.from_numpy(x[rows[self.k]]), torch.from_numpy(y[rows[self.k]]).long()
            opt = torch.optim.SGD(net.parameters(), lr=args.lr)
            order = torch.randperm(len(ys))
            net.train()
            for start in range(0, len(ys), args.batch_size):
                batch = order[start:start + args.batch_size]
                opt.zero_grad()
                F.cross_entropy(net(xs[batch]), ys[batch]).backward()
                opt.step()
            return get_weights(net), len(ys), {}

    def client_fn(context: Context):
        return Client(int(context.node_config["partition-id"])).to_client()

    ended: list[float] = []
    accuracy: list[float] = []

    def evaluate(server_round: int, weights: list[np.ndarray], config: dict):
        net = Net()
        set_weights(net, weights)
        net.eval()
        with torch.no_grad():
            logits = net(x_test)
        if server_round > 0:
            ended.append(time.monotonic())
            accuracy.append(float((logits.argmax(1) == y_test).float().mean()))
        return float(F.cross_entropy(logits, y_test)), {}

    def server_fn(context: Context) -> ServerAppComponents:
        torch.manual_seed(0)
        strategy = FedAvg(fraction_fit=args.fraction, fraction_evaluate=0.0,
                          min_fit_clients=max(1, int(args.fraction * num_clients)), min_evaluate_clients=0,
                          min_available_clients=num_clients, evaluate_fn=evaluate,
                          initial_parameters=ndarrays_to_parameters(get_weights(Net())))
        return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=args.rounds))

    peak = [0]
    done = threading.Event()

    def sample_rss() -> None:
        me = psutil.Process()
        while not done.wait(0.25):
            total = 0
            for p in [me, *me.children(recursive=True)]:
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
            peak[0] = max(peak[0], total)

    threading.Thread(target=sample_rss, daemon=True).start()
    started = time.monotonic()
    run_simulation(server_app=ServerApp(server_fn=server_fn), client_app=ClientApp(client_fn=client_fn),
                   num_supernodes=num_clients,
                   backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0},
                                   "init_args": {"num_cpus": args.workers, "include_dashboard": False}})
    done.set()
    print(json.dumps({"clients": num_clients, "fraction": args.fraction, "started": started, "ended": ended,
                      "accuracy": accuracy, "peak_rss_mib": peak[0] / 2**20}))


if __name__ == "__main__":
    main()
