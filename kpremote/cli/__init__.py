"""The command line around the `inv` commands (kpremote/commands.py) and the `kpremote` command (program.py): one-line
errors, exit codes and the Ctrl-C handler per command (commandline.py), every option value checked before anything
connects (options.py), the one --json envelope (jsonout.py), and a stdout whose reader left (pipes.py)."""
