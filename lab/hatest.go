package lab

import "time"

// HA failure scenarios of `waggle lab ha-test`, on a lab with --servers 3
// or more, under a steady write load (one client-go writer creating
// ConfigMaps one after another, each with a 1 s timeout, through the
// failover dialer, recording every acknowledged write).
const (
	ScenarioKillEtcdLeader = "kill-etcd-leader" // kill -9 the server whose etcd member leads
	ScenarioPartition      = "partition"        // take one non-leader server's lab link down, then heal it
)

// HAResult is what a scenario measured.
type HAResult struct {
	Scenario string
	Victim   string
	// Acked and Failed count the writer's writes; Lost the acknowledged
	// writes a surviving server does not hold afterwards (must be 0).
	Acked, Failed, Lost int
	// Resume is the pause the fault caused: the longest time between two
	// acknowledged writes that ends after the fault; MaxGap the longest
	// time between two acknowledged writes in the whole run.
	Resume, MaxGap time.Duration
	// Converge is from the last write to every survivor's informer holding
	// exactly what the store holds.
	Converge time.Duration
	// MinorityRefused: the partitioned server refused a write while cut
	// off; CaughtUp: once healed, it lists every acknowledged write, after
	// CatchUp.
	MinorityRefused, CaughtUp bool
	CatchUp                   time.Duration
}
