package main

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/waggle-io/waggle/controlplane/apiserver"
	"github.com/waggle-io/waggle/internal/cliflag"
)

// runServer runs `waggle server remove NAME`: take a server out of the HA
// control plane by removing its etcd member (do it before or after stopping
// it for good; a removed member that restarts is refused by the cluster).
func runServer(ctx context.Context, args []string) error {
	if len(args) == 0 || args[0] != "remove" {
		return errors.New("usage: waggle server remove NAME [--kubeconfig admin.kubeconfig]")
	}
	fs := cliflag.NewFlagSet("server remove", "Remove a server's etcd member from the HA control plane.")
	kubeconfig := fs.String("kubeconfig", "/var/lib/waggle/admin.kubeconfig", "admin kubeconfig")
	rest := args[1:]
	var name string
	if len(rest) > 0 && !strings.HasPrefix(rest[0], "-") {
		name, rest = rest[0], rest[1:]
	}
	if err := cliflag.Parse(fs, rest); err != nil {
		return err
	}
	if name == "" && fs.NArg() == 1 {
		name = fs.Arg(0)
	} else if name == "" || fs.NArg() != 0 {
		return errors.New("usage: waggle server remove NAME")
	}
	rc, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	if _, err := cs.Discovery().RESTClient().Delete().AbsPath(apiserver.EtcdMembersPath, name).DoRaw(ctx); err != nil {
		return fmt.Errorf("remove the etcd member of server %s: %w", name, err)
	}
	fmt.Printf("server %s: etcd member removed\n", name)
	return nil
}
