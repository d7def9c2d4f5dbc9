"""The top-k logprob oracle of the GPU suite's torch.compile family (``tests/gpu/topk_oracle.py``).

On made-up runs: what it accepts (plain's own spread, a near tie broken the
other way) and what it refuses (a distribution moved further than plain moves
from itself, a parting that is no tie, nothing compared). On the real CPU
server: the oracle reads both servers' replies, EdgeAcc's pass against plain's,
and the same replies with their distributions moved do not.
"""

from __future__ import annotations

import copy

import pytest

from tests.gpu import topk_oracle
from tests.harness import SHARED_EDGE_ACC_LAUNCH, SHARED_LAUNCH

TINY_VOCAB = 537


def _request(tokens, tops):
    return {"tokens": list(tokens), "top": [[list(e) for e in top] for top in tops]}


def _plain():
    """Two requests of three tokens; the second run differs from the first by 0.01 at most."""
    tops = [[(-0.1, 7), (-2.5, 8), (-3.0, 9)], [(-0.2, 4), (-1.9, 5), (-4.0, 6)], [(-0.3, 1), (-0.35, 2), (-5, 3)]]
    alone = [_request([7, 4, 1], tops), _request([7, 4, 1], tops)]
    together = copy.deepcopy(alone)
    together[1]["top"][1][1][0] = -1.91
    return {"alone": alone, "together": together}


def test_the_tolerance_follows_plains_own_spread():
    plain = _plain()
    assert topk_oracle.spread(plain["alone"], plain["together"]) == pytest.approx(0.01)
    assert topk_oracle.tolerance(plain) == pytest.approx(0.02)
    identical = {"alone": plain["alone"], "together": copy.deepcopy(plain["alone"])}
    assert topk_oracle.tolerance(identical) == topk_oracle.FLOOR


def test_edge_within_plains_spread_passes_and_a_moved_distribution_fails():
    plain = _plain()
    edge = copy.deepcopy(plain)
    edge["alone"][0]["top"][2][0][0] = -0.315  # 0.015 from plain: inside 2 x 0.01
    assert topk_oracle.mismatches(plain, edge) == []
    edge["alone"][0]["top"][2][0][0] = -0.4  # 0.1 from plain, the same greedy token
    problems = topk_oracle.mismatches(plain, edge)
    assert len(problems) == 1 and "alone[0] position 2" in problems[0], problems


def test_a_token_only_one_side_lists_counts_from_the_others_last_entry():
    plain = _plain()
    edge = copy.deepcopy(plain)
    edge["together"][0]["top"][0][2] = [-1.0, 99]  # plain's last entry there is -3.0
    problems = topk_oracle.mismatches(plain, edge)
    assert problems and "together[0] position 0" in problems[0], problems


def test_parting_at_a_near_tie_passes_and_elsewhere_fails():
    plain = _plain()
    tie = copy.deepcopy(plain)
    tie["alone"][1]["tokens"][2] = 2  # plain: token 1 at -0.3, token 2 at -0.35 -- 0.05 apart
    plain_wide = copy.deepcopy(plain)
    plain_wide["together"][0]["top"][0][0][0] = -0.13  # a spread of 0.03: 0.05 apart is a tie at 0.06
    assert topk_oracle.mismatches(plain_wide, tie) == []
    assert any("near tie" in p for p in topk_oracle.mismatches(plain, tie))  # tolerance 0.02
    early = copy.deepcopy(plain)
    early["alone"][0]["tokens"][0] = 8  # 2.4 below plain's choice
    problems = topk_oracle.mismatches(plain, early)
    assert any("alone[0] position 0" in p and "near tie" in p for p in problems), problems


def test_an_oracle_that_compares_nothing_fails():
    plain = _plain()
    edge = copy.deepcopy(plain)
    for run in edge.values():
        for request in run:
            request["tokens"][0] = 8 if request["tokens"][0] == 7 else 7
    assert any("positions had equal prefixes" in p for p in topk_oracle.mismatches(plain, edge))


@pytest.mark.reuses_kept_server
def test_the_oracle_reads_the_real_servers_replies_and_edge_acc_passes(cpu_servers):
    # The shared launch serves dummy weights, whose next-token distribution hardly depends on the
    # context: what this shows is that the oracle reads both servers' replies (top-k lists at every
    # position, in both orders) and compares them. That a moved distribution fails is shown above;
    # on the GPU the compile family serves the context-sensitive checkpoint.
    cpu_servers.prepare((SHARED_LAUNCH, None), (SHARED_EDGE_ACC_LAUNCH, None))
    sizes = dict(lengths=(12, 150, 400), new_tokens=12)
    plain = topk_oracle.fingerprint(cpu_servers.get(*SHARED_LAUNCH).generate, TINY_VOCAB, **sizes)
    edge = topk_oracle.fingerprint(cpu_servers.get(*SHARED_EDGE_ACC_LAUNCH).generate, TINY_VOCAB, **sizes)
    for run in (plain, edge):
        for order in ("alone", "together"):
            assert [len(r["tokens"]) for r in run[order]] == [12] * 3
            assert all(len(r["top"]) == 12 and all(len(t) == topk_oracle.TOPK for t in r["top"]) for r in run[order])
    assert topk_oracle.mismatches(plain, edge) == []
    moved = {order: [dict(r, top=[[[lp - 0.5, tok] for lp, tok in t] for t in r["top"]]) for r in runs]
             for order, runs in edge.items()}
    assert topk_oracle.mismatches(plain, moved), "a moved distribution passed against the real replies"
