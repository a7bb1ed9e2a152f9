"""What the cloud tells edges about their contributions' wait in the buffer (the DVFS slack policy)."""
from fl_services.cloud.orchestrator import buffer_waits
from fl_services.cloud.storage import BufferedContribution
from fl_services.shared.core.reports import ClientParticipation, EdgeContributionHeader


def entry(edge_id: int, millis: int) -> BufferedContribution:
    header = EdgeContributionHeader(run_id="r", edge_id=edge_id, base_version=0, idempotency_key=f"r:{edge_id}:0",
                                    weight=1.0, clients=[ClientParticipation(client_id=edge_id, num_samples=1,
                                                                             loss=0.0)])
    return BufferedContribution(f"{millis}-0", header, b"", received_s=millis / 1000)


def test_each_waits_for_the_latest_of_the_others_and_the_last_gets_its_lag():
    waits = buffer_waits([entry(0, 1_000), entry(1, 4_000), entry(2, 2_500)])
    assert waits == {0: 3.0, 1: -1.5, 2: 1.5}


def test_a_buffer_of_one_says_nothing():
    assert buffer_waits([entry(0, 1_000)]) == {}
