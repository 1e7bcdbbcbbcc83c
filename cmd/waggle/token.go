package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/waggle-io/waggle/cluster/join"
	"github.com/waggle-io/waggle/controlplane/apiserver/authz/rbac/bootstrap"
	"github.com/waggle-io/waggle/internal/cliflag"
)

// runToken runs `waggle token create|list|delete`, kubeadm token's
// counterpart: bootstrap tokens that machines join with.
func runToken(ctx context.Context, args []string) error {
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		return errors.New("usage: waggle token create|list|delete [flags]")
	}
	verb, args := args[0], args[1:]
	fs := cliflag.NewFlagSet("token "+verb, "Manage bootstrap tokens (Secrets of type bootstrap.kubernetes.io/token in kube-system).")
	kubeconfig := fs.String("kubeconfig", "/var/lib/waggle/admin.kubeconfig", "admin kubeconfig")
	var ttl time.Duration
	var desc string
	var groups cliflag.StringList
	var server, printJoin bool
	if verb == "create" {
		fs.BoolVar(&printJoin, "print-join-command", false, "print the whole join command (waggle join, or waggle up --server with --server) instead of the token alone, as kubeadm token create --print-join-command")
		fs.BoolVar(&server, "server", false, "a token for further servers of the control plane (they read the shared certificates; group "+bootstrap.BootstrapServerGroup+")")
		fs.DurationVar(&ttl, "ttl", join.DefaultTTL, "lifetime of the token (0: never expires); the tokencleaner controller deletes it after")
		fs.StringVar(&desc, "description", "", "what the token is for")
		fs.Var(&groups, "groups", "extra groups of the token, each system:bootstrappers:... (default "+join.NodeGroup+")")
	}
	if err := cliflag.Parse(fs, args); err != nil {
		return err
	}
	rc, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return fmt.Errorf("--kubeconfig: %w", err)
	}
	cs, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return err
	}
	switch verb {
	case "create":
		tok := ""
		if fs.NArg() > 0 {
			tok = fs.Arg(0)
		}
		if server {
			groups = append(groups, bootstrap.BootstrapServerGroup)
		}
		ca := rc.TLSClientConfig.CAData
		if len(ca) == 0 && rc.TLSClientConfig.CAFile != "" {
			if ca, err = os.ReadFile(rc.TLSClientConfig.CAFile); err != nil {
				return err
			}
		}
		hash, err := join.CACertHash(ca)
		if err != nil {
			return fmt.Errorf("the kubeconfig's CA: %w", err)
		}
		tok, err = join.CreateToken(ctx, cs, join.TokenOptions{Token: tok, TTL: ttl, Groups: groups, Description: desc})
		if err != nil {
			return err
		}
		what, cmd := "node", fmt.Sprintf("waggle join --server %s --token %s --discovery-token-ca-cert-hash %s", rc.Host, tok, hash)
		if server {
			what, cmd = "server", fmt.Sprintf("waggle up --server %s --token %s --discovery-token-ca-cert-hash %s --advertise-address <its IP>", rc.Host, tok, hash)
		}
		if printJoin {
			fmt.Println(cmd)
			return nil
		}
		fmt.Println(tok)
		fmt.Fprintf(os.Stderr, "join a %s with:\n  %s\n", what, cmd)
		return nil
	case "list":
		toks, err := join.ListTokens(ctx, cs)
		if err != nil {
			return err
		}
		w := tabwriter.NewWriter(os.Stdout, 0, 4, 3, ' ', 0)
		fmt.Fprintln(w, "TOKEN ID\tTTL\tEXPIRES\tUSAGES\tDESCRIPTION\tEXTRA GROUPS")
		for _, t := range toks {
			ttl, exp := "<forever>", "<never>"
			if !t.Expires.IsZero() {
				ttl, exp = time.Until(t.Expires).Round(time.Second).String(), t.Expires.Format(time.RFC3339)
			}
			fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", t.ID, ttl, exp, strings.Join(t.Usages, ","), t.Description, strings.Join(t.Groups, ","))
		}
		return w.Flush()
	case "delete":
		if fs.NArg() == 0 {
			return errors.New("usage: waggle token delete <id>|<token> ...")
		}
		for _, a := range fs.Args() {
			if err := join.DeleteToken(ctx, cs, a); err != nil {
				return err
			}
			fmt.Printf("bootstrap token %q deleted\n", strings.SplitN(a, ".", 2)[0])
		}
		return nil
	}
	return fmt.Errorf("unknown verb %q (create, list, delete)", verb)
}
