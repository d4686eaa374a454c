"""The store's spelled-out state lists agree with the state machine's."""

from openhub.core.states import FINAL
from openhub.store.schema import LIVE_PREDICATE


def test_live_predicate_excludes_exactly_the_final_states() -> None:
    assert set(LIVE_PREDICATE.split("'")[1::2]) == {s.value for s in FINAL}
