"""The history record of a cloud update."""
import math
from datetime import datetime, timezone

from shared.federation import round_record
from shared.schemas import ClientParticipation, EdgeContributionHeader, RoundRecord
from shared.training import Evaluation


def test_a_round_nobody_evaluated_reads_back_from_json():
    """An update whose clients reported no held-out figures has a NaN loss and accuracy; stored as
    JSON null it would not parse again and the run's info and history would answer 500."""
    header = EdgeContributionHeader(run_id="r", edge_id=0, base_version=0, idempotency_key="k", weight=1.0,
                                    clients=[ClientParticipation(client_id=0, num_samples=3, loss=0.5)])
    at = datetime.now(timezone.utc)
    record = round_record(0, [header], Evaluation(math.nan, math.nan, 0), at, at, at)
    again = RoundRecord.model_validate_json(record.model_dump_json())
    assert math.isnan(again.test_loss) and math.isnan(again.test_accuracy)
