# Sourced by the GPU scripts: make this GPU machine the SSH host `h200-ssh` (../shared/gpu-host/start-sshd.sh),
# export the client's environment, write /tmp/hosts.toml. Needs $out.
bash .gpuhost/start-sshd.sh > "$out/sshd.txt" 2>&1 || { cat "$out/sshd.txt"; exit 1; }
eval "$(grep '^export' "$out/sshd.txt")"
export PYTHONPATH=$PWD:$PYTHONPATH PYTHONUNBUFFERED=1 COLUMNS=160
py=$(command -v python3)
cat > /tmp/hosts.toml <<EOT
[hosts.h200-ssh]
ssh = "root@127.0.0.1:2222"
identity_file = "~/.ssh/kpremote_test"
python = "$py"
arch = "h200"
remote_root = "~/kpremote-remote"
EOT
