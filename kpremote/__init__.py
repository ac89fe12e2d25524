"""kpremote: run GPU kernel optimization tasks on remote GPU hosts over SSH."""

__version__ = "0.1.0"
