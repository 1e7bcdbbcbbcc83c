package lab

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// State records everything a lab made, written as each thing is made.
type State struct {
	Bridge     string      `json:"bridge,omitempty"`
	BridgeAddr string      `json:"bridgeAddr,omitempty"`
	CgroupDir  string      `json:"cgroupDir,omitempty"`
	Kubeconfig string      `json:"kubeconfig,omitempty"`
	Processes  []Process   `json:"processes,omitempty"`
	Nodes      []NodeState `json:"nodes,omitempty"`
	// Servers are an HA lab's control plane servers (netns and veth;
	// CgroupDir and PinDir unused).
	Servers []NodeState `json:"servers,omitempty"`
	// Client is the external client's namespace and veth (CgroupDir and
	// PinDir unused): a machine on the lab network outside every node.
	Client      *NodeState `json:"client,omitempty"`
	Initialized bool       `json:"initialized"`
	// Config is the configuration the lab was made with (for Join).
	Config *Config `json:"config,omitempty"`
}

// NodeState is what the lab made for one node.
type NodeState struct {
	Name     string `json:"name"`
	NetNS    string `json:"netns"`
	HostVeth string `json:"hostVeth"`
	Addr     string `json:"addr"`
	// Addr6 is the IPv6 address on the lab network of a dual-stack lab.
	Addr6     string `json:"addr6,omitempty"`
	CgroupDir string `json:"cgroupDir"`
	PinDir    string `json:"pinDir"`
}

// Process is a process the lab started. StartTime (clock ticks since boot,
// from /proc/PID/stat) guards against signalling a reused PID.
type Process struct {
	Name      string `json:"name"`
	Node      string `json:"node,omitempty"`
	PID       int    `json:"pid"`
	StartTime uint64 `json:"startTime"`
	Log       string `json:"log"`
	// NetNS and Args are how it was started, so it can be restarted.
	NetNS string   `json:"netns,omitempty"`
	Args  []string `json:"args"`
}

func statePath(dataDir string) string { return filepath.Join(dataDir, "lab.json") }

// LoadState reads the lab's state file; a missing file is ErrNoLab.
func LoadState(dataDir string) (*State, error) {
	b, err := os.ReadFile(statePath(dataDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, ErrNoLab
	}
	if err != nil {
		return nil, err
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("lab state %s: %w", statePath(dataDir), err)
	}
	return &s, nil
}

// save writes the state atomically.
func (s *State) save(dataDir string) error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	tmp := statePath(dataDir) + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, statePath(dataDir))
}

// ErrNoLab means there is no lab state under the data dir.
var ErrNoLab = errors.New("no lab here (run `waggle lab up` first)")

// process finds the index of a recorded process.
func (s *State) process(node, name string) (int, error) {
	for i, p := range s.Processes {
		if p.Node == node && p.Name == name {
			return i, nil
		}
	}
	return -1, fmt.Errorf("the lab has no process %q on node %q", name, node)
}
