package iptables

// Internals the black-box tests (package iptables_test, which may import
// iptablestest without a cycle) check against.
var (
	Probability = probability
	Hash        = hash
)

const (
	SvcPrefix = svcPrefix
	SepPrefix = sepPrefix
)

// ChainNames is the names of r's chains in the order they are written.
func (r *Ruleset) ChainNames() []string {
	out := make([]string, len(r.order))
	for i, k := range r.order {
		out[i] = k.name
	}
	return out
}
