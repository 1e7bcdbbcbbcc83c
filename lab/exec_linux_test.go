package lab

import (
	"context"
	"strings"
	"testing"
)

// lab exec names what the lab has when asked for something it has not, and
// refuses an empty command, before it enters any namespace.
func TestExecRefusesUnknownTargetsAndEmptyCommands(t *testing.T) {
	dir := t.TempDir()
	st := &State{Initialized: true,
		Client: &NodeState{Name: "e2e-client", NetNS: "waggle-e2e-client"},
		Nodes:  []NodeState{{Name: "e2e-node1", NetNS: "waggle-e2e-node1"}}}
	if err := st.save(dir); err != nil {
		t.Fatal(err)
	}
	err := Exec(context.Background(), dir, "e2e-node2", []string{"true"}, nil, nil, nil)
	if err == nil || !strings.Contains(err.Error(), `no "e2e-node2" (have client, e2e-node1)`) {
		t.Errorf("unknown target: %v", err)
	}
	if err := Exec(context.Background(), dir, "client", nil, nil, nil, nil); err == nil || !strings.Contains(err.Error(), "no command") {
		t.Errorf("no command: %v", err)
	}
	if err := Exec(context.Background(), t.TempDir(), "client", []string{"true"}, nil, nil, nil); err != ErrNoLab {
		t.Errorf("no lab: %v, want ErrNoLab", err)
	}
}
