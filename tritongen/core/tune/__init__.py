"""Search batching, queueing and instance settings with the simulator instead of the server.

Its parts: `inputs` (a candidate's settings and what a search needs), `candidates` (what is
tried), `engine_knobs` (an LLM engine's own knobs and where render writes them), `simulated` (a candidate as the simulator's model), `evaluation` (what the simulator predicts
for a candidate and how candidates rank), `search` (`tune_model`) and `apply` (a choice back into a
plan entry). This package names the public API; import it from here.

For each model of a deployment plan, `tune_model` enumerates candidates (max batch size,
preferred sizes, queue window, instance count, priority policy; for streaming LLMs the engine's
`max_num_seqs`, then its step token budget, prefix cache and (TensorRT-LLM's LLM-API) capacity
policy, staged around the best `max_num_seqs`: `engine_knobs`), simulates each under the traffic
with the model's profiled curve, and ranks them:

1. *Feasible* candidates meet every class's P99 target (time to first token for streaming
   models), lose at most `max_error_fraction` of any class to rejections or out-of-memory kills,
   and fit the memory budget (instances x per-instance memory within what the device has left).
2. Among feasible candidates the winner has the highest *capacity*: the largest multiple of the
   traffic's rate it still serves within every target (bisection on the rate, simulated), i.e.
   the best throughput that meets the targets. Ties go to fewer instances, then to more headroom
   (the smallest worst-class P99 / target).
3. When nothing is feasible, the candidate closest to its targets wins and the result says so.

The search is staged so hundreds of candidates fit in seconds: a coarse pass over max batch size x
instances with a middle window, then a fine pass over preferred sizes x windows x priority
policies around the best few coarse points. Pure: no I/O; `apply_candidate` turns a choice into a
plan entry the renderer writes.
"""

from tritongen.core.tune.inputs import Objective, Params, PolicyName, TuneInputs
from tritongen.core.tune.simulated import model_sim, queue_policies, server_for
from tritongen.core.tune.evaluation import (
    Evaluation,
    capacity_bound,
    capacity_factor,
    evaluate,
    judge,
    needed_capacity,
    rank_key,
)
from tritongen.core.tune.search import CAPACITY_STEPS, TuneResult, tune_for_capacity, tune_model
from tritongen.core.tune.apply import (
    apply_candidate,
    apply_results,
    baseline_params,
    entry_device,
    memory_budget,
    spec_with_tuned_engines,
)

__all__ = [
    "Objective", "Params", "PolicyName", "TuneInputs",
    "model_sim", "queue_policies", "server_for",
    "Evaluation", "capacity_bound", "capacity_factor", "evaluate", "judge", "needed_capacity", "rank_key",
    "CAPACITY_STEPS", "TuneResult", "tune_for_capacity", "tune_model",
    "apply_candidate", "apply_results", "baseline_params", "entry_device", "memory_budget", "spec_with_tuned_engines",
]
