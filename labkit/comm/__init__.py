"""Communication: simulated all-reduce algorithms, real torch.distributed processes (launcher, worker, launcher
environments), the nccl-tests style benchmark, and the MPI lane (notebooks 06, 06b).
"""
