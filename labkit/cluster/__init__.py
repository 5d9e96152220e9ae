"""Many machines on one box: emulated nodes (network namespaces and a shaped link), jobs launched per node with
torchrun, the link measured and modelled, what it does to sync SGD, node-local data, a node that fails, and the
Slurm script, the MPI lane and a real Slurm over the same nodes (notebook 12); where tensor parallelism (tp_mesh,
notebook 13) and expert parallelism (ep_mesh, notebook 15) go on them; a node lost in the middle of a distributed
checkpoint and the resume on the node left (lost_save, notebook 16)."""

# the modules a learner uses (what the notebooks import; docs/api.md lists their names, one line each)
__all__ = ["ep_mesh", "exercises", "failover", "lab", "link_scaling", "lost_save", "mpi_nodes", "nodes", "run",
           "shards", "slurm", "slurm_lab", "tp_mesh"]
