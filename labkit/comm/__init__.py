"""Communication: simulated all-reduce algorithms (collectives), real torch.distributed processes (backend, the
launcher and the worker, launcher environments, demos), the nccl-tests style benchmark (bench, bench_report), and
the MPI lane (mpi, mpi_demos; sync SGD under mpiexec is parallel.data.sync_sgd_mpi) of notebooks 06 and 06b; and
the one grid of ranks every parallelism shares (mesh: the degrees, the divisibility rules, the process groups); and
the judge of a learner's distributed code on live ranks (rank_answers); and the rendezvous port a run holds
until its ranks are gone (ports).
"""

# the modules a learner uses (what the notebooks import; docs/api.md lists their names, one line each)
__all__ = ["backend", "bench", "bench_report", "collectives", "demos", "exercises", "launch", "launch_env", "mesh",
           "mpi", "ports", "rank_answers", "torchrun"]
