"""The hosts: hosts.toml read into Host records (config.py; each field's rules in hostrules.py, a value to coerce or
an error to word in hostsschema.py), a host's key trusted on purpose (hostkeys.py), the transport that reaches it
(connect.py), its agent called and shipped (agentclient.py; inprocessagent.py answers as one inside this process, for
tests), and every host asked at once (gpustatus.py)."""
