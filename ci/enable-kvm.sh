#!/usr/bin/env bash
# Hosted Linux runners that offer virtualisation have /dev/kvm, owned by
# root: the usual udev rule opens it to the runner's user. Without
# /dev/kvm, guests run under TCG (kloop says so on its accelerator line).
set -euo pipefail
if [ -e /dev/kvm ]; then
  echo 'KERNEL=="kvm", GROUP="kvm", MODE="0666", OPTIONS+="static_node=kvm"' \
    | sudo tee /etc/udev/rules.d/99-kvm.rules
  sudo udevadm control --reload-rules
  sudo udevadm trigger --name-match=kvm
else
  echo "no /dev/kvm on this runner: guests run under TCG"
fi
