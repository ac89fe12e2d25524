"""The half of kpremote that runs on the GPU host.

Imports only the standard library, torch, triton and pynvml, so it can be shipped as plain files
(content-hashed) and run by the host's own python without installing anything.
"""
