"""Distributed checkpoints that reshard and survive: FSDP2 + Adam saved with ``torch.distributed.checkpoint`` (DCP)
against rank-0 ``torch.save``, resumed on another number of ranks or another dp x tp split, saved asynchronously,
a save cut short or out of disk space, how often to save (Young 1974, Daly 2006), and replica groups that train on
when one is lost (torchft: replicas). Notebook 16.
"""

# the modules a learner uses (what the notebooks import; docs/api.md lists their names, one line each)
__all__ = ["async_saves", "exercises", "interval", "mesh_reshard", "replicas", "report", "save_exercise", "saves",
           "store", "trainer"]
