"""The hosts: hosts.toml read by its one reader (hostrules.py: each field's rules) into Host records (config.py), a
host's key trusted on purpose (hostkeys.py), the transport that reaches it (connect.py), its agent called and shipped
(agentclient.py; inprocessagent.py answers as one inside this process, for tests), several hosts at once (fanout.py),
and what each says of its GPUs or itself (gpustatus.py)."""
