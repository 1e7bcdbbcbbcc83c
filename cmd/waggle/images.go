package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/containerd"
	"github.com/containerd/containerd/namespaces"

	"github.com/waggle-io/waggle/internal/cliflag"
	"github.com/waggle-io/waggle/kubelet/images"
)

// runImages dispatches `waggle images import|build-echo`.
func runImages(ctx context.Context, args []string) error {
	if len(args) == 0 {
		return errors.New("usage: waggle images import [flags] FILE... | waggle images build [flags] | waggle images build-echo [flags]")
	}
	switch args[0] {
	case "import":
		return runImagesImport(ctx, args[1:])
	case "build":
		return runImagesBuild(args[1:])
	case "build-echo":
		return runImagesBuildEcho(args[1:])
	}
	return fmt.Errorf("unknown images command %q (want import, build or build-echo)", args[0])
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

// listFlag is a flag that may be given several times.
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

func runImagesBuild(args []string) error {
	fs := cliflag.NewFlagSet("images build", "Pack directory trees (a root file system unpacked from packages, a build output) into a single-layer OCI image archive (no Docker needed).")
	var spec images.Spec
	var rootfs, files, env, expose listFlag
	var entrypoint, cmd string
	fs.StringVar(&spec.Name, "name", "", "image reference, e.g. registry.k8s.io/e2e-test-images/busybox:1.37.0-2")
	out := fs.String("output", "", "archive to write")
	fs.Var(&rootfs, "rootfs", "directory whose tree becomes the image's root (repeatable: trees merge; a file given twice is an error)")
	fs.Var(&files, "file", "SRC:DST, one more file (repeatable)")
	fs.StringVar(&entrypoint, "entrypoint", "", `entrypoint as a JSON array, e.g. '["/agnhost"]'`)
	fs.StringVar(&cmd, "cmd", "", `command as a JSON array, e.g. '["pause"]'`)
	fs.Var(&env, "env", "KEY=VALUE of the image's environment (repeatable)")
	fs.Var(&expose, "expose", "exposed port, e.g. 80/tcp (repeatable)")
	fs.StringVar(&spec.WorkingDir, "workdir", "", "working directory")
	fs.StringVar(&spec.User, "user", "", "user (and group) the image runs as")
	fs.StringVar(&spec.StopSignal, "stop-signal", "", "signal that stops the container, e.g. SIGQUIT")
	if err := cliflag.Parse(fs, args); err != nil {
		return err
	}
	if spec.Name == "" || *out == "" {
		return errors.New("--name and --output are required")
	}
	for _, j := range []struct {
		flag, val string
		dst       *[]string
	}{{"--entrypoint", entrypoint, &spec.Entrypoint}, {"--cmd", cmd, &spec.Cmd}} {
		if j.val == "" {
			continue
		}
		if err := json.Unmarshal([]byte(j.val), j.dst); err != nil {
			return fmt.Errorf("%s %s: want a JSON array of strings: %w", j.flag, j.val, err)
		}
	}
	spec.Env, spec.ExposedPorts = env, expose
	for _, dir := range rootfs {
		fl, err := images.TreeFiles(dir, "/")
		if err != nil {
			return err
		}
		spec.Files = append(spec.Files, fl...)
	}
	for _, f := range files {
		src, dst, ok := strings.Cut(f, ":")
		if !ok || dst == "" {
			return fmt.Errorf("--file %s: want SRC:DST", f)
		}
		fi, err := os.Stat(src)
		if err != nil {
			return err
		}
		data, err := os.ReadFile(src)
		if err != nil {
			return err
		}
		spec.Files = append(spec.Files, images.File{Path: dst, Mode: int64(fi.Mode().Perm()), Data: data})
	}
	return writeImage(*out, spec)
}

func writeImage(out string, spec images.Spec) error {
	if err := os.MkdirAll(filepath.Dir(out), 0o755); err != nil {
		return err
	}
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if err := images.Build(f, spec); err != nil {
		f.Close()
		os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, out); err != nil {
		return err
	}
	fmt.Printf("wrote %s (%s)\n", out, spec.Name)
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
	return writeImage(*out, images.EchoSpec(*name, data))
}
