package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"

	"github.com/waggle-io/waggle/internal/cliflag"
	"github.com/waggle-io/waggle/kubelet/images"
)

// runImages dispatches `waggle images import|build-echo`.
func runImages(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("usage: waggle images import [flags] FILE... | waggle images build-echo [flags]")
	}
	switch args[0] {
	case "import":
		return runImagesImport(ctx, args[1:])
	case "build-echo":
		return runImagesBuildEcho(args[1:])
	}
	return fmt.Errorf("unknown images command %q (want import or build-echo)", args[0])
}

func runImagesImport(ctx context.Context, args []string) error {
	fs := cliflag.NewFlagSet("images import", "Import OCI or Docker image archives (FILE...) into the node's containerd image store and unpack them.")
	addr := fs.String("containerd-address", "/run/containerd/containerd.sock", "containerd socket")
	ns := fs.String("containerd-namespace", "waggle", "containerd namespace of the kubelet's images")
	snap := fs.String("snapshotter", images.DefaultSnapshotter, "snapshotter to unpack for")
	if err := cliflag.Parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		return errors.New("no archive given: waggle images import FILE...")
	}
	client, err := containerd.New(*addr, containerd.WithTimeout(10*time.Second))
	if err != nil {
		return fmt.Errorf("connect to containerd at %s: %w", *addr, err)
	}
	defer client.Close()
	ctx = namespaces.WithNamespace(ctx, *ns)
	for _, f := range fs.Args() {
		names, err := images.ImportFile(ctx, client, f, *snap)
		if err != nil {
			return err
		}
		for _, n := range names {
			fmt.Printf("imported %s\n", n)
		}
	}
	return nil
}

func runImagesBuildEcho(args []string) error {
	fs := cliflag.NewFlagSet("images build-echo", "Pack a static waggle-echo binary into an OCI image archive (no Docker needed).")
	bin := fs.String("binary", "bin/waggle-echo", "the static waggle-echo binary")
	out := fs.String("output", "bin/images/waggle-echo.tar", "archive to write")
	name := fs.String("name", images.EchoImage, "image reference")
	if err := cliflag.Parse(fs, args); err != nil {
		return err
	}
	data, err := os.ReadFile(*bin)
	if err != nil {
		return fmt.Errorf("read waggle-echo binary: %w (build it with make images)", err)
	}
	if err := os.MkdirAll(filepath.Dir(*out), 0o755); err != nil {
		return err
	}
	f, err := os.Create(*out)
	if err != nil {
		return err
	}
	if err := images.Build(f, images.EchoSpec(*name, data)); err != nil {
		f.Close()
		os.Remove(*out)
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	fmt.Printf("wrote %s (%s)\n", *out, *name)
	return nil
}
