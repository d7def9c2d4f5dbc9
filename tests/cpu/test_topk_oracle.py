"""The top-k logprob oracle of the GPU suite's torch.compile family (``tests/gpu/topk_oracle.py``).

On made-up runs: what it accepts (plain's own spread, a near tie broken the
other way) and what it refuses (a distribution moved further than plain moves
from itself, a parting that is no tie, nothing compared). On the real CPU
server: the oracle reads both servers' replies, EdgeAcc's pass against plain's,
and the same replies with their distributions moved do not.
"""

from __future__ import annotations

import copy
import os

import pytest

from tests.gpu import topk_oracle
from tests.harness import SHARED_EDGE_ACC_LAUNCH, SHARED_LAUNCH

TINY_VOCAB = 537


def _request(tokens, tops):
    return {"tokens": list(tokens), "top": [[list(e) for e in top] for top in tops]}


def _plain():
    """Two requests of three tokens, the same in both orders."""
    tops = [[(-0.1, 7), (-2.5, 8), (-3.0, 9)], [(-0.2, 4), (-1.9, 5), (-4.0, 6)], [(-0.3, 1), (-0.35, 2), (-5, 3)]]
    run = [_request([7, 4, 1], tops), _request([7, 4, 1], tops)]
    return {"alone": run, "together": copy.deepcopy(run)}


def _again(plain, delta=0.01):
    """A second plain server's runs: one logprob ``delta`` away."""
    again = copy.deepcopy(plain)
    again["alone"][1]["top"][1][1][0] -= delta
    return again


def test_the_tolerance_follows_the_spread_between_two_plain_servers():
    plain = _plain()
    assert topk_oracle.spread(plain["alone"], _again(plain)["alone"]) == pytest.approx(0.01)
    assert topk_oracle.tolerance(plain, _again(plain)) == pytest.approx(0.02)
    assert topk_oracle.tolerance(plain, copy.deepcopy(plain)) == topk_oracle.FLOOR


def test_all_at_once_only_the_first_token_is_compared():
    # The decode steps after a batched prefill run in batches whose sizes follow each server's timing:
    # beyond the first token the order says nothing, one by one every position does.
    plain = _plain()
    later = copy.deepcopy(plain)
    later["together"][0]["top"][2][0][0] = -1.3  # 1.0 from plain, after the first token
    later["together"][1]["tokens"][1] = 5  # parts from plain (1.7 below its choice) at the second token
    assert topk_oracle.mismatches(plain, _again(plain), later) == []
    assert topk_oracle.tolerance(plain, later) == topk_oracle.FLOOR  # nor does it widen plain's spread
    first = copy.deepcopy(plain)
    first["together"][1]["top"][0][0][0] = -0.5  # 0.4 from plain at the first token
    problems = topk_oracle.mismatches(plain, _again(plain), first)
    assert len(problems) == 1 and "together[1] position 0" in problems[0], problems
    alone = copy.deepcopy(plain)
    alone["alone"][0]["top"][2][0][0] = -1.3
    alone["alone"][1]["tokens"][1] = 5
    problems = topk_oracle.mismatches(plain, _again(plain), alone)
    assert any("alone[0] position 2" in p for p in problems) and any("alone[1] position 1" in p for p in problems)


def test_all_at_once_is_one_batched_request():
    # One message to the scheduler: every server finds all the prompts waiting at once.
    calls = []

    def generate(ids, **kw):
        calls.append(ids)
        return [{"output_ids": [1], "meta_info": {"output_top_logprobs": [[[-0.1, 1, None]]]}} for _ in ids]

    runs = topk_oracle.run(generate, TINY_VOCAB, together=True, lengths=(3, 5), new_tokens=1)
    assert [len(c) for c in calls] == [2] and [len(p) for p in calls[0]] == [3, 5]
    assert runs == [{"tokens": [1], "top": [[[-0.1, 1]]]}] * 2


def test_plains_orders_disagreeing_with_each_other_do_not_widen_the_tolerance():
    # Under compile, plain's prompts sent together may get other distributions than one by one;
    # each order is compared with the same order of the other servers, so that is no spread.
    plain = _plain()
    for request in plain["together"]:
        request["top"][0] = [[-1.0, 50], [-1.2, 51], [-1.4, 52]]
    assert topk_oracle.tolerance(plain, copy.deepcopy(plain)) == topk_oracle.FLOOR


def test_edge_within_plains_spread_passes_and_a_moved_distribution_fails():
    plain = _plain()
    edge = copy.deepcopy(plain)
    edge["alone"][0]["top"][2][0][0] = -0.315  # 0.015 from plain: inside 2 x 0.01
    assert topk_oracle.mismatches(plain, _again(plain), edge) == []
    edge["alone"][0]["top"][2][0][0] = -0.4  # 0.1 from plain, the same greedy token
    problems = topk_oracle.mismatches(plain, _again(plain), edge)
    assert len(problems) == 1 and "alone[0] position 2" in problems[0], problems


def test_a_token_only_one_side_lists_counts_from_the_others_last_entry():
    plain = _plain()
    edge = copy.deepcopy(plain)
    edge["together"][0]["top"][0][2] = [-1.0, 99]  # plain's last entry there is -3.0
    problems = topk_oracle.mismatches(plain, _again(plain), edge)
    assert problems and "together[0] position 0" in problems[0], problems


def test_parting_at_a_near_tie_passes_and_elsewhere_fails():
    plain = _plain()
    tie = copy.deepcopy(plain)
    tie["alone"][1]["tokens"][2] = 2  # plain: token 1 at -0.3, token 2 at -0.35 -- 0.05 apart
    assert topk_oracle.mismatches(plain, _again(plain, 0.03), tie) == []  # tolerance 0.06
    assert any("near tie" in p for p in topk_oracle.mismatches(plain, _again(plain), tie))  # tolerance 0.02
    early = copy.deepcopy(plain)
    early["alone"][0]["tokens"][0] = 8  # 2.4 below plain's choice
    problems = topk_oracle.mismatches(plain, _again(plain), early)
    assert any("alone[0] position 0" in p and "near tie" in p for p in problems), problems


def _part_at_first_token(runs):
    parted = copy.deepcopy(runs)
    for run in parted.values():
        for request in run:
            request["tokens"][0] = 8 if request["tokens"][0] == 7 else 7
    return parted


def test_edge_must_keep_its_prefix_as_long_as_a_second_plain_server_does():
    plain = _plain()
    for request in plain["alone"]:  # six tokens one by one: twelve positions against two all at once
        request["tokens"] *= 2
        request["top"] *= 2
    # Parting at the first token, as a near tie (a wide spread): nothing after it is compared.
    wide = _again(plain, 3.0)
    edge = _part_at_first_token(plain)
    problems = topk_oracle.mismatches(plain, wide, edge)
    assert any("had EdgeAcc's prefix equal to plain's" in p for p in problems), problems
    # Where plain's own second server parts as early (there, token 8 ranks first), that is all that can be asked.
    early = _part_at_first_token(plain)
    for run in early.values():
        for request in run:
            request["top"][0] = [[-0.1, 8], [-2.5, 7], [-3.0, 9]]
    assert topk_oracle.mismatches(plain, early, edge) == []


@pytest.mark.reuses_kept_server
def test_the_oracle_reads_the_real_servers_replies_and_edge_acc_passes(cpu_servers):
    # The shared launch serves dummy weights, whose next-token distribution hardly depends on the
    # context: what this shows is that the oracle reads both servers' replies (top-k lists at every
    # position, in both orders) and compares them. That a moved distribution fails is shown above;
    # on the GPU the compile family serves the context-sensitive checkpoint.
    cpu_servers.prepare((SHARED_LAUNCH, None), (SHARED_EDGE_ACC_LAUNCH, None))
    sizes = dict(lengths=(12, 150, 400), new_tokens=12)
    plain_generate = cpu_servers.get(*SHARED_LAUNCH).generate
    # The second plain run comes from the same server here (its spread is then this server's own).
    plain, again = (topk_oracle.fingerprint(plain_generate, TINY_VOCAB, **sizes) for _ in range(2))
    edge = topk_oracle.fingerprint(cpu_servers.get(*SHARED_EDGE_ACC_LAUNCH).generate, TINY_VOCAB, **sizes)
    for run in (plain, again, edge):
        for order in ("alone", "together"):
            assert [len(r["tokens"]) for r in run[order]] == [12] * 3
            assert all(len(r["top"]) == 12 and all(len(t) == topk_oracle.TOPK for t in r["top"]) for r in run[order])
    assert topk_oracle.mismatches(plain, again, edge) == []
    moved = {order: [dict(r, top=[[[lp - 0.5, tok] for lp, tok in t] for t in r["top"]]) for r in runs]
             for order, runs in edge.items()}
    assert topk_oracle.mismatches(plain, again, moved), "a moved distribution passed against the real replies"


def test_the_suite_judges_edge_acc_against_both_plain_servers(monkeypatch):
    from tests.gpu import server_suite

    plain = _plain()
    edge = copy.deepcopy(plain)
    edge["alone"][0]["top"][2][0][0] = -0.4  # 0.1 from plain: outside twice the plain servers' 0.01

    def family(edge_topk, with_again=True):
        arms = {"plain": {"result": {"topk": plain}}, "edge-mps": {"result": {"topk": edge_topk}}}
        if with_again:
            arms["plain-again"] = {"result": {"topk": _again(plain)}}
        return {"tiny-torch-compile": {"oracle": "topk", "arms": arms}}

    results = family(copy.deepcopy(plain))
    server_suite.judge(results)
    arms = results["tiny-torch-compile"]["arms"]
    assert arms["plain"]["passed"] and arms["plain-again"]["passed"] and arms["edge-mps"]["passed"], arms
    assert arms["edge-mps"]["tolerance"] == pytest.approx(0.02)
    results = family(edge)
    server_suite.judge(results)
    assert not results["tiny-torch-compile"]["arms"]["edge-mps"]["passed"]
    # Until the second plain server has answered there is no tolerance, so no pass.
    results = family(copy.deepcopy(plain), with_again=False)
    server_suite.judge(results)
    assert not results["tiny-torch-compile"]["arms"]["edge-mps"]["passed"]
    # The second plain server gets plain's environment: no MPS client settings.
    monkeypatch.setenv("EDGEACC_SUITE_MPS_PIPE", "/tmp/edgeacc-test-pipe")
    assert server_suite._arm_env("plain-again", "cuda") == {}
    assert server_suite._arm_env("edge-mps", "cuda")["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/edgeacc-test-pipe"


def test_where_token_answers_part_each_servers_top_two_is_reported_beside_the_verdict():
    from tests.gpu import server_suite

    def top_two(tokens, second_gap):
        return [[[-0.1, t], [-0.1 - second_gap, t + 1]] for t in tokens]

    plain = {"solo_short": [5, 6, 7], "solo_long": [8, 9, 10, 11], "burst_solo": [[1, 2], [3, 4]],
             "top_two": {"solo_short": top_two([5, 6, 7], 2.0), "solo_long": top_two([8, 9, 10, 11], 2.0),
                         "burst_solo": [top_two([1, 2], 2.0), top_two([3, 4], 2.0)]}}
    plain["top_two"]["burst_solo"][1][1] = [[-0.5, 4], [-0.502, 5]]  # a near tie at burst_solo[1]'s token 1
    edge = copy.deepcopy(plain)
    edge["burst_solo"][1] = [3, 5]
    edge["top_two"]["burst_solo"][1][1] = [[-0.5, 5], [-0.501, 4]]
    results = {"tiny-h64-flashinfer": {"arms": {"plain": {"result": plain}, "edge-mps": {"result": edge}}}}
    server_suite.judge(results)
    entry = results["tiny-h64-flashinfer"]["arms"]["edge-mps"]
    # The verdict is the token comparison's; the top two say what kind of difference it was.
    assert not entry["passed"] and entry["mismatches"] == [f"burst_solo: {edge['burst_solo']} != {plain['burst_solo']}"]
    assert entry["parting_points"] == [
        "burst_solo[1] parts at token 1: plain chose 4, EdgeAcc 5; plain's top two 4 -0.5000, 5 -0.5020 "
        "(gap 0.0020); EdgeAcc's 5 -0.5000, 4 -0.5010 (gap 0.0010)"]
    assert any("where answers part" in line for line in server_suite.summary_lines(results))
    # Equal answers: nothing to report, and the top two are never compared themselves.
    same = {"tiny": {"arms": {"plain": {"result": plain}, "edge-mps": {"result": copy.deepcopy(plain)}}}}
    same["tiny"]["arms"]["edge-mps"]["result"]["top_two"]["solo_long"][0][0][0] = -0.3
    server_suite.judge(same)
    assert same["tiny"]["arms"]["edge-mps"]["passed"] and same["tiny"]["arms"]["edge-mps"]["parting_points"] == []


def test_the_compile_family_shares_the_kernels_its_first_plain_server_compiles(tmp_path):
    from tests.gpu import server_suite

    family = server_suite.families("cuda")["tiny-torch-compile"]
    assert family["compiled_by"] == "plain" and family["oracle"] == "topk"
    (tmp_path / "inductor-tiny-torch-compile" / "old").mkdir(parents=True)
    env = server_suite._compile_cache_env("tiny-torch-compile", family, tmp_path)
    cache = tmp_path / "inductor-tiny-torch-compile"
    assert env == {"TORCHINDUCTOR_CACHE_DIR": str(cache)} and list(cache.iterdir()) == []  # fresh, not a stale one
    assert server_suite._compile_cache_env("tiny", server_suite.families("cuda")["tiny"], tmp_path) == {}

    events = []

    class Server:
        def __init__(self, name, fails=False):
            self.name, self.fails, self.started_s = name, fails, 0.0

        def launch(self):
            events.append(("launch", self.name))

        def wait_healthy(self):
            events.append(("healthy", self.name))
            if self.fails:
                raise RuntimeError("exited")
            self.started_s = 1.0

    keys = [("f", "edge-mps"), ("f", "plain-again"), ("f", "plain")]
    server_suite.launch_together({k: Server(k[1]) for k in keys}, {("f", "plain")}, stagger_s=0)
    assert events[:2] == [("launch", "plain"), ("healthy", "plain")]
    assert sorted(events[2:]) == [("launch", "edge-mps"), ("launch", "plain-again")]
    # A compiling server that does not start holds nobody up: the others compile their own kernels.
    events.clear()
    server_suite.launch_together({("f", "plain"): Server("plain", fails=True), ("f", "edge-mps"): Server("edge-mps")},
                                 {("f", "plain")}, stagger_s=0)
    assert events == [("launch", "plain"), ("healthy", "plain"), ("launch", "edge-mps")]


def test_one_at_a_time_each_server_is_healthy_before_the_next_and_owns_the_cache_files_it_wrote(tmp_path):
    from tests.gpu import server_suite

    events = []
    cache = tmp_path / "cache"

    class Server:
        def __init__(self, name):
            self.name, self.started_s, self.env = name, 0.0, {"TORCHINDUCTOR_CACHE_DIR": str(cache)}

        def launch(self):
            events.append(("launch", self.name))
            # The first compiles a graph and tunes a kernel; the second tunes another; EdgeAcc tunes the
            # first one's kernel again, under the same name, with a config of its own.
            files = {"plain": {"fxgraph/ab/graph": "g", "xy/k1.best_config": '{"XBLOCK": 64}'},
                     "plain-again": {"xy/k2.best_config": '{"XBLOCK": 32}'},
                     "edge-mps": {"xy/k1.best_config": '{"XBLOCK": 128, "R0_BLOCK": 8}'}}[self.name]
            for name, text in files.items():
                (cache / name).parent.mkdir(parents=True, exist_ok=True)
                (cache / name).write_text(text)
                os.utime(cache / name, ns=(10**9 * len(events), 10**9 * len(events)))

        def wait_healthy(self):
            events.append(("healthy", self.name))
            self.started_s = 1.0

    keys = [("f", "plain"), ("f", "plain-again"), ("f", "edge-mps")]
    out_dir = tmp_path / "suite_logs"
    out_dir.mkdir()
    writers = server_suite.CacheWriters(out_dir)
    listed = []

    class Recording(Server):
        def launch(self):
            # Before each start, what the servers already healthy wrote is on disk.
            listed.append(sorted(path.name for path in out_dir.iterdir()))
            super().launch()

    server_suite.launch_together({k: Recording(k[1]) for k in keys}, {("f", "plain")}, stagger_s=0,
                                 one_at_a_time=True, writers=writers)
    assert events == [(step, name) for name in ("plain", "plain-again", "edge-mps") for step in ("launch", "healthy")]
    assert listed == [[], ["f_plain.inductor_written.txt"],
                      ["f_plain-again.inductor_written.txt", "f_plain.inductor_written.txt"]]
    assert (out_dir / "f_edge-mps.inductor_written.txt").read_text() == 'xy/k1.best_config {"XBLOCK": 128, "R0_BLOCK": 8}\n'
    assert writers.written == {
        ("f", "plain"): {"fxgraph/ab/graph": "", "xy/k1.best_config": '{"XBLOCK": 64}'},
        ("f", "plain-again"): {"xy/k2.best_config": '{"XBLOCK": 32}'},
        # A rewritten tuning is the rewriter's, with the config it chose; the first server's entry keeps its own.
        ("f", "edge-mps"): {"xy/k1.best_config": '{"XBLOCK": 128, "R0_BLOCK": 8}'},
    }
    assert server_suite.written_kinds(list(writers.written[("f", "plain")])) == {"fxgraph": 1, "best_config": 1}
    assert writers.describe(("f", "plain")) == 'fxgraph/ab/graph\nxy/k1.best_config {"XBLOCK": 64}\n'


def test_the_suite_runs_only_the_arms_asked_for_and_names_an_arm_a_family_lacks(capsys):
    from tests.gpu import server_suite

    with pytest.raises(SystemExit):
        server_suite.main(["--platform", "cpu", "--families", "tiny", "--arms", "edge-green"])
    assert "family tiny has no arms ['edge-green']" in capsys.readouterr().err


def test_the_arms_asked_for_start_in_the_order_given(monkeypatch, tmp_path):
    from tests.gpu import server_suite

    family = server_suite.families("cuda")["tiny-torch-compile"]
    assert family["arms"].index("plain-again") < family["arms"].index("edge-mps")  # the family's own order
    monkeypatch.setattr(server_suite, "families", lambda platform: {"tiny-torch-compile": family})
    seen = {}

    def fake_run_phase(fams, *args, **kwargs):
        seen.update({name: fam["arms"] for name, fam in fams.items()})
        return {}

    monkeypatch.setattr(server_suite, "run_phase", fake_run_phase)
    server_suite.main(["--platform", "cpu", "--families", "tiny-torch-compile", "--arms", "edge-mps,plain-again",
                       "--one-at-a-time", "--out", str(tmp_path / "suite.json")])
    assert seen == {"tiny-torch-compile": ("edge-mps", "plain-again")}
