"""Communication: simulated all-reduce algorithms (collectives), real torch.distributed processes (backend, the
launcher and the worker, launcher environments, demos), the nccl-tests style benchmark (bench, bench_report), and
the MPI lane (mpi, mpi_demos, mpi_torch_demos) of notebooks 06 and 06b.
"""
