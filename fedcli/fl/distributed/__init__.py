"""The distributed engine: one torch.distributed process per node (`fedcli federate --engine distributed`)."""
