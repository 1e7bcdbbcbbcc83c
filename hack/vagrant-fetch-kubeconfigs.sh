#!/usr/bin/env bash
# Run on the host by the Vagrantfile's trigger once the control-plane VM is up:
# copies the kubeconfigs it wrote into .waggle/ (rsynced to the workers),
# pointed at the control plane's private-network address.
set -euo pipefail
cp_ip=$1
mkdir -p .waggle && chmod 0700 .waggle
for c in admin bootstrap proxy; do
  vagrant ssh control-plane -c "sudo cat /var/lib/waggle/$c.kubeconfig" 2>/dev/null |
    sed "s#server: https://.*#server: https://$cp_ip:6443#" > ".waggle/$c.kubeconfig"
  [ -s ".waggle/$c.kubeconfig" ] || { echo "could not fetch $c.kubeconfig from the control plane" >&2; exit 1; }
done
echo "kubeconfigs in .waggle/ (kubectl --kubeconfig .waggle/admin.kubeconfig get nodes)"
