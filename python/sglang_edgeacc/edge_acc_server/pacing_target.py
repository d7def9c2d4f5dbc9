"""The inter-token target of a running server, changed through upstream's ``/set_internal_state``.

Where the first token and the gaps between tokens should meet depends on the load
and on what the clients stream, so an operator can move the target without a
restart (and a benchmark can measure several targets on one warm server)::

    curl -X POST http://localhost:30000/set_internal_state -H 'Content-Type: application/json' \\
         -d '{"server_args": {"edge_acc_itl_slo_ms": 75}}'

The answer is upstream's: one ``true``/``false`` per DP rank. Every decode side
(each TP and DP rank) gets the request in the same pass of its loop, as every
other request, and aims its next step at the new target. A refused value changes
nothing and says why in the server log, as upstream's own keys do; other keys in the
same request go to upstream, and nothing is changed unless all are accepted.
"""

from __future__ import annotations

import math
from typing import Mapping, Optional

KEY = "edge_acc_itl_slo_ms"


def split_request(server_args: Mapping[str, object]) -> tuple[Optional[object], dict]:
    """The target asked for (None: not asked) and the keys left for upstream."""
    rest = {key: value for key, value in server_args.items() if key != KEY}
    return server_args.get(KEY), rest


def refusal(value: object, pacing_on: bool) -> Optional[str]:
    """Why ``value`` cannot become the target (None: it can)."""
    if not pacing_on:
        return (f"{KEY} not changed: decode pacing is off (--edge-acc-decode-pacing off), so no target is "
                "followed; start the server with pacing on to set one")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        return f"{KEY} not changed: {value!r} is not a positive number of milliseconds"
    return None
