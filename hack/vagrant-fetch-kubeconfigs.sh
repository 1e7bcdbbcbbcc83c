#!/usr/bin/env bash
# Run on the host by the Vagrantfile's trigger once the control-plane VM is up:
# copies the admin kubeconfig it wrote into .waggle/, pointed at the control
# plane's private-network address, and the workers' (and further servers')
# join commands (rsynced to them).
set -euo pipefail
cp_ip=$1
mkdir -p .waggle && chmod 0700 .waggle
vagrant ssh control-plane -c "sudo cat /var/lib/waggle/admin.kubeconfig" 2>/dev/null |
  sed "s#server: https://.*#server: https://$cp_ip:6443#" > .waggle/admin.kubeconfig
[ -s .waggle/admin.kubeconfig ] || { echo "could not fetch admin.kubeconfig from the control plane" >&2; exit 1; }
# Both join commands name the server the control plane's kubeconfig uses; the
# other VMs reach it on its private-network address.
vagrant ssh control-plane -c "sudo cat /var/lib/waggle/join-command" 2>/dev/null |
  sed "s#--server https://[^ ]*#--server https://$cp_ip:6443#" > .waggle/join-command
grep -q '^waggle join ' .waggle/join-command || { echo "could not fetch the join command from the control plane" >&2; exit 1; }
if vagrant ssh control-plane -c "sudo test -s /var/lib/waggle/server-join-command" >/dev/null 2>&1; then
	vagrant ssh control-plane -c "sudo cat /var/lib/waggle/server-join-command" 2>/dev/null |
		sed "s#--server https://[^ ]*#--server https://$cp_ip:6443#" > .waggle/server-join-command
	grep -q '^waggle up --server ' .waggle/server-join-command || { echo "could not fetch the server join command" >&2; exit 1; }
fi
echo "admin kubeconfig and join command in .waggle/ (kubectl --kubeconfig .waggle/admin.kubeconfig get nodes)"
