package inspect

import (
	"context"
	"os"
)

// Run runs one `waggle bpf` command: it opens the node's pinned state
// read-only, runs cfg.Command and writes the result to cfg.Out. Its error
// implements ExitCode() (see the Exit* constants).
func Run(ctx context.Context, cfg Config) error {
	if cfg.Out == nil {
		cfg.Out = os.Stdout
	}
	if cfg.Output == "" {
		cfg.Output = FormatTable
	}
	if len(cfg.Command) == 0 {
		return usageErr("no command given")
	}
	switch cfg.Output {
	case FormatTable, FormatJSON, FormatYAML:
	default:
		return usageErr("output format %q: want table, json or yaml", cfg.Output)
	}
	dir, node, err := cfg.pinDir()
	if err != nil {
		return withExitCode(err)
	}
	if isPolicyCommand(cfg.Command) {
		return withExitCode(runPolicy(ctx, cfg, dir))
	}
	src, err := openSource(dir, node)
	if err != nil {
		return withExitCode(err)
	}
	defer src.Close()
	in := &inspector{src: src, sys: newSystem(ctx), node: node}
	res, err := in.run(ctx, cfg)
	if err != nil {
		return withExitCode(err)
	}
	return withExitCode(render(cfg.Out, cfg.Output, res))
}

// closingSource is a source that must be closed.
type closingSource interface {
	source
	Close() error
}
