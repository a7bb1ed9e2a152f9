"""What a device's data is, computed where it lies (only counts leave the device), and whether it fits what a
run trains."""
from __future__ import annotations

from itertools import pairwise
from typing import TYPE_CHECKING, Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from fl_services.shared.core.numbers import Int
from fl_services.shared.core.reports import MAX_SAMPLES

if TYPE_CHECKING:
    from fl_services.shared.core.data.arrays import ArrayDataset

_LABELS_SHOWN = 5

# A summary arrives from a device and becomes the run's declared member (its sample count a weight, its labels and
# shape compared with the run's task), so each figure is bounded where it enters: the counts as a member's are.
MAX_DIMENSION = 2**24
MAX_LABEL = 2**31 - 1
MAX_LABELS = 100_000
Count = Annotated[Int, Field(ge=0, le=MAX_SAMPLES)]
Label = Annotated[Int, Field(ge=0, le=MAX_LABEL)]
# A JSON object's keys are strings: a label as a histogram's key is read from one.
LabelKey = Annotated[int, Field(ge=0, le=MAX_LABEL)]


class DataSummary(BaseModel):
    """A data source's description: small, JSON, and free of samples, so it can travel in a registration."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    samples: Count = Field(description="training samples")
    held_out_samples: Count = Field(description="samples of the held-out split, kept for evaluation")
    input_shape: tuple[Annotated[Int, Field(ge=1, le=MAX_DIMENSION)], ...] = Field(
        min_length=1, max_length=8, description="one sample's shape")
    labels: tuple[Label, ...] = Field(max_length=MAX_LABELS, description="every label either split holds, ascending")
    histogram: dict[LabelKey, Count] = Field(max_length=MAX_LABELS, description="training samples per label")

    @model_validator(mode="after")
    def _consistent(self) -> DataSummary:
        """The figures as `summarize` computes them: labels ascending and distinct, the histogram over some of them
        (the held-out split may hold others), counting every training sample."""
        if any(a >= b for a, b in pairwise(self.labels)):
            raise ValueError("labels must be ascending and distinct")
        stray = sorted(set(self.histogram) - set(self.labels))
        if stray:
            raise ValueError(f"the histogram counts labels {stray[:_LABELS_SHOWN]} that labels does not list")
        if sum(self.histogram.values()) != self.samples:
            raise ValueError(f"the histogram counts {sum(self.histogram.values())} samples, not samples="
                             f"{self.samples}")
        return self


class DataFit(BaseModel):
    """What decides whether data can train a run (check_fits), in a few numbers: whether it holds training
    samples, its sample shape and its lowest and highest labels. A site reports its connected devices counted
    per fit, so the cloud admits a run on the devices able to train it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    samples: Annotated[Int, Field(ge=0, le=1)] = Field(description="1 if it holds training samples, else 0")
    input_shape: tuple[Annotated[Int, Field(ge=1, le=MAX_DIMENSION)], ...] = Field(min_length=1, max_length=8)
    labels: tuple[Label, ...] = Field(max_length=2, description="its lowest and highest label (none: no labels)")

    @classmethod
    def of(cls, summary: DataSummary) -> DataFit:
        ends = (summary.labels[0], summary.labels[-1]) if summary.labels else ()
        return cls(samples=min(summary.samples, 1), input_shape=summary.input_shape, labels=ends)


class RunTask(BaseModel):
    """What a run trains, as its data must fit it: the model's input shape and its number of classes."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_shape: tuple[Int, ...]
    num_classes: Int = Field(ge=1)


def shape_text(shape: tuple[int, ...]) -> str:
    """A sample shape as written in a data source's options: 1x28x28."""
    return "x".join(str(d) for d in shape) or "()"


def summarize(train: ArrayDataset, held_out: ArrayDataset) -> DataSummary:
    import torch  # here: a message carrying a summary is read where torch is not loaded

    labels, counts = torch.unique(train.y, return_counts=True)
    return DataSummary(
        samples=len(train),
        held_out_samples=len(held_out),
        input_shape=tuple(int(d) for d in train.x.shape[1:]),
        labels=tuple(int(label) for label in torch.cat([train.y, held_out.y]).unique().tolist()),
        histogram={int(label): int(count) for label, count in zip(labels.tolist(), counts.tolist(), strict=True)},
    )


def check_fits(summary: DataSummary | DataFit, task: RunTask) -> list[str]:
    """Why data so summarised cannot train `task` (each reason a phrase about the data); empty if it can. Its fit
    (DataFit.of) gives the same verdict: its labels' ends are out of range where any label is."""
    reasons = []
    if summary.samples == 0:
        reasons.append("it holds no training samples")
    if summary.input_shape != task.input_shape:
        reasons.append(f"its samples have shape {shape_text(summary.input_shape)} but the run's model takes "
                       f"{shape_text(task.input_shape)}")
    outside = [label for label in summary.labels if not 0 <= label < task.num_classes]
    if outside:
        shown = ", ".join(str(label) for label in outside[:_LABELS_SHOWN]) + (", …" if len(outside) > _LABELS_SHOWN
                                                                               else "")
        reasons.append(f"its labels {shown} lie outside the run's {task.num_classes} classes "
                       f"(0 … {task.num_classes - 1})")
    return reasons
