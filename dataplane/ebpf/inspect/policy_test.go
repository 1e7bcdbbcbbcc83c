package inspect

import (
	"io"
	"slices"
	"strings"
	"testing"
)

func TestParseArgsPolicyCommands(t *testing.T) {
	for _, c := range []struct {
		args []string
		want []string
		err  string
	}{
		{[]string{"policy", "list"}, []string{"policy", "list"}, ""},
		{[]string{"policy", "get", "x/b"}, []string{"policy", "get", "x/b"}, ""},
		{[]string{"explain", "policy", "10.0.0.1", "10.0.0.2:80/UDP"}, []string{"explain", "policy", "10.0.0.1", "10.0.0.2:80/UDP"}, ""},
		{[]string{"monitor", "--verdict", "all"}, []string{"monitor"}, ""},
		{[]string{"explain", "policy", "pod1", "10.0.0.2:80"}, nil, "is not an address"},
		{[]string{"explain", "policy", "10.0.0.1", "10.0.0.2"}, nil, "want ADDRESS:PORT"},
		{[]string{"monitor", "--verdict", "maybe"}, nil, "want drop, allow or all"},
		{[]string{"policy", "get"}, nil, "policy get takes 1 argument"},
	} {
		cfg, err := ParseArgs(c.args, io.Discard)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("ParseArgs(%q) = %v, want an error with %q", c.args, err, c.err)
			}
			continue
		}
		if err != nil || !slices.Equal(cfg.Command, c.want) {
			t.Errorf("ParseArgs(%q) = %q, %v; want %q", c.args, cfg.Command, err, c.want)
		}
	}
}
