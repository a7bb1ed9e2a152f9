"""Writes example data for the compose file's devices (docker/docker-compose.devices.yml), one directory each,
in the forms a device's own data takes: device-a/train.npz, device-b/table.csv, device-c/images/<label>/*.png,
device-d/train.npz.

Real devices bring their own files; these are drawn from the digits data set's training pool (scikit-learn's,
the run's `data.dataset`), four disjoint shares of it, so that the accuracy the cloud measures on that data
set's test split means something. The test split itself is written nowhere.

    ./fl python examples/devices/write_data.py device-data     # then docker compose ... up (see the compose file)
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from PIL import Image

from fl_services.shared.core.config import DataConfig
from fl_services.shared.core.data.builtin import bundled_pool

DEVICES = ("device-a", "device-b", "device-c", "device-d")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="where the devices' directories are written (must not exist)")
    parser.add_argument("--seed", type=int, default=0, help="the run's seed: it draws the test split left out")
    args = parser.parse_args()
    out, seed = args.out, args.seed
    pool = bundled_pool("digits", DataConfig().test_fraction, seed)
    x, y = pool.x_train, pool.y_train
    shares = np.array_split(np.random.default_rng(seed).permutation(len(y)), len(DEVICES))
    out.mkdir(parents=True)
    for device, share in zip(DEVICES, shares, strict=True):
        (out / device).mkdir()
        xs, ys = x[share], y[share]
        if device == "device-b":
            write_csv(out / device / "table.csv", xs, ys)
        elif device == "device-c":
            write_images(out / device / "images", xs, ys, x)
        else:
            np.savez(out / device / "train.npz", x=xs, y=ys)
        print(f"{out / device}: {len(ys)} samples")


def write_csv(path: Path, x: np.ndarray, y: np.ndarray) -> None:
    """One row a sample, its 64 pixels then its label (the spec: csv:/data/table.csv?label=label&shape=1x8x8)."""
    header = ",".join([*(f"p{i}" for i in range(x[0].size)), "label"])
    rows = [",".join([*(f"{v:.6f}" for v in sample.reshape(-1)), str(label)])
            for sample, label in zip(x, y, strict=True)]
    path.write_text("\n".join([header, *rows]) + "\n")


def write_images(root: Path, x: np.ndarray, y: np.ndarray, pool: np.ndarray) -> None:
    """8-bit grayscale PNGs, one directory per label. The pool's samples are standardised; the pixels are
    rescaled to [0, 1] by the pool's least and greatest values, whose affine map back is the spec's mean and std
    (image-folder:/data/images?shape=1x8x8&mean=M&std=S, as printed)."""
    low, high = float(pool.min()), float(pool.max())
    for i, (sample, label) in enumerate(zip(x, y, strict=True)):
        (root / str(label)).mkdir(parents=True, exist_ok=True)
        pixels = np.round((sample[0] - low) / (high - low) * 255).astype(np.uint8)
        Image.fromarray(pixels, mode="L").save(root / str(label) / f"{i}.png")
    # x = p·(high − low) + low = (p − mean)/std with mean = −low/(high − low), std = 1/(high − low)
    print(f"{root}: image-folder:/data/images?shape=1x8x8&mean={-low / (high - low):.4f}&std={1 / (high - low):.4f}")


if __name__ == "__main__":
    main()
