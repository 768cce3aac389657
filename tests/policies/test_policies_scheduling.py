"""Exact timelines: each scheduling policy against fcfs/vllm on the same requests.

Fake clock t = step index, null executor (token 0, ignore_eos), block_size 4.
Timelines list, per step, (request id, tokens computed) in batch order
(prefill entries first, then decodes). Every expected list is worked out by hand
in the comments; prefix caching is on, so a recompute after preemption re-uses
the victim's still-cached full blocks.
"""
from __future__ import annotations

from policies.scheduling.fcfs import FCFSPolicy
from policies.scheduling.mlfq import MLFQPolicy
from policies.scheduling.priority import PriorityPolicy
from policies.scheduling.sarathi import SarathiPolicy
from policies.scheduling.sjf import SJFPolicy
from policies.scheduling.srpt import SRPTPolicy
from policies.scheduling.vllm import VLLMPolicy
from policies.scheduling.vllm_swap import VLLMSwapPolicy
from tests.helpers import Req, drive


def test_srpt_finishes_short_job_behind_long_one_first():
    # One sequence slot. L (6 outputs) starts at t0; S (2 outputs) arrives at t1.
    reqs = [Req("L", 4, 6, arrival=0), Req("S", 4, 2, arrival=1)]
    fcfs = drive(VLLMPolicy(), reqs, num_kvcache_blocks=16, max_num_seqs=1)
    # vllm: L runs to completion (t0 prefill, t1..t5 decodes), then S.
    assert fcfs.timeline == [[("L", 4)]] + [[("L", 1)]] * 5 + [[("S", 4)], [("S", 1)]]
    assert fcfs.finish_step("S") == 7 and fcfs.finish_step("L") == 5

    srpt = drive(SRPTPolicy(), reqs, num_kvcache_blocks=16, max_num_seqs=1)
    # t1: S's remaining (2 + 4/256) < L's (6-1 = 5) and the slot is the obstacle: L is preempted,
    # S prefills. t2: S decodes and finishes. t3: L comes back; its prompt block is still cached,
    # so it recomputes only its 1 output token, then decodes its remaining 4 tokens.
    assert srpt.timeline == [[("L", 4)], [("S", 4)], [("S", 1)], [("L", 1)]] + [[("L", 1)]] * 4
    assert srpt.preempted[1] == ["L"]
    assert srpt.finish_step("S") == 2 and srpt.finish_step("L") == 7
    assert srpt.seqs["L"].num_preemptions == 1


def test_mlfq_demotes_long_job_after_its_quantum():
    # One slot; quantum 2 tokens at level 0, 4 at level 1; prompts cost nothing (weight 0).
    reqs = [Req("A", 4, 8, arrival=0), Req("B", 4, 2, arrival=2)]
    levels = {}

    def observe(t, sched, batch):
        levels[t] = sched.policy.level(sched.view.running[0]) if sched.running else None

    fcfs = drive(VLLMPolicy(), reqs, num_kvcache_blocks=16, max_num_seqs=1)
    assert fcfs.timeline == [[("A", 4)]] + [[("A", 1)]] * 7 + [[("B", 4)], [("B", 1)]]

    mlfq = MLFQPolicy(base_quantum=2, num_levels=4, prompt_token_weight=0.0, starvation_s=None)
    run = drive(mlfq, reqs, num_kvcache_blocks=16, max_num_seqs=1, observe=observe)
    # t0 prefill (1 token of service), t1 second token: quantum 2 used, A drops to level 1.
    # t2: B arrives at level 0 and preempts A; t3 B finishes; t4 A returns (prompt block cached:
    # recomputes its 2 outputs), then decodes; after 4 tokens at level 1 (t7) it drops to level 2.
    assert run.timeline == [[("A", 4)], [("A", 1)], [("B", 4)], [("B", 1)], [("A", 2)]] + [[("A", 1)]] * 5
    assert run.preempted[2] == ["A"]
    assert levels[0] == 0 and levels[1] == 1 and levels[6] == 1 and levels[7] == 2
    assert run.finish_step("B") == 3 and fcfs.finish_step("B") == 9
    assert not mlfq._level and not mlfq._charge    # per-request state dropped on finish


def test_mlfq_skip_join_and_starvation_promotion():
    mlfq = MLFQPolicy(base_quantum=1, num_levels=5, prompt_token_weight=0.5, starvation_s=3)
    short, long = Req("s", 2, 1), Req("l", 12, 1)
    from tests.helpers import seq_of
    assert mlfq.entry_level(seq_of(short, 0)) == 0     # cost 1 <= quantum 1
    assert mlfq.entry_level(seq_of(long, 1)) == 3      # cost 6: quanta 1, 2, 4, 8 -> level 3
    assert mlfq.entry_level(seq_of(Req("x", 64, 1), 2)) == 4   # capped at the last level

    # Starvation: one slot; H (prompt 2 -> level 0, 20 outputs) holds it while W (prompt 12 ->
    # level 3) waits; after 3 unserved seconds W is promoted to level 0 and preempts H.
    reqs = [Req("H", 2, 20, arrival=0), Req("W", 12, 1, arrival=0)]
    run = drive(mlfq, reqs, num_kvcache_blocks=32, max_num_seqs=1)
    # H charge: t0 2*0.5 + 1 = 2 >= 1 -> level 1; t1 1; t2 2 >= 2 -> level 2; t3 1 < 4.
    # W cannot preempt before: its level 3 is worse than H's. In on_step of t3
    # (now 3) W has waited 3 s since arrival -> level 0. t4: W preempts H (level 2), prefills
    # and finishes (1 output).
    assert run.timeline[:4] == [[("H", 2)], [("H", 1)], [("H", 1)], [("H", 1)]]
    assert run.timeline[4] == [("W", 12)] and run.preempted[4] == ["H"]
    assert run.finish_step("W") == 4


def test_priority_preempts_running_low_priority_request():
    # 4 blocks of 4 tokens. L (priority 5) fills 3 blocks at t0; H (priority 0) arrives at t1
    # needing 2 blocks with 1 free.
    reqs = [Req("L", 12, 2, arrival=0, priority=5), Req("H", 8, 2, arrival=1, priority=0)]
    vllm = drive(VLLMPolicy(), reqs, num_kvcache_blocks=4)
    # vllm: H cannot be admitted at t1, L decodes (takes the last block) and finishes; then H.
    assert vllm.timeline == [[("L", 12)], [("L", 1)], [("H", 8)], [("H", 1)]]
    assert vllm.finish_step("H") == 3

    prio = drive(PriorityPolicy(), reqs, num_kvcache_blocks=4)
    # t1: H blocked by memory preempts L (phase 0) and prefills. L's 3 prompt blocks were cached;
    # H's allocation took the spare block and evicted L's tail block (LRU). t2: H's decode evicts
    # L's second block; H finishes. t3: L re-admitted with its first block cached: 13 - 4 = 9 tokens.
    assert prio.timeline == [[("L", 12)], [("H", 8)], [("H", 1)], [("L", 9)]]
    assert prio.preempted[1] == ["L"]
    assert prio.finish_step("H") == 2 and prio.finish_step("L") == 3


def test_sjf_reorders_waiting_queue_without_preempting():
    # One slot. A (3 outputs) runs first; B (5 outputs, arrival 0) and C (1 output, arrival 1) wait.
    reqs = [Req("A", 4, 3, arrival=0), Req("B", 4, 5, arrival=0), Req("C", 4, 1, arrival=1)]
    fcfs = drive(FCFSPolicy(), reqs, num_kvcache_blocks=16, max_num_seqs=1)
    assert fcfs.timeline == [[("A", 4)], [("A", 1)], [("A", 1)], [("B", 4)]] + [[("B", 1)]] * 4 + [[("C", 4)]]
    sjf = drive(SJFPolicy(), reqs, num_kvcache_blocks=16, max_num_seqs=1)
    # C is shorter than A's remaining work at t1 but SJF does not preempt: A finishes at t2,
    # then C (cost 1 + 4/256) jumps ahead of B (cost 5 + 4/256).
    assert sjf.timeline == [[("A", 4)], [("A", 1)], [("A", 1)], [("C", 4)], [("B", 4)]] + [[("B", 1)]] * 4
    assert not any(sjf.preempted)
    assert sjf.finish_step("C") == 3 and fcfs.finish_step("C") == 8


def test_sarathi_respects_budget_and_never_stalls_decodes():
    # A decodes while B's 20-token prompt arrives at t1.
    reqs = [Req("A", 4, 5, arrival=0), Req("B", 20, 2, arrival=1)]
    vllm = drive(VLLMPolicy(), reqs, num_kvcache_blocks=32)
    # vllm (no chunking): B's whole prefill runs alone at t1, stalling A's decode.
    assert vllm.timeline == [[("A", 4)], [("B", 20)], [("A", 1), ("B", 1)], [("A", 1)], [("A", 1)], [("A", 1)]]

    run = drive(SarathiPolicy(token_budget=8), reqs, num_kvcache_blocks=32)
    # Budget 8: A's decode (1) first, B's prompt in chunks of 7, 7, 6; then both decode.
    assert run.timeline == [[("A", 4)], [("B", 7), ("A", 1)], [("B", 7), ("A", 1)], [("B", 6), ("A", 1)],
                            [("A", 1), ("B", 1)]]
    assert all(sum(n for _, n in step) <= 8 for step in run.timeline)
    assert all(("A", 1) in step for step in run.timeline[1:])   # A emits a token every step


def test_vllm_swap_swaps_out_and_back_in():
    # 4 GPU blocks; A and B (4 + 6 tokens, 3 blocks each at the end) outgrow the cache at t5.
    reqs = [Req("A", 4, 6), Req("B", 4, 6)]
    rec = drive(VLLMPolicy(), reqs, num_kvcache_blocks=4)
    swap = drive(VLLMSwapPolicy(), reqs, num_kvcache_blocks=4, num_cpu_blocks=8)
    common = [[("A", 4), ("B", 4)]] + [[("A", 1), ("B", 1)]] * 4 + [[("A", 1)]]
    # t5: A needs a third block, none is free: the newest (B) is preempted; A finishes.
    # Recompute: B re-prefills at t6, its prompt block cached (its 2nd block was evicted): 9 - 4 = 5.
    assert rec.timeline == common + [[("B", 5)]]
    assert rec.preempted[5] == ["B"] and not any(rec.swap_out)
    # Swap: B's 2 blocks go to CPU at t5 and come back at t6, where B just decodes.
    assert swap.timeline == common + [[("B", 1)]]
    assert len(swap.swap_out[5]) == 2 and len(swap.swap_in[6]) == 2
    assert [c for c, _ in swap.swap_in[6]] == [c for _, c in swap.swap_out[5]]   # same CPU blocks
    assert not any(swap.preempted) and swap.seqs["B"].num_swaps == 1
    assert swap.scheduler.block_manager.num_cpu_free_blocks == 8
