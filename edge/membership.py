"""A run's members at this edge for one round: who the edge selects from, and declares to the cloud with its
contribution.

For a run with a selection, they are the devices registered here whose labels its device selector takes and whose
data (as they summarised it) fits the run's task; the others are refused, with the reasons, in the round's
failures. A device registered during a round is a member from the next one; one that left stays registered, a
dropout. Without a selection the run is the simulated federation: its roster at this edge, wherever its clients
are (a launcher starts them here).
"""
from __future__ import annotations

from dataclasses import dataclass

from fl_services.shared.core.config import RunConfig, matches
from fl_services.shared.core.data.summary import RunTask, check_fits
from fl_services.shared.core.reports import ClientFailure, Member
from fl_services.shared.wire.client_edge import ClientRegistration


@dataclass(frozen=True)
class Membership:
    ids: list[int]  # ascending
    samples: dict[int, int]  # the training sample counts known (a device's summary, a partition's size)
    refused: list[ClientFailure]  # devices the selection takes whose data cannot train the run
    labels: dict[int, dict[str, str]]  # those the members registered with (a run over registered devices)

    def declared(self) -> list[Member]:
        return [Member(client_id=k, num_samples=self.samples.get(k), labels=self.labels.get(k, {})) for k in self.ids]


def members(config: RunConfig, edge_id: int, devices: dict[int, ClientRegistration], task: RunTask | None,
            roster_samples: list[int] | None) -> Membership:
    """The run's members at edge `edge_id` now, of the `devices` registered here; `task` is what a selected run
    trains (None: any data fits), `roster_samples` a simulated run's sample counts where the edge knows them."""
    selection = config.selection
    if selection is None:
        ids = config.clients_of_edge(edge_id)
        known = {k: roster_samples[k] for k in ids} if roster_samples is not None else {}
        return Membership(ids, known, [], {})
    ids, samples, refused, labels = [], {}, [], {}
    for client_id in sorted(devices):
        reg = devices[client_id]
        if not matches(reg.labels, selection.device_selector):
            continue
        misfit = check_fits(reg.summary, task) if reg.summary is not None and task is not None else []
        if misfit:
            refused.append(ClientFailure(client_id=client_id, error=f"refused for run {config.name!r}: its data "
                                         f"does not fit: {'; '.join(misfit)}"))
            continue
        ids.append(client_id)
        labels[client_id] = dict(reg.labels)
        if reg.summary is not None:
            samples[client_id] = reg.summary.samples
    return Membership(ids, samples, refused, labels)
