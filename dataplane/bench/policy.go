package bench

import (
	"io"
	"time"
)

// Paths of the policy benchmark: pod to pod over the node's bridge.
const (
	PolicyPathNone     = "no-programs"   // no policy programs on either veth (the physical limit)
	PolicyPathAttached = "no-policy"     // programs attached, no policy selects the pods
	PolicyPathOne      = "1-policy"      // the server isolated by one policy allowing the client
	PolicyPathMany     = "many-policies" // cfg.Policies policies select the server, cfg.Pods pods known
)

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
	Entries    int       `json:"serverEntries"`
	Rows       []Row     `json:"rows"`
	// Policy write (Create on the API client) to maps programmed.
	WriteToEnforcedP50ms float64  `json:"writeToEnforcedP50ms"`
	WriteToEnforcedP99ms float64  `json:"writeToEnforcedP99ms"`
	WriteToEnforcedMaxms float64  `json:"writeToEnforcedMaxms"`
	Notes                []string `json:"notes"`
}
