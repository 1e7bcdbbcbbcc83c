package bench

import (
	"io"
	"time"
)

// Paths of the policy benchmark: pod to pod over the node's bridge. Every
// path but PolicyPathNone is measured per datapath, keyed
// "<datapath>/<path>" in a Row (PolicyDatapaths).
const (
	PolicyPathNone     = "no-programs"   // no policy programs or rules for either pod (the physical limit)
	PolicyPathAttached = "no-policy"     // programs attached / rules hooked, no policy selects the pods
	PolicyPathOne      = "1-policy"      // the server isolated by one policy allowing the client
	PolicyPathMany     = "many-policies" // cfg.Policies policies select the server, cfg.Pods pods known
)

// PolicyDatapaths are the datapaths measured side by side.
var PolicyDatapaths = []string{"ebpf", "iptables"}

// LatencyMS is a distribution of write-to-enforced times.
type LatencyMS struct {
	P50 float64 `json:"p50ms"`
	P99 float64 `json:"p99ms"`
	Max float64 `json:"maxms"`
}

// PolicyConfig configures `waggle bench policy`.
type PolicyConfig struct {
	Duration, Warmup time.Duration
	Rounds, Clients  int
	// Policies selecting the "many" server and Pods (identities' pods,
	// not on this node) in the ipcache.
	Policies, Pods int
	// LatencySamples policy writes timed to enforcement.
	LatencySamples int
	Output         string
	Out            io.Writer
}

// PolicyReport is the result.
type PolicyReport struct {
	Started    time.Time `json:"started"`
	Kernel     string    `json:"kernel"`
	CPUs       int       `json:"cpus"`
	Clients    int       `json:"clients"`
	Rounds     int       `json:"rounds"`
	Duration   string    `json:"duration"`
	Policies   int       `json:"policies"`
	Pods       int       `json:"pods"`
	Identities int       `json:"identities"`
	// Entries (eBPF) or rules (iptables) of the many-policies server.
	Entries map[string]int `json:"serverEntries"`
	Rows    []Row          `json:"rows"`
	// Policy write (Create/Delete through the API server) to the kernel
	// state programmed, per datapath.
	WriteToEnforced map[string]LatencyMS `json:"writeToEnforced"`
	Notes           []string             `json:"notes"`
}
