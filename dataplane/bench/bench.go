// Package bench is `waggle bench dataplane`: it measures Waggle's service
// dataplanes against the physical limit, side by side in one run, on this
// machine's network namespaces.
//
// A client namespace and a backend namespace joined by a veth; N backends
// (Go echo servers, one per address) in the backend namespace; the client in
// a fresh cgroup where the eBPF programs are attached. Each round measures,
// interleaved, TCP_CRR (connect, 1-byte request and response, close with
// SO_LINGER 0), TCP_RR (1-byte request/response on one connection) and UDP
// request/response, (a) directly to a backend IP, (b) through a ClusterIP
// with the eBPF backend, (c) through a ClusterIP with the iptables backend,
// at several service counts. It also times programming 10,000 services × 10
// backends into the eBPF maps from scratch, and one endpoint change to the
// maps while 10,000 services exist. It prints a table with every figure's
// ratio to the direct path and writes JSON.
//
// It is not a load generator for remote targets: all traffic stays in the
// namespaces it creates, which it removes when done.
package bench

import (
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"
)

// Config configures a run.
type Config struct {
	// Duration of one measurement (one test, one path, one round).
	Duration time.Duration
	// Warmup before counting, per measurement.
	Warmup time.Duration
	// Rounds of the interleaved measurements.
	Rounds int
	// Clients in parallel.
	Clients int
	// Backends behind each service.
	Backends int
	// ServiceCounts to measure at (each path gets this many services).
	ServiceCounts []int
	// Tests: TCP_CRR, TCP_RR, UDP_RR (default all three).
	Tests []string
	// Paths to measure besides "direct": "ebpf", "iptables".
	Paths []string
	// ProgramServices and ProgramBackends size the programming benchmark
	// (0 services skips it); ProgramRounds repeats it.
	ProgramServices, ProgramBackends, ProgramRounds int
	// LatencySamples endpoint changes are timed at ProgramServices services.
	LatencySamples int
	// Output, when set, receives the JSON report.
	Output string
	// Out receives the table; Log the progress.
	Out io.Writer
	Log *slog.Logger
}

// Stat is one figure over rounds.
type Stat struct {
	Median float64   `json:"median"`
	Min    float64   `json:"min"`
	Max    float64   `json:"max"`
	Rounds []float64 `json:"rounds"`
	// Ratio is Median / the direct path's Median (1 for direct).
	Ratio  float64 `json:"ratioToDirect,omitempty"`
	Errors int     `json:"errors"`
	// ErrorKinds: the errors by step and cause ("connect timeout", "read
	// reset", …); KernelCounters: the TCP counters (client and server
	// namespace, as nstat names them) that moved during the measurements.
	ErrorKinds     map[string]int   `json:"errorKinds,omitempty"`
	KernelCounters map[string]int64 `json:"kernelCounters,omitempty"`
	// Ops: operations counted (rate × duration, summed over rounds), the
	// denominator of the error rate.
	Ops int64 `json:"ops,omitempty"`
}

// Row is one test at one service count, per path (rates per second).
type Row struct {
	Services int              `json:"services"`
	Test     string           `json:"test"`
	Paths    map[string]*Stat `json:"paths"`
}

// Report is the result of a run.
type Report struct {
	Started  time.Time `json:"started"`
	Kernel   string    `json:"kernel"`
	CPUs     int       `json:"cpus"`
	Clients  int       `json:"clients"`
	Backends int       `json:"backends"`
	Payload  int       `json:"payloadBytes"`
	Duration string    `json:"durationPerMeasurement"`
	Rounds   int       `json:"rounds"`
	Notes    []string  `json:"notes"`
	Rows     []Row     `json:"rows"`
	// Program: seconds to program ProgramServices × ProgramBackends.
	Program *Stat `json:"programSeconds,omitempty"`
	// ProgramCPU: CPU seconds (user + system) of the same programming.
	ProgramCPU *Stat `json:"programCPUSeconds,omitempty"`
	// ProgramSize describes what was programmed.
	ProgramSize string `json:"programSize,omitempty"`
	// ChangeLatency: endpoint change to map, milliseconds.
	ChangeP50 float64 `json:"changeToMapP50ms,omitempty"`
	ChangeP99 float64 `json:"changeToMapP99ms,omitempty"`
	ChangeMax float64 `json:"changeToMapMaxms,omitempty"`
	// ChangeCPUms: CPU milliseconds per endpoint change, on average.
	ChangeCPUms float64 `json:"changeToMapCPUms,omitempty"`
	// Skipped paths and why.
	Skipped map[string]string `json:"skipped,omitempty"`
}

func (c Config) withDefaults() Config {
	if c.Duration <= 0 {
		c.Duration = time.Second
	}
	if c.Warmup <= 0 {
		c.Warmup = 200 * time.Millisecond
	}
	if c.Rounds <= 0 {
		c.Rounds = 3
	}
	if c.Clients <= 0 {
		c.Clients = 4
	}
	if c.Backends <= 0 {
		c.Backends = 4
	}
	if len(c.ServiceCounts) == 0 {
		c.ServiceCounts = []int{1, 1000, 10000}
	}
	if len(c.Tests) == 0 {
		c.Tests = allTests
	}
	if c.Paths == nil {
		c.Paths = []string{"ebpf", "iptables"}
	}
	if c.ProgramBackends <= 0 {
		c.ProgramBackends = 10
	}
	if c.ProgramRounds <= 0 {
		c.ProgramRounds = 3
	}
	if c.LatencySamples <= 0 {
		c.LatencySamples = 200
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	return c
}

// allTests are the tests a dataplane benchmark runs by default.
var allTests = []string{"TCP_CRR", "TCP_RR", "UDP_RR"}

// ParseTests checks a comma-separated list of tests (empty: every one).
func ParseTests(s string) ([]string, error) {
	if s == "" {
		return nil, nil
	}
	var out []string
	for _, t := range strings.Split(s, ",") {
		t = strings.TrimSpace(t)
		if !slices.Contains(allTests, t) {
			return nil, fmt.Errorf("test %q: want one of %s", t, strings.Join(allTests, ", "))
		}
		out = append(out, t)
	}
	return out, nil
}
