"""Data parallelism: synchronous SGD from scratch (equal to DDP), when R replicas beat one (the cost model, real
gloo or NCCL measurements, the speed-up explorer), published scaling points and their charts (notebook 07).

costmodel (T_comp vs T_sync, the formulas) < sync_sgd (from scratch, = DDP) < scaling (measured on real processes,
compared with the model) < speedup (the explorer's maths); sync_sgd_mpi (the same under mpiexec); published (cited
scaling points); plots (charts, kept out of what ranks import); exercises (07's checked exercises).
"""

# the modules a learner uses (docs/api.md lists their names, one line each)
__all__ = ["costmodel", "exercises", "plots", "published", "scaling", "speedup", "sync_sgd", "sync_sgd_mpi"]
