"""A run's members at this edge for one round: who the edge selects from, and declares to the cloud with its
contribution.

For a run with a selection, they are the devices connected here whose labels its device selector takes and whose
data (as they summarised it) fits the run's task; the others are refused, with the reasons, in the round's
failures. A device registered during a round is a member from the next one. One gone offline (not heard from for
two long-polls and 5 s) is in no round that starts meanwhile, which would only wait for it until the deadline; one
that leaves during a round is that round's dropout. A device that registered no summary of its data trains its
partition of the run's data set (client/worker.py, client_data), so any task fits it if its id names one of the
run's data.num_clients partitions (else it is refused, as it could train none). Without a selection the run
is the simulated federation: its roster at this edge, wherever its clients are (a launcher starts them here).
"""
from __future__ import annotations

from dataclasses import dataclass

from pydantic import ValidationError

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
            roster_samples: list[int] | None, elsewhere: dict[int, int] | None = None) -> Membership:
    """The run's members at edge `edge_id` now, of the `devices` registered here; `task` is what a selected run
    trains (None: any data fits), `roster_samples` a simulated run's sample counts where the edge knows them,
    `elsewhere` the devices another site holds in the run (device -> edge): refused here."""
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
        if elsewhere and client_id in elsewhere:
            refused.append(ClientFailure(client_id=client_id, error=f"refused for run {config.name!r}: it is a "
                                         f"member of the run at edge {elsewhere[client_id]}, and a device takes "
                                         "part at one site"))
            continue
        misfit = check_fits(reg.summary, task) if reg.summary is not None and task is not None else []
        if reg.summary is None and client_id >= config.data.num_clients:
            # Without data of its own it trains its partition of the run's data set (client/worker.py,
            # client_data), which has data.num_clients of them: any other id would fail every round it is given.
            misfit = [f"it registered no data of its own, so it trains its partition of the run's data set, and "
                      f"the run has {config.data.num_clients} (data.num_clients: 0 … {config.data.num_clients - 1})"]
        if not misfit:
            # What the cloud is told of it: a registration that cannot say it (whatever let it in) is this
            # device's refusal, never the round's failure, so one device cannot stop the others' rounds.
            try:
                Member(client_id=client_id, num_samples=reg.summary.samples if reg.summary is not None else None,
                       labels=reg.labels)
            except ValidationError as exc:
                misfit = [f"its registration cannot be declared ({exc.errors()[0]['msg']})"]
        if misfit:
            refused.append(ClientFailure(client_id=client_id, error=f"refused for run {config.name!r}: its data "
                                         f"does not fit: {'; '.join(misfit)}", kind="misfit"))
            continue
        ids.append(client_id)
        labels[client_id] = dict(reg.labels)
        if reg.summary is not None:
            samples[client_id] = reg.summary.samples
    return Membership(ids, samples, refused, labels)
