package policy

import "github.com/prometheus/client_golang/prometheus"

// Counters are the verdict counters the datapath keeps.
type Counters struct {
	// Endpoints by pod key: flows allowed and packets denied, by direction
	// (index DirIngress, DirEgress).
	Allowed, Denied map[string][2]uint64
	// Policies by policy ID: new flows their entries allowed, by direction.
	PolicyHits map[uint32][2]uint64
	// Revoked: packets of established flows a policy change denied,
	// dropped by the iptables datapath (the eBPF one counts them in Denied).
	Revoked uint64
}

// counterSource is a Datapath that can read its counters.
type counterSource interface {
	Counters() (Counters, error)
}

// verdictCollector exports the datapath's counters at scrape time.
type verdictCollector struct {
	a                           *Agent
	epAllowed, epDenied, polHit *prometheus.Desc
}

func newVerdictCollector(a *Agent) *verdictCollector {
	return &verdictCollector{a: a,
		epAllowed: prometheus.NewDesc("waggle_policy_endpoint_flows_allowed_total", "New flows a local pod's policy programs allowed.", []string{"pod", "direction"}, nil),
		epDenied:  prometheus.NewDesc("waggle_policy_endpoint_packets_denied_total", "Packets a local pod's policy programs dropped.", []string{"pod", "direction"}, nil),
		polHit:    prometheus.NewDesc("waggle_policy_flows_allowed_total", "New flows a NetworkPolicy's rules allowed on this node.", []string{"policy", "direction"}, nil),
	}
}

func (c *verdictCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.epAllowed
	ch <- c.epDenied
	ch <- c.polHit
}

func (c *verdictCollector) Collect(ch chan<- prometheus.Metric) {
	src, ok := c.a.cfg.Datapath.(counterSource)
	if !ok {
		return
	}
	cs, err := src.Counters()
	if err != nil {
		return
	}
	dirs := [2]string{"ingress", "egress"}
	for pod, v := range cs.Allowed {
		for d := range 2 {
			ch <- prometheus.MustNewConstMetric(c.epAllowed, prometheus.CounterValue, float64(v[d]), pod, dirs[d])
			ch <- prometheus.MustNewConstMetric(c.epDenied, prometheus.CounterValue, float64(cs.Denied[pod][d]), pod, dirs[d])
		}
	}
	c.a.mu.Lock()
	names := c.a.c.PolicyNames()
	c.a.mu.Unlock()
	for id, v := range cs.PolicyHits {
		name, ok := names[id]
		if !ok {
			continue
		}
		for d := range 2 {
			ch <- prometheus.MustNewConstMetric(c.polHit, prometheus.CounterValue, float64(v[d]), name, dirs[d])
		}
	}
}
