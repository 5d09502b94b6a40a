"""The Flower side of `--engine flower`: what runs in Flower's own environment (the coordinator's ServerApp, a
hospital's bridge between its SuperNode and its fedcli node), importing only the standard library, Flower and
`wire`; fedcli's own side is fedcli/comm/relay_group.py."""
