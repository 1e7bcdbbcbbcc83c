package ebpf

import "time"

// Meta is the meta map's record.
type Meta struct {
	Magic         uint32    `json:"magic"`
	LayoutVersion uint32    `json:"layoutVersion"`
	Created       time.Time `json:"created"`
}

// MapInfo describes one pinned map.
type MapInfo struct {
	Name       string `json:"name"`
	Type       string `json:"type"`
	KeySize    int    `json:"keySize"`
	ValueSize  int    `json:"valueSize"`
	Entries    int    `json:"entries"`
	MaxEntries int    `json:"maxEntries"`
	Path       string `json:"path"`
}

// ProgramInfo describes one attached program (through its pinned link).
type ProgramInfo struct {
	Name       string        `json:"name"`
	ProgramID  uint32        `json:"programID"`
	LinkID     uint32        `json:"linkID"`
	Type       string        `json:"type"`
	AttachType string        `json:"attachType"`
	CgroupID   uint64        `json:"cgroupID"`
	Loaded     time.Duration `json:"loadedSinceBoot"`
	Runs       uint64        `json:"runs"`
	RunTime    time.Duration `json:"runTime"`
	LinkPath   string        `json:"linkPath"`
}

// Explanation says what the connect hook would do for one frontend: the
// programs' decision, replayed from the pinned maps (`waggle bpf explain`).
type Explanation struct {
	Frontend string `json:"frontend"`
	// Verdict: "passthrough" (not a frontend: untranslated), "refused"
	// (no backends: ECONNREFUSED), "affinity" (the client's sticky
	// backend), "random" (TCP: any slot) or "per-socket" (UDP: the slot
	// the socket cookie selects).
	Verdict string `json:"verdict"`
	// Service is the frontend's entry, when there is one.
	Service *Service `json:"service,omitempty"`
	// Candidates are the backends the verdict chooses among.
	Candidates []Slot `json:"candidates,omitempty"`
	Reason     string `json:"reason"`
}
