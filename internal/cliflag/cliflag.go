// Package cliflag parses a subcommand's flags into its config struct, reading
// every flag that is not given on the command line from a WAGGLE_* environment
// variable: --etcd-servers falls back to WAGGLE_ETCD_SERVERS.
//
// It deliberately stays on the standard library's flag package: Waggle's
// commands are flat, and a flag's value always lives in a config struct field,
// never in a package global.
package cliflag

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
)

// EnvName returns the environment variable that backs the flag name.
func EnvName(name string) string {
	return "WAGGLE_" + strings.ToUpper(strings.NewReplacer("-", "_", ".", "_").Replace(name))
}

// NewFlagSet returns a flag set for a subcommand whose usage output lists the
// environment variable behind each flag.
func NewFlagSet(name, summary string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.Usage = func() {
		out := fs.Output()
		fmt.Fprintf(out, "Usage: waggle %s [flags]\n\n%s\n\nFlags (each also read from WAGGLE_<FLAG> in the environment):\n", name, summary)
		fs.PrintDefaults()
	}
	return fs
}

// ErrHelp is returned by Parse when -h or --help was asked for.
var ErrHelp = flag.ErrHelp

// Parse parses args into fs, then sets every flag not given on the command
// line from its environment variable, if present. A bad environment value is
// an error naming the variable.
func Parse(fs *flag.FlagSet, args []string) error {
	return parse(fs, args, os.LookupEnv)
}

func parse(fs *flag.FlagSet, args []string, lookup func(string) (string, bool)) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] {
			return
		}
		env := EnvName(f.Name)
		if v, ok := lookup(env); ok {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", env, v, err))
			}
		}
	})
	return errors.Join(errs...)
}

// Discard silences a flag set's own error printing, for tests.
func Discard(fs *flag.FlagSet) { fs.SetOutput(io.Discard) }

// StringList is a repeatable or comma-separated string flag.
type StringList []string

func (s *StringList) String() string { return strings.Join(*s, ",") }

// Set appends the comma-separated values of v.
func (s *StringList) Set(v string) error {
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*s = append(*s, p)
		}
	}
	return nil
}
