"""Communication hidden behind compute (notebook 17): gradient all-reduces launched from hooks during backward,
the exposed time they leave, DDP's and FSDP2's knobs for it, and where overlap cannot help.

grad_sync (naive, per-parameter and bucketed syncs behind one interface; the layer timeline) < runs (on real ranks:
against DDP's gradients, every sync timed in interleaved rounds) < link_runs (the same timing on notebook 12's two
emulated nodes with a shaped link) ; exposed (the formulas: T_exposed = max(0, T_comm - T_overlappable), the bucket
schedule) < report (tables, verdicts against the rival 'no overlap', figures); fsdp_runs (DDP's bucket_cap_mb and
comm hook, FSDP2's prefetch and reshard_after_forward, on real ranks); exercises; hook_exercise (the learner's own
overlapping DDP comm hook, judged on live ranks by labkit.comm.rank_answers and timed on a shaped link). Li et al. 2020 (arXiv:2006.15704)
for DDP's buckets; Zhao et al. 2023 (arXiv:2304.11277) for FSDP.
"""

__all__ = ["exercises", "exposed", "fsdp_runs", "grad_sync", "hook_exercise", "link_runs", "report", "runs"]
