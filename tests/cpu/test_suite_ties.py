"""The GPU suite's token comparison in the bfloat16 families: a one-step tie may part, nothing else may.

The numbers are the tiny bfloat16 model's under FlashInfer on an H100: at its 14th token the
two candidates' logprobs were one bfloat16 step apart (2^-5) in one server and equal in the
other, and which server got which followed its batches, plain's as much as EdgeAcc's.
"""

from __future__ import annotations

import copy

from tests.gpu import server_suite

PREFIX = [462, 363, 262, 119, 192, 230, 289, 66, 144, 287, 263, 415, 235]
PLAIN_TAIL, EDGE_TAIL = [323, 288, 159], [93, 171, 412]


def _tops(tail_choice, at_tie):
    """Top two at each of 16 tokens: a clear winner everywhere but token 13, where ``at_tie`` is."""
    tops = [[[-0.5, t], [-2.5, 7]] for t in PREFIX]
    tops.append(at_tie)
    tops += [[[-0.5, t], [-2.5, 7]] for t in tail_choice[1:]]
    return tops


def _run(tail, at_tie):
    answer = PREFIX + tail
    other = [157, 288, 209, 506, 289, 495, 418, 260, 131, 178, 40, 512, 243, 408, 350, 502]
    return {"solo_long": [1, 2, 3], "radix_hit": [1, 2, 3], "burst": [answer, other], "burst_solo": [answer, other],
            "top_two": {"solo_short": [], "solo_long": [[[-0.1, t], [-3.0, 9]] for t in (1, 2, 3)],
                        "burst_solo": [_tops(tail, at_tie), [[[-0.5, t], [-2.5, 7]] for t in other]]}}


def _measured():
    plain = _run(PLAIN_TAIL, [[-2.6556, 323], [-2.6868, 93]])  # one step of 2^-5 apart
    edge = _run(EDGE_TAIL, [[-2.6829, 323], [-2.6829, 93]])  # equal, broken the other way
    return plain, edge


def test_a_one_step_tie_parts_in_bfloat16_families_and_nowhere_else():
    plain, edge = _measured()
    step = server_suite.families("cuda")["tiny-h64-flashinfer"]["tie_step"]
    assert server_suite.compare(plain, edge, step) == []
    # Without the family's tie step (the float32 families, and this comparison before it), the same fails.
    assert "tie_step" not in server_suite.families("cuda")["tiny"]
    problems = server_suite.compare(plain, edge)
    assert any(p.startswith("burst[0]") for p in problems) and any(p.startswith("burst_solo") for p in problems)


def test_a_wide_gap_or_a_token_plain_does_not_list_still_fails():
    step = server_suite.BF16_TIE_STEP
    wide_plain, edge = _measured()
    wide_plain["top_two"]["burst_solo"][0][13] = [[-2.5, 323], [-2.7, 93]]  # 0.2 apart: a choice, no tie
    assert server_suite.compare(wide_plain, edge, step)
    plain, unlisted = _measured()
    unlisted["burst_solo"][0] = unlisted["burst"][0] = PREFIX + [99, 171, 412]
    unlisted["top_two"]["burst_solo"][0][13] = [[-2.6829, 323], [-2.6829, 99]]
    assert server_suite.compare(plain, unlisted, step)


def test_a_tie_excuses_only_the_answers_that_parted_there():
    plain, edge = _measured()
    step = server_suite.BF16_TIE_STEP
    edge["radix_hit"] = [1, 2, 4]
    assert server_suite.compare(plain, edge, step) == ["radix_hit: [1, 2, 4] != [1, 2, 3]"]
    # A concurrent answer that is neither plain's nor EdgeAcc's own tied answer fails.
    plain, edge = _measured()
    edge["burst"][0] = PREFIX + [93, 5, 5]
    assert server_suite.compare(plain, edge, step) == [
        f"burst[0]: {edge['burst'][0]} is neither plain's batched {plain['burst'][0]} nor its solo answer"]
    # The other prompt's answer must still be equal.
    plain, edge = _measured()
    edge["burst_solo"][1] = copy.deepcopy(edge["burst_solo"][1])[:-1] + [1]
    assert any(p.startswith("burst_solo") for p in server_suite.compare(plain, edge, step))


def test_the_judge_reads_the_familys_tie_step():
    plain, edge = _measured()
    results = {"tiny-h64-flashinfer": {"tie_step": server_suite.BF16_TIE_STEP,
                                       "arms": {"plain": {"result": plain}, "edge-mps": {"result": edge}}}}
    server_suite.judge(results)
    assert results["tiny-h64-flashinfer"]["arms"]["edge-mps"]["passed"]
    del results["tiny-h64-flashinfer"]["tie_step"]
    server_suite.judge(results)
    assert not results["tiny-h64-flashinfer"]["arms"]["edge-mps"]["passed"]
