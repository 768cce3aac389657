"""vtc: Virtual Token Counter fair scheduling across tenants.

Source: Sheng et al., "Fairness in Serving Large Language Models" (OSDI'24), Algorithm 1, and its
reference implementation (S-LoRA's VTCReqQueue: input_price 1, output_price 2, per-client weights).
Rule:
- Each tenant (Sequence.tenant) has a virtual counter c of the service it received, in weighted
  tokens divided by the tenant's weight: input_price per prompt token computed for the first time
  (prefix-cache hits and recompute after preemption are free) plus output_price per output token.
- Admission: repeatedly take the backlogged tenant (one with waiting requests) of the least
  counter and admit its earliest waiting request; a pick adds its prompt cost to that tenant's
  counter for the rest of the pass, so one step's admissions interleave tenants. The scheduler
  stops at the first request that does not fit (as the reference's `break`). Ties: the tenant
  whose head request arrived first.
- Counter lift: a tenant whose waiting queue was empty when a request arrives gets
  c = max(c, min of the other backlogged tenants' counters), so idling never banks credit.
  A new tenant starts at 0 before the lift.
- Counters are charged after each step (on_step) with what the step computed.
Running requests are served in arrival order and are not preempted for fairness (memory preemption
as vLLM, by the victim policy); swapped requests return in counter order.
Bound (the paper's Theorem for backlogged clients, as we read it): over any interval in which two
tenants are both backlogged, their weighted services differ by at most 2 * max(input_price *
L_input, output_price * M), L_input the longest prompt, M the most tokens a batch can hold.
tests/policies/test_policies_tenants.py checks it.
"""
from __future__ import annotations

import heapq
import math
from collections.abc import Mapping

from policies.scheduling._common import arrival_rank, check_positive
from policies.scheduling.base import SchedulingPolicy
from policies.victim.base import VictimPolicy


def check_tenant_weights(policy: str, weights) -> dict[str, float]:
    if weights is None:
        return {}
    if not isinstance(weights, Mapping):
        raise ValueError(f"{policy}.tenant_weights must be a mapping tenant -> weight (e.g. {{heavy: 1.0, "
                         f"light: 2.0}}), got {weights!r}")
    out = {}
    for tenant, w in weights.items():
        if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w) or w <= 0:
            raise ValueError(f"{policy}.tenant_weights[{tenant!r}] must be a finite number > 0, got {w!r}")
        out[str(tenant)] = float(w)
    return out


class VTCPolicy(SchedulingPolicy):
    name = "vtc"
    # on_step charges every step; the order depends on the counters
    fast_forward_ok = False

    def __init__(self, victim: VictimPolicy | None = None, input_price: float = 1.0, output_price: float = 2.0,
                 tenant_weights: Mapping | None = None):
        super().__init__(victim)
        self.input_price = check_positive(self.name, "input_price", input_price)
        self.output_price = check_positive(self.name, "output_price", output_price)
        self.tenant_weights = check_tenant_weights(self.name, tenant_weights)
        self.counters: dict[str, float] = {}    # tenant -> virtual service (weighted tokens / weight)
        # Per-request state, keyed by request_id and dropped when the request leaves.
        self._seen: dict = {}                   # request_id -> tenant, once its arrival was noted
        self._prompt_done: dict = {}            # prompt tokens already charged (first computation only)
        self._outputs: dict = {}                # output tokens already charged

    def weight(self, tenant: str) -> float:
        return self.tenant_weights.get(tenant, 1.0)

    def counter(self, tenant: str) -> float:
        return self.counters.get(tenant, 0.0)

    def key(self, seq, view):
        return (self.counter(seq.tenant), *arrival_rank(seq))

    # -- arrivals and the counter lift ------------------------------------------------
    def note_arrivals(self, waiting) -> None:
        """Lift the counter of each tenant that a new waiting request makes backlogged (arrival order)."""
        seen = self._seen
        new = []
        for s in reversed(waiting):     # arrivals join at the back; the requests before them were noted
            if s.request_id in seen:
                break
            new.append(s)
        if not new:
            return
        new.reverse()
        backlog: dict[str, int] = {}
        for s in waiting:
            if s.request_id in seen:
                backlog[s.tenant] = backlog.get(s.tenant, 0) + 1
        counters = self.counters
        for s in new:
            u = s.tenant
            c = counters.setdefault(u, 0.0)
            if not backlog.get(u):
                others = [counters[k] for k, n in backlog.items() if n and k != u]
                if others:
                    counters[u] = max(c, min(others))
            backlog[u] = backlog.get(u, 0) + 1
            seen[s.request_id] = u

    def order_waiting(self, waiting, view):
        self.note_arrivals(waiting)
        queues: dict[str, list] = {}
        for s in waiting:
            queues.setdefault(s.tenant, []).append(s)
        if len(queues) <= 1:
            return waiting
        return self._picks(queues)

    def _picks(self, queues: dict[str, list]):
        """Waiting requests in the order the least-counter rule admits them, each pick charged ahead."""
        heap = [(self.counter(t), arrival_rank(q[0]), t) for t, q in queues.items()]
        heapq.heapify(heap)
        pos = dict.fromkeys(queues, 0)
        while heap:
            c, _, t = heapq.heappop(heap)
            q = queues[t]
            seq = q[pos[t]]
            yield seq
            pos[t] += 1
            if pos[t] < len(q):
                cost = self.input_price * max(0, seq.num_prompt_tokens - self._prompt_done.get(seq.request_id, 0))
                heapq.heappush(heap, (c + cost / self.weight(t), arrival_rank(q[pos[t]]), t))

    # -- charging -----------------------------------------------------------------------
    def on_step(self, batch, view) -> None:
        self.note_arrivals(view.waiting)
        wp, wq = self.input_price, self.output_price
        done_map, out_map, counters = self._prompt_done, self._outputs, self.counters
        for seq, n, ctx in zip(batch.seqs, batch.num_new_tokens, batch.context_lens):
            rid = seq.request_id
            done = done_map.get(rid, 0)
            end = min(ctx, seq.num_prompt_tokens)
            new_prompt = max(0, end - max(ctx - n, done))   # skips prefix hits and recomputed tokens
            if end > done:
                done_map[rid] = end
            produced = seq.num_output_tokens - out_map.get(rid, 0)
            out_map[rid] = seq.num_output_tokens
            cost = wp * new_prompt + wq * produced
            if cost:
                t = seq.tenant
                counters[t] = counters.get(t, 0.0) + cost / self.weight(t)
            if seq.is_finished:         # charged its last step: forget it
                self._forget(rid)

    def on_finish(self, seq) -> None:
        # A finished request is forgotten in on_step, after its last step is charged; a rejected one now.
        if seq.finish_time_s is None:
            self._forget(seq.request_id)

    def _forget(self, rid) -> None:
        for state in (self._seen, self._prompt_done, self._outputs):
            state.pop(rid, None)

    def __repr__(self) -> str:
        return (f"VTCPolicy(victim={self.victim.name}, input_price={self.input_price:g}, "
                f"output_price={self.output_price:g}, tenant_weights={self.tenant_weights})")
