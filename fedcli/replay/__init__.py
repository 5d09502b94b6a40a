"""What a node shares and what the audit scores, as artifacts neutral to the generator kind and to the stages
that read them: buffers (replay/buffer.py), a node's train-gan record (replay/record.py) and the audit's
matched member and non-member groups (replay/groups.py)."""
