package cluster

import (
	"reflect"
	"strings"
	"testing"

	"github.com/containernetworking/plugins/pkg/ns"

	"github.com/waggle-io/waggle/internal/testutil"
)

func TestNodePortDevicesSpecs(t *testing.T) {
	for _, c := range []struct {
		spec, ip string
		want     []string
		err      string
	}{
		{spec: "", want: nil},
		{spec: "none", want: nil},
		{spec: "eth1", want: []string{"eth1"}},
		{spec: "eth0, ens5", want: []string{"eth0", "ens5"}},
		{spec: "auto", ip: "127.0.0.1", want: nil}, // a loopback node reaches nothing from outside
		{spec: "eth0,,eth1", err: "want auto, none or comma-separated device names"},
		{spec: "a/b", err: "want auto, none or comma-separated device names"},
		{spec: "auto", ip: "not-an-ip", err: `node IP "not-an-ip"`},
		{spec: "auto", ip: "192.0.2.77", err: "no device holds the node's address 192.0.2.77"},
	} {
		got, err := NodePortDevices(c.spec, c.ip)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("NodePortDevices(%q, %q) = %v, %v; want error %q", c.spec, c.ip, got, err, c.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("NodePortDevices(%q, %q) = %v, %v; want %v", c.spec, c.ip, got, err, c.want)
		}
	}
}

// TestNodePortDevicesAutoIsTheNodeAddresssDevice: in a namespace with two
// devices, auto picks the one holding --node-ip, and with no --node-ip the
// one of the default route (as the kubelet's default InternalIP).
func TestNodePortDevicesAutoIsTheNodeAddresssDevice(t *testing.T) {
	testutil.Privileged(t)
	n := testutil.NewNetNS(t)
	n.Run(t, "ip", "link", "add", "wgmgmt0", "type", "veth", "peer", "name", "wgmgmt1") // no dummy module here
	n.Run(t, "ip", "link", "add", "wgnode0", "type", "veth", "peer", "name", "wgnode1")
	n.Run(t, "ip", "addr", "add", "10.99.0.2/24", "dev", "wgmgmt0")
	n.Run(t, "ip", "addr", "add", "10.98.0.2/24", "dev", "wgnode0")
	n.Run(t, "ip", "link", "set", "wgmgmt0", "up")
	n.Run(t, "ip", "link", "set", "wgnode0", "up")
	n.Run(t, "ip", "route", "add", "default", "via", "10.99.0.1")
	for ip, want := range map[string]string{"10.98.0.2": "wgnode0", "": "wgmgmt0"} {
		var got []string
		err := n.Do(func(ns.NetNS) error {
			var err error
			got, err = NodePortDevices("auto", ip)
			return err
		})
		if err != nil || !reflect.DeepEqual(got, []string{want}) {
			t.Errorf("auto with node IP %q: %v, %v; want [%s]", ip, got, err, want)
		}
	}
}
