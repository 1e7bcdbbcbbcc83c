// Command waggle-cni is Waggle's pod network plugin, CNI type "waggle". The
// container runtime (or the kubelet, libcni, cnitool) runs it with the CNI_*
// environment and the network configuration on stdin; the logic lives in
// package cni, and cni/README.md documents the configuration.
package main

import (
	"github.com/containernetworking/cni/pkg/skel"

	"github.com/waggle-io/waggle/cni"
	"github.com/waggle-io/waggle/internal/version"
)

func main() {
	skel.PluginMainFuncs(cni.Funcs(), cni.SupportedVersions, "waggle-cni "+version.Version+": Waggle's bridge + veth pod network plugin")
}
