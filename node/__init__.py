"""A node's processes, on the HTTP core (api/): the one that writes, the workers that
answer on the port beside it, and the channel between them.

`ckpt serve` runs `serve` (node/serve.py). With one process it is the whole service
(`api.app.Alone`); with several, it is the `Writer` (node/writer.py) and starts its
`Worker`s (node/worker.py, node/supervisor.py), which reach it three ways: prepared saves
on the calls channel (node/channel.py names its message kinds and framing, node/calls.py
speaks it), forwarded requests on the engine socket (node/forward.py) and whole
connections handed over (node/handoff.py), each socket taking connections from its
workers alone (node/peercred.py).
"""
